"""Runners: drive properties against an implementation and return data.

``check`` (one verdict per property, Hypothesis-driven), ``fuzz`` (a time-budgeted campaign),
``selftest`` (the planted bugs must all be caught), ``diagnose`` (where and in which stage an
error appears), ``causes`` (which known mistake or precision loss reproduces a failure) and
``configs`` (``check --all-configs``: the properties under each autotuner config in turn).
Runners receive properties as objects, report progress through callbacks and never print or
return exit codes.
"""
