"""The core every other layer builds on: the problem, the float64 oracle, the conventions and the verdict.

``problem`` (a GDN problem in the native convention), ``arrays`` (NumPy / torch / CuPy
conversion), ``conventions`` (argument checks, packing), ``gating`` (raw-gate conventions),
``reference`` (the exact float64 oracle, recurrent and chunked), ``oracle`` (the oracle a check
compares against), ``tolerance`` (the derived tolerance model), ``error_stats`` (ULPs, rounding
floors, growth exponents), ``implementation`` (what an implementation under test is) and
``verdict`` (measurements, violations and the comparison engine). ``gdn_verify.properties``
imports from here and nothing above.
"""
