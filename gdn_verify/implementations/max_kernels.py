"""Adapters from the native convention to Modular MAX's ``gated_delta`` kernels (translation only).

``pip install max==26.7.0 max-core==26.7.0`` (``max`` wraps the Mojo ops of ``max-core``'s kernel
library through ``ops.inplace_custom``); an NVIDIA GPU (the kernels have no CPU implementation).
The convention is ``gdn_verify.core.max_convention``'s: q, k, v packed per token, a linear float32
decay ``exp(g)``, l2norm and the ``1/sqrt(KD)`` scale always fused (other problems are
unsupported), a k-first pool ``[max_slots, nv, KD, VD]`` addressed by uint32 ``slot_idx`` with
uint32 ``input_row_offsets``; the kernels also require ``KD == VD``.

- ``max-recurrence`` (``-bf16``: a bfloat16 pool): ``gated_delta_recurrence_fwd``, the whole
  call on the pool, every other row checked untouched.
- ``max-verify-ring`` (``-bf16``): the speculative verify as MAX serves it, checked against MAX's
  own rules: ``gated_delta_recurrence_verify_ring_fwd`` over the call at verify width ``K = max
  length - 1``, at most 7 (zero when every sequence has at most one token: then the plain
  recurrence), into a NaN-filled float32 ring ``[B + 1, nk, RING_LEN, record_stride]``
  (``RING_LEN`` the shortest of 2, 4, 8 that holds the window ``K + 1``: MAX refuses a shorter
  one; item ``b`` on ring row ``B - b``, row 0 spare); then
  ``gated_delta_state_fold`` with every ``num_accepted`` 0 (the pool must not change), then with
  each sequence's length (the accepted tokens: all of them). Between the launches: the verify
  left the rows of recorded items and every spare row bitwise unchanged, each record holds the
  token's raw key and decays bitwise, the spare ring row is untouched. A sequence longer than
  ``RING_LEN`` is committed by the verify itself and skipped by the fold, as MAX documents.

Every call runs one compiled model per geometry (``nk, nv, KD, VD``, pool dtype, and for the ring
its length and stride), with symbolic token, batch and slot counts; models are compiled on first
use (about a minute each) and cached for the process. Where ``GDN_VERIFY_MAX_MEFS`` names a folder
that :func:`precompile` filled on a CPU (MAX's virtual-device mode, ``scripts/max_precompile.py``),
each model is loaded from its artifact instead (a graph the folder lacks is compiled as before).
Arrays go through the host: the native inputs (torch) are packed in NumPy
(``max_convention.to_max``), uploaded as MAX buffers, and the output and the mutated pool (and
ring) are read back. The pure parts (input layouts, the ring's
geometry, the verify's arguments and checks) run on CPU with the NumPy kernels of ``max_numpy``
standing in for MAX's.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from gdn_verify.core import arrays
from gdn_verify.core.implementation import ConfigurationError, ContractError, Implementation
from gdn_verify.core.max_convention import (
    POOL_DTYPES,
    RING_LENS,
    WORK_DTYPE,
    MaxArguments,
    key_heads,
    native_form,
    ring_record_stride,
    through_max,
    untouched_rows,
    verify_geometry,
)
from gdn_verify.core.shapes import ShapeClass
from gdn_verify.implementations.fla import cuda_library, jit_compiled

MAX_INSTALL = "pip install max==26.7.0 max-core==26.7.0"
BF16 = np.dtype(ml_dtypes.bfloat16)
# MAX's Qwen3.5 linear-attention geometries: 16 key heads, 32 / 48 / 64 value heads, K = V = 128.
QWEN35_KEY_HEADS = 16
QWEN35_VALUE_HEADS = (32, 48, 64)
QWEN35_HEAD_DIM = 128
# A folder of MAX's compiled-graph artifacts (MEF files and MAX's manifest, plus VERSIONS_FILE) that
# :func:`precompile` made: the engine loads each model from it instead of compiling (1 to 10 minutes
# per process on a 16-core H100 machine, 2026-11-28, where every check and campaign compiled apart).
MEFS_ENV = "GDN_VERIFY_MAX_MEFS"
VERSIONS_FILE = "gdn_verify_max.json"


@dataclass(frozen=True)
class InputSpec:
    """One graph input: MAX dtype name, shape (``str`` entries are symbolic dims), a mutable buffer
    (``BufferType``) or a tensor, and on the GPU or the host."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]
    buffer: bool = False
    host: bool = False


def _pool_dtype_name(pool_dtype: Any) -> str:
    if np.dtype(pool_dtype) not in POOL_DTYPES:
        raise ValueError(f"MAX's pool is float32 or bfloat16, not {np.dtype(pool_dtype).name}")
    return np.dtype(pool_dtype).name


def recurrence_specs(nk: int, nv: int, KD: int, VD: int, pool_dtype: Any) -> tuple[InputSpec, ...]:
    """``gated_delta_recurrence_fwd``'s inputs, in its order (``max/nn/state_space/gated_delta.py``)."""
    conv_dim = 2 * nk * KD + nv * VD
    return (
        InputSpec("qkv_conv_output", "float32", ("total_seq_len", conv_dim)),
        InputSpec("decay_per_token", "float32", ("total_seq_len", nv)),
        InputSpec("beta_per_token", "float32", ("total_seq_len", nv)),
        InputSpec("recurrent_state", _pool_dtype_name(pool_dtype), ("max_slots", nv, KD, VD), buffer=True),
        InputSpec("slot_idx", "uint32", ("batch_size",)),
        InputSpec("input_row_offsets", "uint32", ("batch_size_plus_1",)),
    )


def verify_specs(nk: int, nv: int, KD: int, VD: int, pool_dtype: Any, ring_len: int) -> tuple[InputSpec, ...]:
    """``gated_delta_recurrence_verify_ring_fwd``'s inputs: the recurrence's plus the float32 ring
    ``[ring_rows, nk, RING_LEN, record_stride]``, ``ring_slot_idx`` and the verify width operand
    (``verify_width_operand``: an int64 ``[K]`` host tensor whose length alone is read)."""
    (qkv, decay, beta, pool, slot, offsets) = recurrence_specs(nk, nv, KD, VD, pool_dtype)
    stride = ring_record_stride(KD, VD, nv // nk)
    ring = InputSpec("ring", "float32", ("ring_rows", nk, ring_len, stride), buffer=True)
    ring_slot = InputSpec("ring_slot_idx", "uint32", ("batch_size",))
    return (qkv, decay, beta, pool, ring, slot, ring_slot, offsets, width_spec())


def fold_specs(nk: int, nv: int, KD: int, VD: int, pool_dtype: Any, ring_len: int) -> tuple[InputSpec, ...]:
    """``gated_delta_state_fold``'s inputs: pool, ring, ``row_ids`` and ``ring_row_ids``
    ``[num_layers, batch_size]`` (one layer here), ``num_accepted`` ``[batch_size]``, the width."""
    verify = verify_specs(nk, nv, KD, VD, pool_dtype, ring_len)
    pool, ring = verify[3], verify[4]
    return (
        pool,
        ring,
        InputSpec("row_ids", "uint32", (1, "batch_size")),
        InputSpec("ring_row_ids", "uint32", (1, "batch_size")),
        InputSpec("num_accepted", "uint32", ("batch_size",)),
        width_spec(),
    )


def geometry_graphs(nk: int, nv: int, KD: int, VD: int, pool_dtype: Any) -> Iterator[tuple[str, tuple[InputSpec, ...]]]:
    """Every ``(op, specs)`` the adapters compile for one geometry and pool dtype: the recurrence,
    and the verify and the fold at each ring length (the verify's first call loads them all)."""
    yield "recurrence", recurrence_specs(nk, nv, KD, VD, pool_dtype)
    for ring_len in RING_LENS:
        yield "verify", verify_specs(nk, nv, KD, VD, pool_dtype, ring_len)
        yield "fold", fold_specs(nk, nv, KD, VD, pool_dtype, ring_len)


def width_spec() -> InputSpec:
    return InputSpec("verify_width", "int64", ("verify_width",), host=True)


def width_operand(width: int) -> np.ndarray:
    """The verify width ``K`` as MAX's operand: ``arange(K)`` int64 (only its length is read)."""
    return np.arange(max(width, 0), dtype=np.int64)


def _check_records(ring_row: np.ndarray, qkv: np.ndarray, decay: np.ndarray, start: int, length: int, heads) -> None:
    """Each record of one item holds its token's raw key and its decays, bitwise (MAX's layout)."""
    nk, nv, KD, VD = heads
    group = nv // nk
    key_dim = nk * KD
    decays = KD + group * VD + np.arange(group)
    for p in range(length):
        t = start + p
        keys = qkv[t, key_dim : 2 * key_dim].reshape(nk, KD)
        if ring_row[:, p, :KD].tobytes() != keys.tobytes():
            raise ContractError(f"ring record {p} (token {t}) does not hold the token's raw key in elements [0, {KD})")
        if ring_row[:, p, decays].tobytes() != decay[t].reshape(nk, group).tobytes():
            raise ContractError(f"ring record {p} (token {t}) does not hold the token's decays after its delta rows")


def verify_ring_form(verify: Callable, fold: Callable, array: str = "numpy", pool_dtype: Any = WORK_DTYPE) -> Callable:
    """A native-convention callable running MAX's speculative verify and fold (module doc).

    ``verify(qkv, decay, beta, recurrent_state, ring, slot_idx, ring_slot_idx, input_row_offsets,
    verify_width) -> recurrence_output`` and ``fold(recurrent_state, ring, row_ids, ring_row_ids,
    num_accepted, verify_width)`` take arrays of kind ``array`` and mutate the pool and the ring.
    A broken MAX rule raises :class:`ContractError`.
    """

    def launch(args: MaxArguments, want: tuple[int, int]) -> tuple[Any, np.ndarray]:
        heads = args.heads
        nk, nv, KD, VD = heads
        lengths = np.diff(args.input_row_offsets.astype(np.int64))
        window = int(lengths.max(initial=0))
        width, ring_len = verify_geometry(window)
        items = len(lengths)
        ring = np.full((items + 1, nk, ring_len, ring_record_stride(KD, VD, nv // nk)), np.nan, np.float32)
        ring_slot = (items - np.arange(items)).astype(np.uint32)  # reversed, row 0 spare
        before = args.recurrent_state.copy()

        def on(x: np.ndarray) -> Any:
            return arrays.to_kind(x, array)

        qkv, decay, beta = (on(x) for x in args.astuple()[:3])
        pool_arg, ring_arg = on(args.recurrent_state), on(ring)
        width_arg = width_operand(width)  # a host tensor in MAX: always NumPy
        slots, offsets = on(args.slot_idx), on(args.input_row_offsets)
        out = arrays.to_numpy(verify(qkv, decay, beta, pool_arg, ring_arg, slots, on(ring_slot), offsets, width_arg))
        if out is None or tuple(np.shape(out)) != want:
            raise ContractError(f"expected recurrence_output {want}, got {np.shape(out)}")
        verified = np.array(arrays.to_numpy(pool_arg))  # a copy: NumPy arguments come back as themselves
        if width:
            untouched_rows(before, verified, args.slot_idx[lengths > ring_len])  # recorded rows and spares
            ring_after = np.asarray(arrays.to_numpy(ring_arg))
            if ring_after[0].tobytes() != np.full_like(ring[0], np.nan).tobytes():
                raise ContractError("the spare ring row 0 was written (no item's ring_slot_idx names it)")
            for b in np.flatnonzero(lengths <= ring_len):
                start = int(args.input_row_offsets[b])
                _check_records(
                    ring_after[ring_slot[b]], args.qkv_conv_output, args.decay_per_token, start, lengths[b], heads
                )
        rows, ring_rows = on(args.slot_idx[None]), on(ring_slot[None])  # [num_layers = 1, batch_size]
        fold(pool_arg, ring_arg, rows, ring_rows, on(np.zeros(items, np.uint32)), width_arg)
        if np.asarray(arrays.to_numpy(pool_arg)).tobytes() != verified.tobytes():
            raise ContractError("a fold with every num_accepted == 0 changed the pool (MAX leaves such rows unchanged)")
        fold(pool_arg, ring_arg, rows, ring_rows, on(lengths.astype(np.uint32)), width_arg)
        pool = np.asarray(arrays.to_numpy(pool_arg))
        untouched_rows(before, pool, args.slot_idx)
        return out, pool

    return through_max(launch, pool_dtype)


def _numpy_in(a: np.ndarray, Buffer: Any, DType: Any) -> Any:
    """A host MAX buffer of ``a``; bfloat16 (which DLPack cannot carry from NumPy) as its bits."""
    a = np.ascontiguousarray(a)
    if a.dtype == BF16:
        return Buffer.from_numpy(a.view(np.uint16)).view(DType.bfloat16, a.shape)
    return Buffer.from_numpy(a)


def _numpy_out(buffer: Any, CPU: Any, DType: Any) -> np.ndarray:
    host = buffer.to(CPU())
    if host.dtype == DType.bfloat16:
        return host.view(DType.uint16, tuple(host.shape)).to_numpy().view(BF16)
    return host.to_numpy()


def _mlir_scope() -> Callable[[], contextlib.AbstractContextManager]:
    """MAX's ``ensure_default_mlir_context`` (enters its MLIR context on a thread that has none),
    or a no-op scope where a MAX version lacks that (private) helper."""
    try:
        from max._mlir_context import ensure_default_mlir_context
    except ImportError:
        return contextlib.nullcontext
    return ensure_default_mlir_context


def _mef_folder(folder: str) -> str:
    """``folder`` once it is a :func:`precompile` folder made by the MAX version that will load it."""
    try:
        made = json.loads((Path(folder) / VERSIONS_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigurationError(MEFS_ENV, f"{folder} is not a folder of precompile's MEF artifacts ({exc})") from None
    here = importlib.metadata.version("max")
    if made.get("max") != here:
        raise ConfigurationError(MEFS_ENV, f"{folder} was compiled by MAX {made.get('max')}, this is MAX {here}")
    return folder


class MaxEngine:
    """MAX's graph engine on the first GPU: one compiled model per op and input layout, called on NumPy.

    ``export``: a folder to compile every model into instead (MAX's virtual-device mode, no GPU:
    :func:`precompile`); otherwise models are loaded from ``GDN_VERIFY_MAX_MEFS`` where it has them."""

    def __init__(self, export: str | None = None) -> None:
        from max import driver, engine, graph
        from max.dtype import DType
        from max.nn.state_space import (
            gated_delta_recurrence_fwd,
            gated_delta_recurrence_verify_ring_fwd,
            gated_delta_state_fold,
        )

        if driver.accelerator_count() < 1:
            raise ConfigurationError("impl", "MAX sees no GPU (its gated_delta kernels have no CPU implementation)")
        self.driver, self.graph, self.DType = driver, graph, DType
        self.ops: dict[str, Callable] = dict(
            recurrence=gated_delta_recurrence_fwd,
            verify=gated_delta_recurrence_verify_ring_fwd,
            fold=gated_delta_state_fold,
        )
        self.device = driver.Accelerator()
        self.engine, self.export = engine, export
        self.mlir = _mlir_scope()
        store: dict[str, str] = {}
        if export:
            store["export_mefs"] = export
        elif folder := os.environ.get(MEFS_ENV):
            store["precompiled_mefs"] = _mef_folder(folder)
        self.session = engine.InferenceSession(devices=[self.device], **store)
        self.compiling: Any = None  # a session without the artifacts, made for the first graph they lack
        self.models: dict[tuple[str, tuple[InputSpec, ...]], Any] = {}

    def build(self, op: str, specs: Sequence[InputSpec]) -> Any:
        """The graph calling ``op`` on inputs ``specs`` (its output, if any, the graph's)."""
        g = self.graph
        gpu, cpu = g.DeviceRef.GPU(), g.DeviceRef.CPU()
        types = [
            (g.BufferType if s.buffer else g.TensorType)(
                getattr(self.DType, s.dtype), list(s.shape), cpu if s.host else gpu
            )
            for s in specs
        ]
        with g.Graph(f"gdn_verify_max_{op}", input_types=types) as graph:
            values = [x.buffer if s.buffer else x.tensor for x, s in zip(graph.inputs, specs)]
            out = self.ops[op](*values)
            graph.output(*([] if out is None else [out]))
        return graph

    def model(self, op: str, specs: tuple[InputSpec, ...]) -> Any:
        """The model of ``op`` on ``specs``: loaded from its artifact or compiled, on first use, then
        cached (exporting: compiled into the folder, not loaded)."""
        key = (op, specs)
        if key in self.models:
            return self.models[key]
        # MAX's MLIR context is thread-local and entered on the main thread only; the checks call
        # kernels from a worker thread (their timeout), where MAX 26.7.0's precompiled-artifact
        # lookup reads the graph's input types outside any context ("No active MLIR context", H100
        # 2026-11-28). Building and loading inside the default context works on any thread.
        with self.mlir():
            graph = self.build(op, specs)
            if self.export:  # a virtual device has nothing to load a model onto
                self.models[key] = self.session.compile_reusing_mefs(graph)
            else:
                try:
                    self.models[key] = self.session.load(graph)
                except self.engine.MissingArtifactError:
                    if self.compiling is None:
                        self.compiling = self.engine.InferenceSession(devices=[self.device])
                    self.models[key] = self.compiling.load(graph)
        return self.models[key]

    def run(self, op: str, specs: tuple[InputSpec, ...], *inputs: np.ndarray) -> np.ndarray | None:
        """Execute ``op``; buffer inputs (the pool, the ring) are updated in place, like MAX's."""
        model = self.model(op, specs)
        driver, DType = self.driver, self.DType
        given = []
        for spec, a in zip(specs, inputs):
            buffer = _numpy_in(a, driver.Buffer, DType)
            given.append(buffer if spec.host else buffer.to(self.device))
        outputs = model.execute(*given)
        for spec, a, buffer in zip(specs, inputs, given):
            if spec.buffer:
                a[...] = _numpy_out(buffer, driver.CPU, DType)
        return _numpy_out(outputs[0], driver.CPU, DType) if outputs else None

    def recurrence(self, pool_dtype: Any) -> Callable:
        """``gated_delta_recurrence_fwd`` on NumPy arrays, in MAX's convention."""

        def kernel(qkv, decay, beta, pool, slot_idx, offsets):
            specs = recurrence_specs(*_heads(qkv, pool), pool_dtype)
            return self.run("recurrence", specs, qkv, decay, beta, pool, slot_idx, offsets)

        return kernel

    def verify_ring(self, pool_dtype: Any) -> tuple[Callable, Callable]:
        """``(verify, fold)`` on NumPy arrays, in MAX's convention."""

        def verify(qkv, decay, beta, pool, ring, slot_idx, ring_slot_idx, offsets, width):
            heads = _heads(qkv, pool)
            for op, specs in geometry_graphs(*heads, pool_dtype):  # every ring length of a geometry in
                # its first call (the guard's compile allowance): a later, longer window must not
                # compile within a plain call's timeout
                if op != "recurrence":
                    self.model(op, specs)
            specs = verify_specs(*heads, pool_dtype, ring.shape[2])
            return self.run("verify", specs, qkv, decay, beta, pool, ring, slot_idx, ring_slot_idx, offsets, width)

        def fold(pool, ring, row_ids, ring_row_ids, num_accepted, width):
            _, nv, KD, VD = pool.shape
            specs = fold_specs(ring.shape[1], nv, KD, VD, pool_dtype, ring.shape[2])
            self.run("fold", specs, pool, ring, row_ids, ring_row_ids, num_accepted, width)

        return verify, fold


def _heads(qkv: np.ndarray, pool: np.ndarray) -> tuple[int, int, int, int]:
    _, nv, KD, VD = pool.shape
    return key_heads(qkv.shape[1], nv, KD, VD), nv, KD, VD


def same_head_dims(kernel: Callable) -> Callable:
    """MAX's kernels assert ``KEY_HEAD_DIM == VALUE_HEAD_DIM`` at compile time: report ``K != V`` as
    unsupported before a model is built for it."""

    def call(*args: Any) -> Any:
        pool = args[3]
        KD, VD = pool.shape[2], pool.shape[3]
        if KD != VD:
            raise NotImplementedError(
                f"MAX's gated_delta kernels require KEY_HEAD_DIM == VALUE_HEAD_DIM (K={KD}, V={VD})"
            )
        return kernel(*args)

    return call


_ENGINE: list[MaxEngine] = []


def max_engine() -> MaxEngine:
    """The process's :class:`MaxEngine`; a missing MAX or GPU is a one-line ConfigurationError."""
    if not _ENGINE:
        _ENGINE.append(cuda_library("MAX", MAX_INSTALL, MaxEngine))
    return _ENGINE[0]


def precompile(
    folder: str | Path,
    classes: Sequence[ShapeClass],
    arch: str = "sm_90a",
    cpu: str = "x86-64-v3",
    progress: Callable[[str], None] | None = None,
) -> int:
    """Compile every model the adapters run on ``classes`` (both pool dtypes) into ``folder`` for a
    GPU of ``arch`` and a host of LLVM CPU ``cpu``, in MAX's virtual-device mode: no GPU needed, so
    that the GPU machine loads them (``GDN_VERIFY_MAX_MEFS``). Must run in a process that has not
    opened a device yet. Returns the number of models; ``progress`` hears each one's name."""
    from max import driver

    driver.set_virtual_cpu_target(cpu)
    driver.set_virtual_device_api("cuda")
    driver.set_virtual_device_target_arch(arch)
    driver.set_virtual_device_count(1)
    Path(folder).mkdir(parents=True, exist_ok=True)
    engine = MaxEngine(export=str(folder))
    geometries = sorted({(c.H, c.HV, c.K, c.V) for c in classes})
    for nk, nv, KD, VD in geometries:
        for pool_dtype in POOL_DTYPES:
            for op, specs in geometry_graphs(nk, nv, KD, VD, pool_dtype):
                if progress:
                    progress(f"{op} {nk}/{nv} K={KD} V={VD} {pool_dtype.name} pool")
                engine.model(op, specs)
    versions = dict(max=importlib.metadata.version("max"), arch=arch, cpu=cpu, geometries=geometries)
    (Path(folder) / VERSIONS_FILE).write_text(json.dumps(versions, indent=1) + "\n")
    return len(engine.models)


def qwen35_classes(
    dtype: str, value_heads: Sequence[int] = QWEN35_VALUE_HEADS, tensor_parallel: int = 1
) -> tuple[ShapeClass, ...]:
    """Shape classes of MAX's Qwen3.5 layers (16 key heads, ``value_heads``, K = V = 128), l2norm
    on (MAX always normalises): varlen with a state first, then batched without one, per geometry.
    ``tensor_parallel``: the heads one GPU holds when the layer is split over that many (8: 2 key
    heads and 4, 6 or 8 value heads, the float64 oracle 4 to 8 times cheaper than on the whole layer)."""
    if tensor_parallel < 1 or QWEN35_KEY_HEADS % tensor_parallel or any(nv % tensor_parallel for nv in value_heads):
        heads = (QWEN35_KEY_HEADS, *value_heads)
        raise ValueError(f"tensor_parallel: must divide every head count {heads}, got {tensor_parallel}")
    K, nk = QWEN35_HEAD_DIM, QWEN35_KEY_HEADS // tensor_parallel
    flags = ((True, True, True), (False, False, True))
    return tuple(ShapeClass(nk, nv // tensor_parallel, K, K, dtype, *f) for nv in value_heads for f in flags)


def _implementation(name: str, form: Callable, what: str, pool_dtype: Any) -> Implementation:
    narrow = np.dtype(pool_dtype) == BF16
    # MAX keeps each state column in float32 registers over the whole sequence and rounds it only
    # where it reads and writes the pool (seed 001): a bfloat16 pool is a state rounded once per
    # call (tolerance.StoredState). The bfloat16-pool check of 2026-11-27 measured a state error of
    # 2.38e-3, the 2.3e-3 RMS of one bfloat16 rounding (u / sqrt(3)).
    extra = jit_compiled(state_dtype="bfloat16", state_rounding="stored") if narrow else jit_compiled()
    return Implementation(name, {"recurrent": form}, "torch", what, "bfloat16", extra=extra)


def _recurrence(name: str, pool_dtype: Any) -> Implementation:
    kernel = same_head_dims(max_engine().recurrence(pool_dtype))
    form = native_form(kernel, "numpy", pool_dtype)
    what = f"MAX gated_delta_recurrence_fwd ({np.dtype(pool_dtype).name} slot pool, fused l2norm and 1/sqrt(K) scale)"
    return _implementation(name, form, what, pool_dtype)


def _verify_ring(name: str, pool_dtype: Any) -> Implementation:
    verify, fold = max_engine().verify_ring(pool_dtype)
    form = verify_ring_form(same_head_dims(verify), fold, "numpy", pool_dtype)
    what = f"MAX gated_delta_recurrence_verify_ring_fwd + gated_delta_state_fold ({np.dtype(pool_dtype).name} pool)"
    return _implementation(name, form, what, pool_dtype)


def max_recurrence() -> Implementation:
    return _recurrence("max-recurrence", np.float32)


def max_recurrence_bf16() -> Implementation:
    """The recurrence on a bfloat16 pool: the state is rounded to bfloat16 where it is loaded and
    stored, once per call (declared: ``extra["state_dtype"]``, ``extra["state_rounding"]``)."""
    return _recurrence("max-recurrence-bf16", BF16)


def max_verify_ring() -> Implementation:
    return _verify_ring("max-verify-ring", np.float32)


def max_verify_ring_bf16() -> Implementation:
    return _verify_ring("max-verify-ring-bf16", BF16)


__all__ = [
    "MAX_INSTALL",
    "MEFS_ENV",
    "InputSpec",
    "MaxEngine",
    "fold_specs",
    "geometry_graphs",
    "max_engine",
    "max_recurrence",
    "max_recurrence_bf16",
    "max_verify_ring",
    "max_verify_ring_bf16",
    "precompile",
    "qwen35_classes",
    "recurrence_specs",
    "same_head_dims",
    "verify_ring_form",
    "verify_specs",
    "width_operand",
]
