"""Our own CUDA kernels for the gated delta rule, compiled at run time by CuPy (NVRTC).

``recurrent.cu`` holds the recurrent (token-by-token) kernel for prefill and decode, with a float64
instantiation used as a GPU oracle; ``recurrent.py`` its thin launchers. Importing this package
imports nothing GPU-related: CuPy is imported lazily by the launchers.
"""
