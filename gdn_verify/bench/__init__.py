"""GPU benchmarks: ``decode`` and ``prefill``, our kernels side by side with FLA and a device copy."""
