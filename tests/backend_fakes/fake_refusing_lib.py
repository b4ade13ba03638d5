"""A kernel library that refuses every call in its own Python code, before any kernel could run
(as FLA 0.6's backward does on Hopper with Triton < 3.7.1), and one whose call fails inside NumPy
(not its own code: no refusal). The test imports this file as the top-level module
``fake_refusing_lib``, as a plug-in's library would be."""

from __future__ import annotations

import numpy as np

MESSAGE = "this compiler produces incorrect results on this GPU; install tilelang"


def gdn(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
        use_qk_l2norm_in_kernel=False, cu_seqlens=None):  # fmt: skip
    _check_platform()


def _check_platform() -> None:
    raise RuntimeError(MESSAGE)


def gdn_numpy_error(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                    use_qk_l2norm_in_kernel=False, cu_seqlens=None):  # fmt: skip
    np.linalg.cholesky(-np.eye(2))  # raises LinAlgError inside NumPy


COMPILE_MESSAGE = "N marked as constexpr and listed in do_not_specialize. Remove constexpr designation."


def gdn_not_compiling(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                      use_qk_l2norm_in_kernel=False, cu_seqlens=None):  # fmt: skip
    """Triton cannot compile the library's kernel (a release built for another Triton)."""
    import ast

    from triton.compiler.errors import CompilationError

    source = "def kernel(q, N: tl.constexpr):\n    pass"
    raise CompilationError(source, ast.parse(source).body[0], COMPILE_MESSAGE)
