"""Runners: drive properties against an implementation and return data.

``check`` (one verdict per property, Hypothesis-driven), ``fuzz`` (a time-budgeted campaign),
``selftest`` (the planted bugs must all be caught), ``diagnose`` (where and in which stage an
error appears) and ``causes`` (which known mistake or precision loss reproduces a failure).
Runners receive properties as objects, report progress through callbacks and never print or
return exit codes.
"""
