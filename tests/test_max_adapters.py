"""The MAX adapters' translation, with the NumPy kernels of ``max_numpy`` standing in for MAX's.

What runs here is everything but the engine: the graph input layouts (checked against
``max/nn/state_space/gated_delta.py`` of MAX 26.7.0), the verify ring's geometry and arguments,
the MAX rules the verify adapter checks between its launches, and the recipe's shape classes.
The graphs themselves were compiled for sm_90a under MAX's virtual device on 2026-11-26 (see
scripts/gpu-machine/README.md, "MAX wheels"); where ``max`` is importable the last test moves a
bfloat16 pool through MAX buffers.
"""

from __future__ import annotations

import contextlib
import threading

import ml_dtypes
import numpy as np
import pytest

from gdn_verify.api import check
from gdn_verify.core import max_convention as mc
from gdn_verify.core.implementation import ContractError, Implementation
from gdn_verify.core.oracle import numpy_oracle
from gdn_verify.core.tolerance import StoredState
from gdn_verify.core.verdict import state_dtype_of
from gdn_verify.implementations import ConfigurationError, max_numpy, resolve
from gdn_verify.implementations import max_kernels as mk
from tests.test_max_convention import make_problem

BF16 = np.dtype(ml_dtypes.bfloat16)


def ring_form(verify=max_numpy.verify_ring, fold=max_numpy.state_fold, pool_dtype=np.float32):
    return mk.verify_ring_form(verify, fold, pool_dtype=pool_dtype)


def test_recurrence_inputs_follow_the_wrapper():
    specs = mk.recurrence_specs(16, 48, 128, 128, BF16)
    assert [s.name for s in specs] == [
        "qkv_conv_output",
        "decay_per_token",
        "beta_per_token",
        "recurrent_state",
        "slot_idx",
        "input_row_offsets",
    ]
    assert specs[0].shape == ("total_seq_len", 2 * 16 * 128 + 48 * 128)
    assert [s.dtype for s in specs] == ["float32", "float32", "float32", "bfloat16", "uint32", "uint32"]
    assert [s.buffer for s in specs] == [False, False, False, True, False, False]  # the pool is mutated in place
    assert specs[3].shape == ("max_slots", 48, 128, 128)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        mk.recurrence_specs(1, 1, 8, 8, np.float16)


@pytest.mark.parametrize("nv, stride", [(32, 416), (48, 544), (64, 672)])
def test_verify_and_fold_inputs_follow_the_wrapper(nv, stride):
    verify = mk.verify_specs(16, nv, 128, 128, np.float32, 4)
    assert [s.name for s in verify] == [
        "qkv_conv_output",
        "decay_per_token",
        "beta_per_token",
        "recurrent_state",
        "ring",
        "slot_idx",
        "ring_slot_idx",
        "input_row_offsets",
        "verify_width",
    ]
    ring = verify[4]
    # [ring_rows, nk, RING_LEN, record_stride]; a record: raw key, a delta row and a decay per value head
    assert ring.buffer and ring.dtype == "float32" and ring.shape == ("ring_rows", 16, 4, stride)
    assert mc.ring_record_elements(128, 128, nv // 16) <= stride and stride % 32 == 0
    width = verify[-1]
    assert width.host and width.dtype == "int64" and not width.buffer
    fold = mk.fold_specs(16, nv, 128, 128, np.float32, 4)
    assert [s.name for s in fold] == [
        "recurrent_state",
        "ring",
        "row_ids",
        "ring_row_ids",
        "num_accepted",
        "verify_width",
    ]
    assert fold[2].shape == (1, "batch_size") and fold[4].dtype == "uint32"
    assert np.array_equal(mk.width_operand(3), np.arange(3)) and mk.width_operand(-1).size == 0
    assert [mc.ring_len_for(w) for w in (0, 1, 2, 3, 5, 8, 9)] == [2, 2, 2, 4, 8, 8, 8]


CASES = [
    dict(),
    dict(H=1, HV=4, lengths=(1, 7, 0, 3)),
    dict(H=3, HV=9, K=4, V=4, lengths=(2, 2)),
    dict(batch=3, lengths=(5,), regime="spikes"),
    dict(lengths=(1, 1, 0)),  # verify width 0: the plain recurrence, the fold a no-op
    dict(lengths=(12, 3, 8)),  # 12 > RING_LEN 8: that row commits itself, the fold skips it
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "default")
def test_verify_then_fold_equals_the_recurrence_bit_for_bit(case):
    problem = make_problem(**case).astype(np.float32)
    o, state = ring_form()(**problem.kwargs())
    o_ref, state_ref = mc.native_form(max_numpy.gated_delta_recurrence)(**problem.kwargs())
    assert o.tobytes() == o_ref.tobytes() and state.tobytes() == state_ref.tobytes()
    want_o, want_state = numpy_oracle(problem)
    assert np.max(np.abs(o - want_o), initial=0.0) <= 2e-4 * max(1.0, np.abs(want_state).max())
    assert np.max(np.abs(state - want_state)) <= 2e-4 * max(1.0, np.abs(want_state).max())


def test_the_verify_gets_the_ring_and_width_max_expects():
    seen = {}

    def verify(qkv, decay, beta, pool, ring, slot_idx, ring_slot_idx, offsets, width):
        seen.update(ring=ring.copy(), ring_slot_idx=ring_slot_idx.copy(), width=width.copy())
        return max_numpy.verify_ring(qkv, decay, beta, pool, ring, slot_idx, ring_slot_idx, offsets, width)

    problem = make_problem(H=2, HV=6, K=8, V=8, lengths=(3, 0, 2)).astype(np.float32)
    ring_form(verify)(**problem.kwargs())
    assert seen["ring"].shape == (4, 2, 4, mc.ring_record_stride(8, 8, 3)) and np.isnan(seen["ring"]).all()
    assert seen["ring_slot_idx"].tolist() == [3, 2, 1] and seen["ring_slot_idx"].dtype == np.uint32
    assert seen["width"].tolist() == [0, 1] and seen["width"].dtype == np.int64  # K = 3 - 1 drafts


def test_a_sequence_longer_than_the_longest_ring_is_verified_at_width_7():
    # MAX refuses a verify of K drafts on a ring of fewer than K + 1 records (H100, 2026-11-27:
    # "a verify of 8 drafts needs a ring of at least 9 records, got 8" for a 9-token sequence)
    seen = {}

    def verify(qkv, decay, beta, pool, ring, slot_idx, ring_slot_idx, offsets, width):
        seen.update(ring_len=ring.shape[2], width=len(width))
        return max_numpy.verify_ring(qkv, decay, beta, pool, ring, slot_idx, ring_slot_idx, offsets, width)

    problem = make_problem(H=2, HV=4, K=8, V=8, lengths=(9, 3)).astype(np.float32)
    o, state = ring_form(verify)(**problem.kwargs())
    assert seen == {"ring_len": 8, "width": 7}
    o_ref, state_ref = mc.native_form(max_numpy.gated_delta_recurrence)(**problem.kwargs())
    assert o.tobytes() == o_ref.tobytes() and state.tobytes() == state_ref.tobytes()


def test_the_numpy_verify_refuses_a_ring_shorter_than_the_window_like_max():
    problem = make_problem(H=2, HV=4, K=8, V=8, lengths=(3,)).astype(np.float32)
    kwargs = {k: v for k, v in problem.kwargs().items() if k != "output_final_state"}
    args = mc.to_max(**kwargs)
    qkv, decay, beta, pool, slots, offsets = args.astuple()
    ring = np.full((2, 2, 2, mc.ring_record_stride(8, 8, 2)), np.nan, np.float32)
    width = np.arange(2, dtype=np.int64)  # K = 2 drafts: a window of 3 on a ring of 2
    with pytest.raises(ValueError, match="a verify of 2 drafts needs a ring of at least 3 records, got 2"):
        max_numpy.verify_ring(qkv, decay, beta, pool, ring, slots, np.array([1], np.uint32), offsets, width)


def test_a_verify_that_writes_the_live_pool_breaks_maxs_rule():
    def writes_pool(qkv, decay, beta, pool, ring, slot_idx, ring_slot_idx, offsets, width):
        out = max_numpy.verify_ring(qkv, decay, beta, pool, ring, slot_idx, ring_slot_idx, offsets, width)
        max_numpy.gated_delta_recurrence(qkv, decay, beta, pool, slot_idx, offsets)  # commits as well
        return out

    with pytest.raises(ContractError, match="row 1 changed"):
        ring_form(writes_pool)(**make_problem(lengths=(3, 2)).astype(np.float32).kwargs())


def test_a_fold_of_zero_accepted_records_must_leave_the_pool():
    def folds_one_at_least(pool, ring, row_ids, ring_row_ids, num_accepted, width):
        max_numpy.state_fold(pool, ring, row_ids, ring_row_ids, np.maximum(num_accepted, 1), width)

    with pytest.raises(ContractError, match="num_accepted == 0"):
        ring_form(fold=folds_one_at_least)(**make_problem(lengths=(3, 2)).astype(np.float32).kwargs())


def test_records_without_the_raw_key_or_decays_are_caught():
    def normalised_keys(qkv, decay, beta, pool, ring, slot_idx, ring_slot_idx, offsets, width):
        out = max_numpy.verify_ring(qkv, decay, beta, pool, ring, slot_idx, ring_slot_idx, offsets, width)
        ring[..., :8] /= 2.0  # a record holding a scaled key
        return out

    with pytest.raises(ContractError, match="raw key"):
        ring_form(normalised_keys)(**make_problem(lengths=(3, 2)).astype(np.float32).kwargs())

    def records_item_0_on_row_0(qkv, decay, beta, pool, ring, slot_idx, ring_slot_idx, offsets, width):
        return max_numpy.verify_ring(qkv, decay, beta, pool, ring, slot_idx, ring_slot_idx - 1, offsets, width)

    with pytest.raises(ContractError, match="spare ring row 0"):
        ring_form(records_item_0_on_row_0)(**make_problem(lengths=(3, 2)).astype(np.float32).kwargs())


def test_the_verify_ring_form_passes_check(tmp_path):
    impl = Implementation("standin-verify-ring", {"recurrent": ring_form()})
    result = check(impl, dtype="float32", properties=["matches_reference"], max_examples=6, seed=3, cases_dir=tmp_path)[
        "matches_reference"
    ]
    assert result.status == "passed", result.failure and result.failure.message
    o, state = ring_form(pool_dtype=BF16)(**make_problem(lengths=(3, 2)).astype(np.float32).kwargs())
    assert state.dtype == BF16 and o.dtype == np.float32


def test_head_sizes_max_cannot_compile_are_unsupported():
    kernel = mk.same_head_dims(max_numpy.gated_delta_recurrence)
    with pytest.raises(NotImplementedError, match="KEY_HEAD_DIM == VALUE_HEAD_DIM"):
        mc.native_form(kernel)(**make_problem(K=8, V=4).astype(np.float32).kwargs())
    o, _ = mc.native_form(kernel)(**make_problem(K=8, V=8).astype(np.float32).kwargs())
    assert o.shape[-1] == 8


def test_qwen35_shape_classes():
    classes = mk.qwen35_classes("bfloat16")
    assert {(c.H, c.HV, c.K, c.V) for c in classes} == {(16, 32, 128, 128), (16, 48, 128, 128), (16, 64, 128, 128)}
    assert all(c.l2norm and c.dtype == "bfloat16" for c in classes)
    assert {(c.varlen, c.initial_state) for c in classes} == {(True, True), (False, False)}


def test_declared_state_dtype_of_the_bfloat16_pool_adapters():
    form = mc.native_form(max_numpy.gated_delta_recurrence, pool_dtype=BF16)
    impl = mk._implementation("max-recurrence-bf16", form, "bf16 pool", BF16)  # noqa: SLF001
    assert impl.extra["state_dtype"] == "bfloat16" and impl.extra["compile_classes"] and impl.array == "torch"
    assert isinstance(state_dtype_of(impl), StoredState)  # rounded where loaded and stored, not every token
    assert "state_dtype" not in mk._implementation("max-recurrence", form, "f32 pool", np.float32).extra  # noqa: SLF001


def _max_importable() -> bool:
    try:
        import max.driver  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("name", ["max-recurrence", "max-recurrence-bf16", "max-verify-ring", "max-verify-ring-bf16"])
def test_missing_max_or_gpu_is_a_configuration_error(name):
    if _max_importable():
        with pytest.raises(ConfigurationError, match="GPU"):
            resolve(name)  # a CPU machine with MAX installed: no GPU for its kernels
    else:
        with pytest.raises(
            ConfigurationError, match=r"MAX is not installed \(pip install max==26.7.0 max-core==26.7.0\)"
        ):
            resolve(name)


@pytest.mark.skipif(not _max_importable(), reason="MAX is not installed")
def test_bfloat16_pools_travel_through_max_buffers_as_their_bits():
    from max.driver import CPU, Buffer
    from max.dtype import DType

    pool = (np.arange(24, dtype=np.float32) / 7).reshape(1, 2, 3, 4).astype(BF16)
    buffer = mk._numpy_in(pool, Buffer, DType)  # noqa: SLF001
    assert buffer.dtype == DType.bfloat16 and tuple(buffer.shape) == pool.shape
    back = mk._numpy_out(buffer, CPU, DType)  # noqa: SLF001
    assert back.dtype == BF16 and back.tobytes() == pool.tobytes()
    plain = mk._numpy_out(mk._numpy_in(np.arange(5, dtype=np.uint32), Buffer, DType), CPU, DType)  # noqa: SLF001
    assert plain.dtype == np.uint32 and plain.tolist() == [0, 1, 2, 3, 4]


def test_qwen35_shape_classes_at_tensor_parallelism():
    classes = mk.qwen35_classes("bfloat16", tensor_parallel=8)
    assert {(c.H, c.HV, c.K, c.V) for c in classes} == {(2, 4, 128, 128), (2, 6, 128, 128), (2, 8, 128, 128)}
    assert len(classes) == len(mk.qwen35_classes("bfloat16"))
    for bad in (0, 3, 32):
        with pytest.raises(ValueError, match="tensor_parallel"):
            mk.qwen35_classes("bfloat16", tensor_parallel=bad)


def test_geometry_graphs_are_what_the_adapters_compile():
    graphs = list(mk.geometry_graphs(2, 6, 128, 128, BF16))
    assert graphs[0] == ("recurrence", mk.recurrence_specs(2, 6, 128, 128, BF16))
    rings = [(op, next(s.shape[2] for s in specs if s.name == "ring")) for op, specs in graphs[1:]]
    assert rings == [(op, n) for n in mc.RING_LENS for op in ("verify", "fold")]
    assert graphs[1][1] == mk.verify_specs(2, 6, 128, 128, BF16, mc.RING_LENS[0])


def test_a_mef_folder_of_another_max_or_none_at_all_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(mk.importlib.metadata, "version", lambda name: "26.7.0")
    with pytest.raises(ConfigurationError, match="not a folder of precompile's MEF artifacts"):
        mk._mef_folder(str(tmp_path))  # noqa: SLF001
    (tmp_path / mk.VERSIONS_FILE).write_text('{"max": "26.6.0"}')
    with pytest.raises(ConfigurationError, match="compiled by MAX 26.6.0, this is MAX 26.7.0"):
        mk._mef_folder(str(tmp_path))  # noqa: SLF001
    (tmp_path / mk.VERSIONS_FILE).write_text('{"max": "26.7.0"}')
    assert mk._mef_folder(str(tmp_path)) == str(tmp_path)  # noqa: SLF001


def test_a_graph_the_artifacts_lack_is_compiled_by_a_second_session():
    """The engine's loading rule, with stand-ins for MAX's sessions: artifacts first, a graph
    missing from them compiled in a session of its own (made once), every model cached."""

    class Missing(RuntimeError):
        pass

    calls = []

    class Session:
        def __init__(self, name, lacks=()):
            self.name, self.lacks = name, lacks

        def load(self, graph):
            calls.append((self.name, graph))
            if graph in self.lacks:
                raise Missing(graph)
            return f"{self.name}:{graph}"

    class Engine:
        MissingArtifactError = Missing

        @staticmethod
        def InferenceSession(devices):  # noqa: N802 - MAX's name
            return Session("compiling")

    eng = object.__new__(mk.MaxEngine)
    eng.engine, eng.export, eng.device, eng.models = Engine, None, "gpu", {}
    eng.session, eng.compiling = Session("artifacts", lacks=("fold",)), None
    eng.build = lambda op, specs: op
    eng.mlir = contextlib.nullcontext
    assert eng.model("recurrence", ()) == "artifacts:recurrence"
    assert eng.model("fold", ()) == "compiling:fold"
    assert eng.model("fold", ()) == "compiling:fold" and eng.model("recurrence", ()) == "artifacts:recurrence"
    assert calls == [("artifacts", "recurrence"), ("artifacts", "fold"), ("compiling", "fold")]


def test_graphs_are_built_and_loaded_inside_maxs_mlir_context_on_any_thread():
    """MAX enters its (thread-local) MLIR context on the main thread only, and the checks call
    kernels from a worker thread: there MAX 26.7.0's artifact lookup raised "No active MLIR
    context" (H100, 2026-11-28). MaxEngine must build and load each graph inside the scope it got
    from MAX, whichever thread asks."""
    from gdn_verify.implementations import max_kernels as mk

    scope = threading.local()
    seen = []

    @contextlib.contextmanager
    def mlir():
        scope.entered = True
        try:
            yield
        finally:
            scope.entered = False

    def inside(what):
        seen.append((what, threading.current_thread() is not threading.main_thread(), getattr(scope, "entered", False)))
        return what

    class Session:
        @staticmethod
        def load(graph):
            return inside(f"load {graph}")

    eng = object.__new__(mk.MaxEngine)
    eng.export, eng.models, eng.compiling, eng.session, eng.mlir = None, {}, None, Session, mlir
    eng.build = lambda op, specs: inside(op)
    worker = threading.Thread(target=eng.model, args=("verify", ()))
    worker.start()
    worker.join()
    assert seen == [("verify", True, True), ("load verify", True, True)]
    assert eng.models == {("verify", ()): "load verify"}
