"""The decode family of the recurrent kernel: state pools, speculative decoding, raw gates, DecodeStep.

- :func:`pooled_decode`: requests addressing a state pool by slot index (negative = padding).
- :func:`spec_decode`: vLLM speculative decoding (accepted-token slot read, per-token slots written).
- :func:`fused_decode_raw_gates`: FlashInfer / FlashInfer-Bench decode (raw gates, k-last state
  ``[B, HV, V, K]`` updated in place).
- :class:`DecodeStep`: one decode step validated once, then launched by patching pointers.
- :class:`DecodeGraph` (``DecodeStep.capture``): the step over fixed buffers captured once as a
  CUDA graph; each serving-loop step is one graph launch.
- ``DECODE_VARIANTS``: the decode tilings (``recurrent_kernel.DecodeVariant``) by name.

Every function updates the state in place and never synchronizes unless ``checked=True``. Slot
tables and accepted counts on the device are validated by the kernel (deferred ``ValueError``, see
the ``cupy_kernels`` docstring); on the host they are validated before the launch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cupy_kernels import recurrent_kernel
from cupy_kernels import tensors as ts

DECODE_VARIANTS = recurrent_kernel.VARIANTS
DEFAULT_DECODE_VARIANT = recurrent_kernel.DEFAULT_VARIANT


def fused_decode_raw_gates(
    q: Any,
    k: Any,
    v: Any,
    state: Any,
    A_log: Any,
    a: Any,
    dt_bias: Any,
    b: Any,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    *,
    checked: bool | None = None,
) -> tuple[Any, Any]:
    """FlashInfer / FlashInfer-Bench decode step with raw gates; ``state`` is updated in place.

    ``q, k`` ``[B, 1, H, K]``, ``v`` ``[B, 1, HV, V]`` (bfloat16/float16/float32); ``state``
    ``[B, HV, V, K]`` float32 (k-last), contiguous; ``A_log, dt_bias`` ``[HV]``; ``a, b``
    ``[B, 1, HV]`` (any float dtype). ``g = -exp(A_log) * softplus(a + dt_bias)`` (softplus is the
    identity above 20), ``beta = sigmoid(b)``; ``scale`` None or 0 means ``K ** -0.5``.
    Returns ``(o [B, 1, HV, V] in q's dtype, state)`` (the same state object).
    """
    req = recurrent_kernel.Request(
        "inplace",
        None if scale == 0 else scale,
        bool(use_qk_l2norm),
        True,
        gate_in_kernel=True,
        beta_sigmoid=True,
        names=("a", "b", "state"),
    )
    o, _ = recurrent_kernel.run(
        req, (q, k, v, a, b, A_log, dt_bias, state, None, None, None), checked=checked, source="fused_decode_raw_gates"
    )
    return o, state


def pooled_decode(
    q: Any,
    k: Any,
    v: Any,
    g: Any,
    beta: Any,
    state_pool: Any,
    slot_indices: Any,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    state_v_first: bool = False,
    *,
    use_gate_in_kernel: bool = False,
    A_log: Any = None,
    dt_bias: Any = None,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    decode_variant: str | None = None,
    checked: bool | None = None,
) -> Any:
    """Decode (or a short per-request prefill) against a state pool, updated in place.

    ``q, k`` ``[B, T, H, K]`` (T = 1 for decode), ``v`` ``[B, T, HV, V]``, ``g, beta``
    ``[B, T, HV]``; ``state_pool`` ``[slots, HV, K, V]`` float32 (``[slots, HV, V, K]`` with
    ``state_v_first``), contiguous; ``slot_indices`` ``[B]`` int32/int64. Request ``b`` reads and
    writes slot ``slot_indices[b]``; a negative index is padding: its output rows are zero and no
    slot is touched. An index ``>= slots`` is an error (``ValueError`` naming ``slot_indices``;
    deferred for device indices, whose rows are then handled like padding). Slots nobody
    addresses stay bitwise unchanged. Gate options as in ``recurrent_gated_delta_rule``.
    Returns ``o [B, T, HV, V]`` in q's dtype.
    """
    recurrent_kernel.options(use_gate_in_kernel, A_log, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    recurrent_kernel.variant(decode_variant)
    req = recurrent_kernel.Request(
        "pool",
        scale,
        bool(use_qk_l2norm_in_kernel),
        bool(state_v_first),
        False,
        False,
        bool(use_gate_in_kernel),
        bool(use_beta_sigmoid_in_kernel),
        bool(allow_neg_eigval),
        decode_variant,
        ("g", "beta", "state_pool"),
    )
    o, _ = recurrent_kernel.run(
        req,
        (q, k, v, g, beta, A_log, dt_bias, state_pool, None, slot_indices, None),
        checked=checked,
        source="pooled_decode",
    )
    return o


def spec_decode(
    q: Any,
    k: Any,
    v: Any,
    g: Any,
    beta: Any,
    state_pool: Any,
    cu_seqlens: Any,
    ssm_state_indices: Any,
    num_accepted_tokens: Any,
    scale: float | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    state_v_first: bool = False,
    *,
    use_gate_in_kernel: bool = False,
    A_log: Any = None,
    dt_bias: Any = None,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    checked: bool | None = None,
) -> Any:
    """vLLM speculative-decoding step against a state pool (updated in place).

    ``q, k`` ``[1, T, H, K]``, ``v`` ``[1, T, HV, V]``, ``g, beta`` ``[1, T, HV]`` with all
    requests' tokens packed; ``cu_seqlens`` ``[N + 1]`` (each request 0..S tokens);
    ``ssm_state_indices`` ``[N, S]`` int32/int64 (S = num_spec + 1); ``num_accepted_tokens`` ``[N]``
    int32/int64 in ``[1, S]``; ``state_pool`` ``[slots, HV, K, V]`` float32 (or v-first). Request
    ``n`` starts from slot ``ssm_state_indices[n, num_accepted_tokens[n] - 1]`` and writes the state
    after its ``t``-th token to slot ``ssm_state_indices[n, t]`` (negative entries are skipped). A
    negative starting slot makes the request padding: zero output, no slot touched. Bad offsets,
    slots ``>= slots`` or counts outside ``[1, S]`` raise ``ValueError`` naming the argument
    (deferred for device metadata). Returns ``o [1, T, HV, V]`` in q's dtype.
    """
    recurrent_kernel.options(use_gate_in_kernel, A_log, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    req = recurrent_kernel.Request(
        "spec",
        scale,
        bool(use_qk_l2norm_in_kernel),
        bool(state_v_first),
        False,
        False,
        bool(use_gate_in_kernel),
        bool(use_beta_sigmoid_in_kernel),
        bool(allow_neg_eigval),
        None,
        ("g", "beta", "state_pool"),
    )
    args = (q, k, v, g, beta, A_log, dt_bias, state_pool, cu_seqlens, ssm_state_indices, num_accepted_tokens)
    o, _ = recurrent_kernel.run(req, args, checked=checked, source="spec_decode")
    return o


# --------------------------------------------------------------------------- the fast decode path

_STEP_POINTERS = recurrent_kernel.POINTERS  # all 14 pointers are rewritten per call (A_log, dt_bias, err fixed)


class DecodeStep:
    """One decode step (T = 1) prepared once for fixed shapes, strides and dtypes: the low-latency path.

    ``step = DecodeStep(q, k, v, g, beta, state, slot_indices=None, ...)`` validates the example
    tensors exactly as :func:`pooled_decode` (with ``slot_indices``) or an in-place
    ``recurrent_gated_delta_rule`` would (same kernel), compiles, and packs the launch parameters.
    ``o = step(q, k, v, g, beta, state)`` then reads the data pointers, patches them into the packed
    parameters and launches: no dtype or stride checks, no plan lookup, and no allocation when
    ``out=`` is given or the step was built with ``reuse_output=True``. ``state`` (``[B, HV, K, V]``,
    or a pool ``[slots, HV, K, V]`` addressed by ``slot_indices``; ``[.., V, K]`` with
    ``state_v_first``) is updated in place. ``A_log`` / ``dt_bias`` (FLA's gate options) are fixed
    at construction and kept referenced.

    The unchecked contract (for speed): every call passes tensors of the same kind (torch or CuPy),
    shapes, strides and dtypes as the example, on the device that was current at construction, with
    device-resident ``slot_indices``. Per call only what guards memory writes is checked: the
    shapes of ``state``, ``out`` and ``slot_indices`` and the pointer alignment the vector accesses
    rely on. Slot indices are bounds-checked by the kernel (an index past the pool is skipped and
    reported as a deferred ``ValueError`` by the next call). Inputs read with other shapes than the
    example's (q, k, v, g, beta) break the contract; :meth:`checked` validates everything, then
    launches the same kernel and synchronizes to report bad slots at once.

    ``reuse_output=True``: every call returns the SAME output buffer, overwritten by the next call.
    That is safe for consumers ordered on the launch stream (the usual decode loop), and unsafe if
    ``o`` is kept across steps, read on another stream, or captured by a CUDA graph together with a
    later step. The default allocates a fresh ``o`` per call (``torch.empty`` / ``cupy.empty``).

    ``stream``: a fixed stream (a CuPy stream, a torch stream, or a raw ``cudaStream_t`` integer);
    None launches on the caller's current stream at each call (torch's for torch tensors, CuPy's
    otherwise). An instance keeps one parameter buffer: do not call it from two threads at once.
    """

    def __init__(
        self,
        q: Any,
        k: Any,
        v: Any,
        g: Any,
        beta: Any,
        state: Any,
        slot_indices: Any = None,
        *,
        scale: float | None = None,
        use_qk_l2norm_in_kernel: bool = False,
        state_v_first: bool = False,
        use_gate_in_kernel: bool = False,
        A_log: Any = None,
        dt_bias: Any = None,
        use_beta_sigmoid_in_kernel: bool = False,
        allow_neg_eigval: bool = False,
        reuse_output: bool = False,
        stream: Any = None,
        decode_variant: str | None = None,
    ) -> None:
        recurrent_kernel.options(use_gate_in_kernel, A_log, use_beta_sigmoid_in_kernel, allow_neg_eigval)
        recurrent_kernel.variant(decode_variant)
        pool = slot_indices is not None
        self._req = recurrent_kernel.Request(
            "pool" if pool else "inplace",
            scale,
            bool(use_qk_l2norm_in_kernel),
            bool(state_v_first),
            False,
            False,
            bool(use_gate_in_kernel),
            bool(use_beta_sigmoid_in_kernel),
            bool(allow_neg_eigval),
            decode_variant,
            ("g", "beta", "state"),
        )
        device = self._device = ts.current_device()
        args = (q, k, v, g, beta, A_log, dt_bias, state, None, slot_indices, None)
        names = ("q", "k", "v", "g", "beta", "A_log", "dt_bias", "state", "cu_seqlens", "slot_indices", "")
        infos = tuple([None if x is None else ts.read(x, n, device) for x, n in zip(args, names)])
        if infos[0][1][1:2] != (1,):
            raise ValueError(f"q: DecodeStep is for one token (T = 1), got shape {infos[0][1]}")
        plan = self._plan = recurrent_kernel.plan(self._req, infos, device)
        self._gates = (A_log, dt_bias)  # kept alive: their pointers are baked into every launch
        self._pa = 0 if infos[5] is None else infos[5][0]
        self._pd = 0 if infos[6] is None else infos[6][0]
        self._torch = ts.is_torch(q)
        self._torch_like = q if self._torch else None
        self._pool = pool
        self._state_shape = tuple(infos[7][1])
        self._slots_shape = tuple(infos[9][1]) if pool else None
        self._o_shape = plan.o_shape
        self._qk_mask, self._v_mask, self._o_mask, self._state_mask = plan.masks
        self._out = ts.empty(self._torch_like, plan.o_shape, plan.o_code) if reuse_output else None
        self._buf = np.zeros(recurrent_kernel.PARAMS_SIZE // 8, np.uint64)
        memoryview(self._buf).cast("B")[recurrent_kernel.POINTERS.size :] = plan.static
        self._argv = np.array([self._buf.ctypes.data], np.uint64)
        self._argv_ptr = int(self._argv.ctypes.data)
        self._fn, self._blocks, self._threads = plan.fn, plan.blocks, plan.threads
        self._words = ts.error_words(device)
        cp = ts.cupy()
        self._launch_kernel = cp.cuda.driver.launchKernel
        self._current_stream = cp.cuda.get_current_stream
        self._stream = None if stream is None else ts.stream_handle(stream)

    def __call__(
        self, q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any, slot_indices: Any = None, *, out: Any = None
    ) -> Any:
        """Launch one step; returns ``o [B, 1, HV, V]`` (``out`` when given). Never synchronizes."""
        words = self._words
        if words.pair[0] | words.pair[1]:
            words.raise_pending(deferred=True)
        out = self._pack(q, k, v, g, beta, state, slot_indices, out)
        if self._blocks:
            stream = self._stream
            if stream is None:
                stream = ts.torch_stream(self._device) if self._torch else self._current_stream().ptr
            self._launch_kernel(self._fn, self._blocks, 1, 1, self._threads, 1, 1, 0, stream, self._argv_ptr, 0)
        return out

    def _pack(self, q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any, slot_indices: Any, out: Any) -> Any:
        """The per-call guards (what protects memory writes) and the pointer patch; returns ``out``."""
        words = self._words
        if state.shape != self._state_shape:
            raise ValueError(f"state: expected shape {self._state_shape} as prepared, got {tuple(state.shape)}")
        px = 0
        if self._pool:
            if slot_indices is None or slot_indices.shape != self._slots_shape:
                got = None if slot_indices is None else tuple(slot_indices.shape)
                raise ValueError(f"slot_indices: expected shape {self._slots_shape} as prepared, got {got}")
            px = slot_indices.data_ptr() if self._torch else slot_indices.data.ptr
            words.source = "DecodeStep"  # the launch a deferred slot error will be attributed to
        if self._torch:
            pq, pk, pv, pg, pb = q.data_ptr(), k.data_ptr(), v.data_ptr(), g.data_ptr(), beta.data_ptr()
            ps = state.data_ptr()
        else:
            pq, pk, pv, pg, pb = q.data.ptr, k.data.ptr, v.data.ptr, g.data.ptr, beta.data.ptr
            ps = state.data.ptr
        if out is None:
            out = self._out
            if out is None:
                out = ts.empty(self._torch_like, self._o_shape, self._plan.o_code)
        elif out.shape != self._o_shape:
            raise ValueError(f"out: expected shape {self._o_shape}, got {tuple(out.shape)}")
        po = out.data_ptr() if self._torch else out.data.ptr
        if (pq | pk) & self._qk_mask or pv & self._v_mask or po & self._o_mask or ps & self._state_mask:
            raise ValueError("DecodeStep: a tensor is less aligned than the prepared one; use .checked()")
        _STEP_POINTERS.pack_into(self._buf, 0, pq, pk, pv, pg, pb, self._pa, self._pd, ps, ps, po, 0, px, 0, words.ptr)
        return out

    def capture(
        self,
        q: Any,
        k: Any,
        v: Any,
        g: Any,
        beta: Any,
        state: Any,
        slot_indices: Any = None,
        *,
        out: Any = None,
        stream: Any = None,
    ) -> DecodeGraph:
        """This step over these fixed buffers, captured as a CUDA graph: see :class:`DecodeGraph`."""
        return DecodeGraph(self, q, k, v, g, beta, state, slot_indices, out=out, stream=stream)

    def checked(
        self, q: Any, k: Any, v: Any, g: Any, beta: Any, state: Any, slot_indices: Any = None, *, out: Any = None
    ) -> Any:
        """The same step through the general, fully validating launcher, synchronized so that bad
        slot indices raise here (allocates ``o`` unless ``out``)."""
        A_log, dt_bias = self._gates
        args = (q, k, v, g, beta, A_log, dt_bias, state, None, slot_indices, None)
        if self._pool and slot_indices is None:
            raise ValueError("slot_indices: required (the step was prepared with a state pool)")
        o, _ = recurrent_kernel.run(self._req, args, checked=True, source="DecodeStep.checked")
        if out is not None:
            out[...] = o
            return out
        return o


class DecodeGraph:
    """A :class:`DecodeStep` over FIXED buffers, captured once as a CUDA graph; ``graph()`` replays it.

    The serving pattern (vLLM's and SGLang's CUDA-graph decode): the caller owns one set of input
    buffers (``q, k, v, g, beta``, the slot table), the state (or pool) and the output, writes each
    step's inputs INTO those buffers (``q_buf.copy_(...)``, or lets the projection kernels write
    there), then calls ``graph()``; the result is in ``graph.out`` (also returned). One call is one
    ``cudaGraphLaunch``: no pointer packing, no ``cuLaunchKernel``, no allocation.

    Built by ``step.capture(q, k, v, g, beta, state, slot_indices=None, out=None, stream=None)``:
    the buffers pass the step's per-call guards (shapes of state / slot table / out, alignment)
    once, the launch is captured on a private stream (nothing runs at capture), and the graph is
    uploaded. The graph holds the buffers' device pointers, so this object keeps a reference to
    every buffer (and to the step, hence ``A_log`` / ``dt_bias``): they cannot be freed while it
    lives. Buffers whose pointers change per step (a fresh tensor every call) need
    ``DecodeStep.__call__`` instead, or one ``DecodeGraph`` per buffer set (double buffering: two
    graphs; capture costs tens of microseconds, once).

    The unchecked contract, and why it still cannot write out of bounds: the kernel writes only the
    state rows named by the slot table (bounds-checked in the kernel against the captured pool
    size: a bad index is skipped and raises a deferred ``ValueError`` naming ``slot_indices`` at
    the next call) and ``out``; per call the graph re-reads the pointers of those two written
    buffers (torch ``resize_`` / ``set_`` could move them) and refuses to launch if either moved.
    Read-only inputs moved by ``resize_`` / ``set_`` are the caller's contract (:meth:`verify`
    checks all of them). Pending deferred errors are raised before the launch, as in DecodeStep.

    ``stream``: the stream to replay on (CuPy or torch stream, or a raw handle); None means the
    caller's current stream at each call (torch's for torch tensors, CuPy's otherwise). The launch
    is ordered on that stream like any kernel: writes into the input buffers made on the same
    stream before the call are seen, and consumers of ``out`` on that stream see the result.
    Replays of one graph on different streams must not overlap (they share the buffers).
    """

    def __init__(
        self,
        step: DecodeStep,
        q: Any,
        k: Any,
        v: Any,
        g: Any,
        beta: Any,
        state: Any,
        slot_indices: Any = None,
        *,
        out: Any = None,
        stream: Any = None,
    ) -> None:
        cp = ts.cupy()
        if ts.current_device() != step._device:
            raise ValueError(f"DecodeGraph: the current device is not the step's device {step._device}")
        if out is None:
            out = ts.empty(step._torch_like, step._o_shape, step._plan.o_code)
        words = step._words
        if words.pair[0] | words.pair[1]:
            words.raise_pending(deferred=True)
        out = step._pack(q, k, v, g, beta, state, slot_indices, out)
        self.out = out
        self._step = step
        self._buffers = (q, k, v, g, beta, state, slot_indices, out)
        self._ptrs = self._pointers()
        self._torch = step._torch
        self._pool = step._pool
        self._words = words
        self._device = step._device
        self._fixed = None if stream is None else ts.stream_handle(stream)
        self._current_stream = cp.cuda.get_current_stream
        self._graph = None
        if step._blocks:
            capture = cp.cuda.Stream(non_blocking=True)
            capture.begin_capture()
            try:
                step._launch_kernel(
                    step._fn, step._blocks, 1, 1, step._threads, 1, 1, 0, capture.ptr, step._argv_ptr, 0
                )
            except BaseException:
                try:
                    capture.end_capture()
                except Exception:  # noqa: BLE001 - the launch error is the one to report
                    pass
                raise
            graph = capture.end_capture()
            upload = getattr(graph, "upload", None)
            if upload is not None:
                upload(capture)  # instantiates and uploads now, not at the first step
            capture.synchronize()
            self._graph = graph
            self._capture_stream = capture
            exec_handle = int(getattr(graph, "graphExec", 0) or 0)
            launch = getattr(cp.cuda.runtime, "graphLaunch", None)
            if exec_handle and launch is not None:
                # one Cython call into cudaGraphLaunch with a raw stream handle
                self._launch = lambda handle, _launch=launch, _exec=exec_handle: _launch(_exec, handle)
            else:
                streams: dict = {}

                def _launch_via_graph(handle: int) -> None:
                    wrapper = streams.get(handle)
                    if wrapper is None:
                        wrapper = streams[handle] = ts.external_stream(handle)
                    graph.launch(wrapper)

                self._launch = _launch_via_graph
        # the written buffers' pointers, re-read per call
        ps, po = self._ptrs[5], self._ptrs[7]
        self._state_obj, self._out_obj, self._ps, self._po = state, out, ps, po

    def _pointers(self) -> tuple:
        return tuple(0 if x is None else ts.pointer(x) for x in self._buffers)

    def __call__(self) -> Any:
        """Replay the step (one graph launch); returns ``self.out``. Never synchronizes."""
        words = self._words
        if words.pair[0] | words.pair[1]:
            words.raise_pending(deferred=True)
        if self._torch:
            if self._state_obj.data_ptr() != self._ps or self._out_obj.data_ptr() != self._po:
                raise ValueError("DecodeGraph: state or out was reallocated (resize_/set_) after capture")
        if self._pool:
            words.source = "DecodeGraph"  # the launch a deferred slot error will be attributed to
        if self._graph is not None:
            stream = self._fixed
            if stream is None:
                stream = ts.torch_stream(self._device) if self._torch else self._current_stream().ptr
            self._launch(stream)
        return self.out

    def verify(self) -> None:
        """Raise ``ValueError`` if any captured buffer no longer has its captured pointer."""
        names = ("q", "k", "v", "g", "beta", "state", "slot_indices", "out")
        for name, then, now in zip(names, self._ptrs, self._pointers()):
            if then != now:
                raise ValueError(f"{name}: the buffer moved after capture (resize_/set_); capture again")
