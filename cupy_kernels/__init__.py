"""Our own CUDA kernels for the gated delta rule, compiled at run time by CuPy (NVRTC).

Modules: ``recurrent.cu`` / ``recurrent.py`` (token by token: prefill, decode, and a float64
instantiation used as a GPU oracle), ``decode.py`` (the decode family on the same kernel: state
pools, speculative decoding, FlashInfer's raw-gate step, ``DecodeStep``, ``DecodeGraph``),
``recurrent_kernel.py`` (their shared validation, plan selection and launch), ``chunk.py`` (the
chunked WY/UT form for prefill; its kernels are one source per path sharing ``chunk_common.cuh``:
``chunk_three_kernel.cu``, ``chunk_fused_prep.cu``, ``chunk_fused.cu``, ``chunk_wgmma.cu``) with
``chunk_plan.py`` (which path and kernels a call takes: pure), ``layout.py`` (every layout fact
shared with the CUDA sources, one table each), ``sources.py`` (the sources as NVRTC compiles them,
and the sm_90a build), ``tensors.py`` (the policy below, in code). ``experimental/`` holds kernel
variants that measured slower than the product's, with their numbers; nothing imports them.
Importing the package imports only NumPy and the standard library; CuPy (and torch, when the caller
uses it) are imported on first use.

Tensor policy (every launcher)
------------------------------
- Kinds and devices: CuPy arrays, torch CUDA tensors, or other DLPack CUDA tensors, all on the
  current CUDA device (``ValueError`` naming the argument otherwise). torch in, torch out;
  otherwise CuPy out. bfloat16 needs torch (CuPy has no bfloat16).
- Layout: the recurrent launchers take ``q, k, v, g, beta`` with any strides as long as the last
  dimension is contiguous (slices of a fused projection work as they are); states (initial
  state, pools) must be contiguous. The chunked launcher needs every tensor contiguous.
- Copies: never silent. A tensor that does not meet the layout raises ``ValueError``. The only
  copies are documented: metadata given on the host (lists, NumPy, CPU tensors) is validated
  there and copied to the device (a small blocking copy; device metadata is the hot path), and
  ``precision="float64"`` promotes a float32 initial state (the oracle, not a hot path).
- Synchronization: none, except (documented) ``checked=True``, ``DecodeStep.checked``,
  ``check_errors()``, and the chunked launcher with device ``cu_seqlens`` (it reads them on the
  host to build the chunk tables that size its grid and scratch).
- Streams: the caller's current stream: torch's current stream for torch tensors (by ``q``'s
  kind), CuPy's current stream for CuPy arrays. ``DecodeStep(stream=...)`` pins one.
- Metadata (``cu_seqlens``, ``slot_indices``, ``ssm_state_indices``, ``num_accepted_tokens``):
  no launcher reads or writes outside its arrays on any value. On the host it is validated
  before the launch (``ValueError`` naming it). On the device the kernel validates it: a warp
  that sees a bad value does no memory access through it and sets an error word in mapped host
  memory; the ``ValueError`` naming the argument is then raised by the next launcher call on the
  device, or by ``check_errors()`` (deferred error), or at once with ``checked=True`` (which
  synchronizes the launch stream) or with the environment variable ``GDN_CUPY_CHECKED=1``.
  Negative slot indices are padding (vLLM's PAD_SLOT_ID), not errors.
- ``DecodeStep`` is the documented unchecked fast path: per call it checks only what guards
  memory writes (shapes of the state, the slot table and ``out``; pointer alignment); slot
  indices are still bounds-checked in the kernel. ``DecodeStep.capture(...)`` returns a
  ``DecodeGraph``: the same step over fixed buffers (the caller writes each step's inputs into
  them) captured once as a CUDA graph, one ``cudaGraphLaunch`` per call; it keeps every buffer
  alive, re-reads the written buffers' pointers per call (torch), and the kernel still
  bounds-checks the slots.
"""

from cupy_kernels.tensors import check_errors

__all__ = ["check_errors"]
