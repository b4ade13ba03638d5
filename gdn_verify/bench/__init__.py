"""GPU benchmarks: ``decode`` and ``prefill``, our kernels side by side with FLA and a device copy.

``run`` (:func:`run_bench`: both, as Markdown tables and JSON rows; ``gdn-verify bench``),
``decode`` (the recurrent kernel's decode step) and ``prefill`` (the chunked kernel).
"""

from gdn_verify.bench.run import run_bench

__all__ = ["run_bench"]
