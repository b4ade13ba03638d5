"""The recurrent launchers' host side on the CPU, with a stand-in for CuPy (no GPU needed).

The stand-in's arrays are NumPy arrays whose host addresses play the device pointers, and its
``launchKernel`` decodes the packed ``gdn::Params`` instead of launching. This checks what does
not need a kernel: the pointer order, the scalars, host-side metadata validation (a ValueError
naming the argument before any launch), the deferred error words, DecodeStep's per-call guards.
"""

from __future__ import annotations

import contextlib
import ctypes
import struct
import subprocess
import sys
import types

import numpy as np
import pytest

from cupy_kernels import layout


class _Mem:
    def __init__(self, ptr):
        self.ptr, self.device_id = ptr, 0


class FakeArray:
    def __init__(self, a):
        self.a = a
        self.shape, self.strides, self.dtype, self.itemsize, self.size = a.shape, a.strides, a.dtype, a.itemsize, a.size
        self.data = _Mem(a.ctypes.data)

    def __getitem__(self, idx):
        return FakeArray(self.a[idx])


def _fake_cupy(launches):
    cp = types.ModuleType("cupy")
    cp.ndarray = FakeArray
    cp.float32, cp.float16, cp.float64 = np.float32, np.float16, np.float64
    cp.empty = lambda shape, dtype: FakeArray(np.full(shape, np.nan, dtype))
    cp.asarray = lambda x: FakeArray(np.asarray(x))
    cuda = types.SimpleNamespace()
    cuda.runtime = types.SimpleNamespace(
        getDevice=lambda: 0, deviceSynchronize=lambda: None, streamSynchronize=lambda s: None
    )
    cuda.Device = lambda d=0: types.SimpleNamespace(attributes={"MultiProcessorCount": 132}, __enter__=None)

    class Device:
        def __init__(self, d=0):
            self.attributes = {"MultiProcessorCount": 132}

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    class Pinned:
        def __init__(self, size, flags):
            self.buf = np.zeros(size, np.uint8)
            self.ptr = self.buf.ctypes.data

    def launch(fn, gx, gy, gz, bx, by, bz, smem, stream, argv, extra):
        params = ctypes.cast(ctypes.c_void_p(argv), ctypes.POINTER(ctypes.c_void_p))[0]
        fields = layout.unpack_params(ctypes.string_at(params, layout.PARAMS_SIZE))
        launches.append(
            dict(
                ptrs=tuple(fields[name] for name in layout.POINTER_FIELDS),
                params=fields,
                blocks=gx,
                threads=bx,
                stream=stream,
            )
        )

    class Graph:
        graphExec = 4321

        def upload(self, stream):
            launches.append(dict(upload=stream.ptr))

    class Stream:
        def __init__(self, non_blocking=False):
            self.ptr, self.capturing = 777, False

        def begin_capture(self):
            self.capturing = True

        def end_capture(self):
            assert self.capturing
            self.capturing = False
            return Graph()

        def synchronize(self):
            assert not self.capturing

    cuda.Device = Device
    cuda.Stream = Stream
    cuda.runtime.graphLaunch = lambda exec_handle, stream: launches.append(dict(graph=exec_handle, stream=stream))
    cuda.PinnedMemory = Pinned
    cuda.driver = types.SimpleNamespace(launchKernel=launch)
    cuda.get_current_stream = lambda: types.SimpleNamespace(ptr=1234)
    cuda.ExternalStream = lambda ptr: contextlib.nullcontext()
    cp.cuda = cuda

    class RawModule:
        def __init__(self, code, options, name_expressions):
            assert "recurrent_kernel" in code and len(name_expressions) == 1

        def get_function(self, expr):
            return types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=99))

    cp.RawModule = RawModule
    return cp


@pytest.fixture
def fake(monkeypatch):
    launches: list = []
    cp = _fake_cupy(launches)
    monkeypatch.setitem(sys.modules, "cupy", cp)
    from cupy_kernels import recurrent_kernel, tensors

    monkeypatch.setattr(tensors, "_CUPY", cp)
    monkeypatch.setattr(tensors, "_ERRORS", {})
    monkeypatch.setattr(recurrent_kernel, "_PLANS", {})
    recurrent_kernel.compiled.cache_clear()
    tensors.num_sms.cache_clear()
    yield cp, launches
    recurrent_kernel.compiled.cache_clear()
    tensors.num_sms.cache_clear()  # the stand-in's SM count must not reach GPU tests


def arrays(B=1, T=10, H=1, HV=2, K=16, V=8):
    rng = np.random.default_rng(0)
    f = np.float32
    return dict(
        q=FakeArray(rng.standard_normal((B, T, H, K)).astype(f)),
        k=FakeArray(rng.standard_normal((B, T, H, K)).astype(f)),
        v=FakeArray(rng.standard_normal((B, T, HV, V)).astype(f)),
        g=FakeArray(np.zeros((B, T, HV), f)),
        beta=FakeArray(np.zeros((B, T, HV), f)),
    )


def test_recurrent_packs_pointers_and_scalars(fake):
    cp, launches = fake
    from cupy_kernels import tensors
    from cupy_kernels.recurrent import recurrent_gated_delta_rule

    x = arrays()
    cu = FakeArray(np.array([0, 4, 10], np.int64))
    state = FakeArray(np.zeros((2, 2, 16, 8), np.float32))
    A = FakeArray(np.zeros(2, np.float32))
    o, s = recurrent_gated_delta_rule(
        **x,
        initial_state=state,
        output_final_state=True,
        cu_seqlens=cu,
        use_gate_in_kernel=True,
        A_log=A,
        use_beta_sigmoid_in_kernel=True,
        allow_neg_eigval=True,
    )
    (call,) = launches
    ptrs, p = call["ptrs"], call["params"]
    want = [x[n].data.ptr for n in ("q", "k", "v", "g", "beta")] + [
        A.data.ptr,
        0,
        state.data.ptr,
        s.data.ptr,
        o.data.ptr,
        cu.data.ptr,
        0,
        0,
    ]
    assert list(ptrs[:13]) == want
    assert ptrs[13] == tensors.error_words(0).ptr
    assert tuple(p[n] for n in ("B", "T", "N", "H", "HV", "K", "V")) == (1, 10, 2, 1, 2, 16, 8)
    flags = p["flags"]
    assert flags & 2 and flags & 64 and flags & 128  # gate in kernel, beta sigmoid, neg eigval
    assert p["q_st"] == 16 and p["v_sh"] == 8 and p["scale"] == 16**-0.5 and p["slot_mode"] == 0
    assert call["stream"] == 1234  # CuPy's current stream for CuPy arrays
    assert s.shape == (2, 2, 16, 8) and o.shape == (1, 10, 2, 8)


@pytest.mark.parametrize("cu", [[0, 50, 5000], [0, 5, 8], [0, 6, 4, 10], [7, 10], [0, -1, 10]])
def test_host_cu_seqlens_rejected_before_launch(fake, cu):
    cp, launches = fake
    from cupy_kernels.recurrent import recurrent_gated_delta_rule

    with pytest.raises(ValueError, match="^cu_seqlens:"):
        recurrent_gated_delta_rule(**arrays(), cu_seqlens=np.array(cu))
    assert not launches


def test_deferred_error_words(fake):
    cp, launches = fake
    from cupy_kernels import check_errors, tensors
    from cupy_kernels.decode import pooled_decode

    x = arrays(B=2, T=1)
    pool = FakeArray(np.zeros((3, 2, 16, 8), np.float32))
    slots = FakeArray(np.array([0, 2], np.int32))
    pooled_decode(**x, state_pool=pool, slot_indices=slots)
    words = tensors.error_words(0)
    words.words[1] = 1  # what the kernel stores for a slot past the pool
    with pytest.raises(ValueError, match="^slot_indices: .*pooled_decode .*deferred"):
        pooled_decode(**x, state_pool=pool, slot_indices=slots)
    assert len(launches) == 1  # the reporting call did not launch
    pooled_decode(**x, state_pool=pool, slot_indices=slots)  # cleared once reported
    words.words[3] = 1
    with pytest.raises(ValueError, match="^num_accepted_tokens:"):
        check_errors()
    with pytest.raises(ValueError, match="^slot_indices: slot 3"):
        pooled_decode(**x, state_pool=pool, slot_indices=np.array([0, 3]))  # host: validated, no launch
    assert len(launches) == 2


def test_spec_host_metadata(fake):
    cp, launches = fake
    from cupy_kernels.decode import spec_decode

    x = arrays(T=5)
    pool = FakeArray(np.zeros((8, 2, 16, 8), np.float32))
    idx = np.array([[0, 1], [2, 3]])
    ok = dict(state_pool=pool, cu_seqlens=np.array([0, 2, 5]), ssm_state_indices=idx, num_accepted_tokens=[1, 2])
    with pytest.raises(ValueError, match="^cu_seqlens: a request has more than S = 2"):
        spec_decode(**x, **ok)
    ok["cu_seqlens"] = np.array([0, 2, 4])
    with pytest.raises(ValueError, match="^cu_seqlens: must end at T = 5"):
        spec_decode(**x, **ok)
    x = arrays(T=4)
    with pytest.raises(ValueError, match="^num_accepted_tokens:"):
        spec_decode(**x, **dict(ok, num_accepted_tokens=[0, 1]))
    with pytest.raises(ValueError, match="^ssm_state_indices:"):
        spec_decode(**x, **dict(ok, ssm_state_indices=np.array([[0, 1], [2, 8]])))
    assert not launches
    spec_decode(**x, **ok)
    p = launches[0]["params"]
    assert (p["idx_stride"], p["idx_cols"], p["slot_mode"]) == (2, 2, 2)


def test_decode_step_guards(fake):
    cp, launches = fake
    from cupy_kernels import tensors
    from cupy_kernels.decode import DecodeStep

    x = arrays(B=2, T=1)
    pool = FakeArray(np.zeros((3, 2, 16, 8), np.float32))
    slots = FakeArray(np.array([0, 2], np.int32))
    step = DecodeStep(**x, state=pool, slot_indices=slots, reuse_output=True)
    o = step(**x, state=pool, slot_indices=slots)
    assert launches[-1]["ptrs"][7] == launches[-1]["ptrs"][8] == pool.data.ptr
    assert launches[-1]["ptrs"][9] == o.data.ptr and launches[-1]["ptrs"][11] == slots.data.ptr
    with pytest.raises(ValueError, match="^state:"):
        step(**x, state=pool[:2], slot_indices=slots)
    with pytest.raises(ValueError, match="^slot_indices:"):
        step(**x, state=pool, slot_indices=slots[:1])
    with pytest.raises(ValueError, match="^out:"):
        step(**x, state=pool, slot_indices=slots, out=FakeArray(np.zeros((1, 1, 2, 8), np.float32)))
    tensors.error_words(0).words[1] = 1
    with pytest.raises(ValueError, match="^slot_indices: .*DecodeStep"):
        step(**x, state=pool, slot_indices=slots)
    with pytest.raises(ValueError, match="^decode_variant:"):
        DecodeStep(**x, state=pool, slot_indices=slots, decode_variant="bogus")


def test_kernel_mode_names_the_template():
    from cupy_kernels.recurrent_kernel import KernelMode

    mode = KernelMode(2, False, False, 4, 1, 16, 0, True, 0)
    assert mode.name_expression() == "gdn::recurrent_kernel<2, float, false, 4, 1, 16, 0, true, 0>"


def test_decode_graph_captures_once_and_replays(fake):
    cp, launches = fake
    from cupy_kernels import tensors
    from cupy_kernels.decode import DecodeStep

    x = arrays(B=2, T=1)
    pool = FakeArray(np.zeros((3, 2, 16, 8), np.float32))
    slots = FakeArray(np.array([0, 2], np.int32))
    step = DecodeStep(**x, state=pool, slot_indices=slots)
    graph = step.capture(**x, state=pool, slot_indices=slots)
    captured, upload = launches
    assert captured["stream"] == 777 and upload == dict(upload=777)  # private capture stream
    want = [x[n].data.ptr for n in ("q", "k", "v", "g", "beta")] + [0, 0, pool.data.ptr, pool.data.ptr]
    assert list(captured["ptrs"][:9]) == want
    assert captured["ptrs"][9] == graph.out.data.ptr and captured["ptrs"][11] == slots.data.ptr
    assert graph() is graph.out and graph() is graph.out
    assert launches[2:] == [dict(graph=4321, stream=1234)] * 2  # one graph launch per step, current stream
    graph.verify()
    tensors.error_words(0).words[1] = 1
    with pytest.raises(ValueError, match="^slot_indices: .*DecodeGraph"):
        graph()
    assert len(launches) == 4  # the reporting call did not launch
    fixed = step.capture(**x, state=pool, slot_indices=slots, stream=55)
    fixed()
    assert launches[-1] == dict(graph=4321, stream=55)
    with pytest.raises(ValueError, match="^state:"):
        step.capture(**x, state=pool[:2], slot_indices=slots)


def test_external_streams_use_the_stream_protocol_where_cupy_has_it(fake, monkeypatch):
    cp, _ = fake
    from cupy_kernels import tensors

    assert tensors.external_stream(5) is not None  # CuPy 13: ExternalStream (the stand-in's)
    given = []
    monkeypatch.setattr(cp.cuda.Stream, "from_external", lambda obj: given.append(obj) or "wrapped", raising=False)
    monkeypatch.setattr(cp.cuda, "ExternalStream", None)  # deprecated in CuPy 14: must not be called
    assert tensors.external_stream(77) == "wrapped"
    assert [obj.__cuda_stream__() for obj in given] == [(0, 77)]


@pytest.mark.parametrize(
    "K, V, sequences, HV, sms, want",
    [
        (128, 128, 1, 32, 132, 2),  # one long sequence: 128 CTAs of the split form fill one wave
        (128, 128, 2, 32, 132, 1),  # 256 would need two waves: the unsplit form is cheaper
        (128, 128, 8, 32, 132, 1),
        (64, 64, 4, 16, 132, 2),
        (96, 128, 1, 8, 132, 2),  # K % 32 == 0 is enough for the K halves
        (80, 128, 1, 8, 132, 1),  # K / 2 = 40 is not whole 16-row blocks
        (128, 48, 1, 8, 132, 1),  # V = 48 is not two slabs
    ],
)
def test_fused_k_split_rule(K, V, sequences, HV, sms, want):
    from cupy_kernels.chunk_plan import fused_k_split

    assert fused_k_split(K, V, sequences, HV, sms) == want


def test_fused_state_shared_memory_fits():
    """Every fused state form the launcher can pick fits the 227 KiB an H100 CTA may opt in to."""
    from cupy_kernels.layout import FUSED_MAX_K, fused_state_smem

    forms = [(4, 1), (2, 1), (1, 1), (2, 2)]
    sizes = {form: fused_state_smem(FUSED_MAX_K, *form) for form in forms}
    assert max(sizes.values()) <= 227 * 1024, sizes
    # the unsplit forms (many sequences) fit two CTAs in an SM's 228 KiB (1 KiB reserved per CTA)
    assert all(2 * (sizes[form] + 1024) <= 228 * 1024 for form in forms if form[1] == 1), sizes
    # the split form adds a second stage of q, v and T'/P' (bf16 rows padded by 8) and one 8 KiB
    # exchange buffer per warp (64 fp32 partials per lane)
    second_stage = 64 * (FUSED_MAX_K + 8) * 2 + 64 * (32 + 8) * 2 + 4 * 64 * (64 + 8) * 2
    assert sizes[(2, 2)] - fused_state_smem(FUSED_MAX_K, 2, 1) == second_stage + 4 * 64 * 32 * 4


def test_fused_prep_shared_memory_gives_four_ctas():
    """prep's k, q space is reused for T once the products are done: four CTAs per SM at K = 128."""
    from cupy_kernels.layout import FUSED_MAX_K, fused_prep_smem

    prep = fused_prep_smem(FUSED_MAX_K)
    assert 4 * (prep + 1024) <= 228 * 1024, prep
    assert prep == 64 * 8 + 4 * 64 * 4 + 64 * 65 * 4 + 2 * 64 * (FUSED_MAX_K + 8) * 2


def test_kernel_signature_offsets_follow_c_alignment():
    """cuLaunchKernel reads each parameter at its C-aligned offset: a pointer after an int skips 4 bytes."""
    from cupy_kernels.tensors import Signature

    sig = Signature("PiPfi")
    assert sig.offsets == [0, 8, 16, 24, 28]
    buf = bytearray(sig.struct.size)
    sig.struct.pack_into(buf, 0, 2**40 + 3, -7, 2**33, 0.5, 9)
    got = [struct.unpack_from(code, buf, off)[0] for code, off in zip("QiQfi", sig.offsets)]
    assert got == [2**40 + 3, -7, 2**33, 0.5, 9]


def test_chunk_tables_pack_into_one_buffer():
    """The three chunk tables travel in one int64 upload; each reads back at its offset and type."""
    from cupy_kernels.chunk import chunk_tables, pack_tables

    for bounds in ([0, 1, 64, 128, 193, 193, 200], [0, 4096], [0, 0], [0, 63, 64, 65]):
        bounds = np.asarray(bounds, np.int64)
        packed, (o_start, o_len, o_off), NC = pack_tables(bounds, 64)
        start, length, off = chunk_tables(bounds, 64)
        raw = packed.tobytes()
        assert NC == start.size
        assert o_start % 8 == 0 and o_len % 8 == 0 and o_off % 8 == 0
        np.testing.assert_array_equal(np.frombuffer(raw, np.int64, NC, o_start), start)
        np.testing.assert_array_equal(np.frombuffer(raw, np.int32, NC, o_len), length)
        np.testing.assert_array_equal(np.frombuffer(raw, np.int32, off.size, o_off), off)


# --------------------------------------------------------------------------- plan selection (pure)


def test_recurrent_select_plan():
    """The recurrent kernel and grid from shapes and the SM count alone (no CuPy, no device)."""
    from cupy_kernels import recurrent_kernel as rk

    sel = rk.select_plan(2, False, False, rk.MODE_DECODE, None, 1, 32, 128, 128, 132)
    assert sel.kernel == rk.KernelMode(2, False, False, 4, 1, 16, rk.MODE_DECODE, True, 0)  # "wide-cs"
    assert (sel.vtiles, sel.total_warps) == (8, 256)
    assert (sel.blocks, sel.threads) == (256, 32)  # batch 1: one-warp CTAs over every SM
    sel = rk.select_plan(2, False, False, rk.MODE_DECODE, "wide", 64, 32, 128, 128, 132)
    assert not sel.kernel.streaming and (sel.blocks, sel.threads) == (4096, 128)
    prefill = rk.select_plan(2, False, True, rk.MODE_PREFILL, "wide-cs", 2, 4, 128, 128, 132)
    assert prefill.kernel == rk.KernelMode(2, False, True, 8, 4, 4, rk.MODE_PREFILL, False, 0)  # variants: decode only
    assert rk.select_plan(3, True, False, rk.MODE_PREFILL, None, 1, 1, 16, 16, 132).kernel.lc == 2  # doubles
    with pytest.raises(ValueError, match="^decode_variant:"):
        rk.select_plan(2, False, False, rk.MODE_DECODE, "narrow-cs", 1, 1, 128, 128, 132)


def test_rows_variant_spreads_k_over_the_warp_only_for_a_v_first_float_state():
    """rows-cs: v-first, K over all 32 lanes (16 state floats a lane) under its register cap, so 8
    CTAs of 4 warps per head at K = V = 128; k-first or a double state, the wide tile uncapped
    (a cap of 80 registers would spill its 64 floats)."""
    from cupy_kernels import recurrent_kernel as rk

    sel = rk.select_plan(2, False, True, rk.MODE_DECODE, "rows-cs", 64, 32, 128, 128, 132)
    assert sel.kernel == rk.KernelMode(2, False, True, 32, 1, 4, rk.MODE_DECODE, True, 6)
    assert (sel.vtiles, sel.blocks, sel.threads) == (32, 64 * 32 * 32 // 4, 128)
    for K, V in ((256, 64), (60, 100), (16, 16), (128, 1)):
        lc, ac, br, wv = rk.tiling(K, V, True, False, rows=True)
        assert lc * ac * 4 >= K and ac * 4 * br <= 16 and wv == (32 // lc) * br  # all of K, <= 16 floats
    wide = rk.select_plan(2, False, False, rk.MODE_DECODE, "wide-cs", 64, 32, 128, 128, 132)
    assert rk.select_plan(2, False, False, rk.MODE_DECODE, "rows-cs", 64, 32, 128, 128, 132) == wide
    oracle = rk.select_plan(3, True, True, rk.MODE_DECODE, "rows-cs", 1, 1, 128, 128, 132).kernel
    assert oracle.lc == rk.tiling(128, 128, True, True)[0] and oracle.min_blocks == 0


def test_recurrent_select_plan_follows_the_default_variant(monkeypatch):
    """``None`` means DEFAULT_VARIANT as it is now, not as it was when the cache first saw the key
    (the GPU variant tests and sanitize_decode.py switch it and drop ``_PLANS``)."""
    from cupy_kernels import recurrent_kernel as rk

    args = (2, False, False, rk.MODE_DECODE, None, 1, 32, 128, 128, 132)
    assert rk.select_plan(*args).kernel.streaming  # "wide-cs", now in the cache
    monkeypatch.setattr(rk, "DEFAULT_VARIANT", "wide")
    assert not rk.select_plan(*args).kernel.streaming


def test_decode_variants_are_the_measured_ones():
    """The variants that measured slower (narrow, persistent) left for cupy_kernels/experimental/;
    rows-cs awaits its H200 measurement beside FlashInfer's V-major decode (RECURRENT_NOTES.md)."""
    from cupy_kernels import decode, recurrent_kernel

    assert set(recurrent_kernel.VARIANTS) == {"wide", "wide-cs", "rows-cs"} == set(decode.DECODE_VARIANTS)
    assert recurrent_kernel.DEFAULT_VARIANT == "wide-cs"
    for name in ("narrow", "narrow-cs", "narrow-cs-pf", "wide-cs-pf"):
        with pytest.raises(ValueError, match="^decode_variant:"):
            recurrent_kernel.variant(name)


H100 = dict(sms=132, capability=(9, 0))
A100 = dict(sms=108, capability=(8, 0))


def chunk_plan(dtype="bfloat16", C=64, K=128, V=128, N=1, HV=32, aligned=True, tc=None, fused=None, ks=None,
               wgmma=None, device=H100, **kw):  # fmt: skip
    from cupy_kernels.chunk_plan import select_plan

    return select_plan(dtype, C, K, V, N, HV, aligned, tc, fused, ks, wgmma, device["sms"], device["capability"], **kw)


def test_chunk_select_plan_three_kernel():
    from cupy_kernels import layout

    plan = chunk_plan("float32", C=32, K=100, V=60)
    assert plan.path == plan.label == "three-kernel" and not plan.tensor_cores
    assert [k.name for k in plan.kernels] == [
        "gdn_chunk_intra<float, 32, false>",
        "gdn_chunk_state<32, false>",
        "gdn_chunk_output<float, 32, false>",
    ]
    assert {k.source for k in plan.kernels} == {"chunk_three_kernel.cu"}
    assert [k.smem for k in plan.kernels] == [
        layout.chunk_intra_smem(32, 100, 60),
        layout.chunk_state_smem(32, 100, False),
        layout.chunk_output_smem(32, 100),
    ]
    assert [k.threads for k in plan.kernels] == [256] * 3 and plan.kernels[1].columns == 16
    tc = chunk_plan("float16", C=16, K=256, V=256)  # fp16: tensor cores, never fused
    assert tc.path == "three-kernel" and tc.tensor_cores and tc.kernels[1].name == "gdn_chunk_state<16, true>"
    assert tc.kernels[1].smem == layout.chunk_state_smem(16, 256, True)
    assert chunk_plan(aligned=False).path == "three-kernel"  # the fused path copies 16-byte pieces
    assert chunk_plan(fused=False).path == "three-kernel" and chunk_plan(tc=False).path == "three-kernel"


def test_chunk_select_plan_fused_and_wgmma():
    from cupy_kernels import layout

    wg = chunk_plan()  # bf16, K = V = 128 on an H100: prep + the sm_90a state kernel, nothing else
    assert wg.path == "wgmma" and wg.label == "fused wgmma sm_90a"
    prep, state = wg.kernels
    assert (prep.source, prep.name, prep.sm90a) == ("chunk_fused_prep.cu", "gdn_fused_prep", False)
    assert (state.source, state.name, state.sm90a) == ("chunk_wgmma.cu", "gdn_fused_state_sm90_k128", True)
    assert (state.threads, state.smem, state.columns) == (192, layout.wgmma_state_smem(128), 64)
    assert prep.smem == layout.fused_prep_smem(128) and prep.threads == 256
    # where the sm_90a build fails, or off sm_90: mma.sync; one long sequence splits K (one wave)
    for plan in (chunk_plan(sm90a_builds=False), chunk_plan(HV=16, device=A100)):
        assert plan.path == "fused" and plan.label == "fused mma.sync <2, 2>"
        assert plan.kernels[1].name == "gdn_fused_state<2, 2>" and plan.kernels[1].source == "chunk_fused.cu"
        assert plan.kernels[1].smem == layout.fused_state_smem(128, 2, 2) and plan.kernels[1].threads == 128
    many = chunk_plan(N=8, device=A100)  # many sequences: four slabs, no split
    assert many.label == "fused mma.sync <4, 1>" and many.kernels[1].columns == 64
    assert chunk_plan(K=96, V=48).label == "fused mma.sync <1, 1>"  # V = 48: one slab; K = 96: no wgmma kernel
    assert chunk_plan(wgmma=False).path == "fused" and chunk_plan(ks=1).label == "fused mma.sync <4, 1>"
    assert chunk_plan(wgmma=True, K=64, V=192).kernels[1].name == "gdn_fused_state_sm90_k64"


@pytest.mark.parametrize(
    "kw, name",
    [
        (dict(dtype="float32", fused=True), "fused"),
        (dict(aligned=False, fused=True), "fused"),
        (dict(K=144, fused=True), "fused"),
        (dict(dtype="float32", ks=1), "k_split"),
        (dict(K=48, ks=2), "k_split"),
        (dict(wgmma=True, device=A100), "wgmma"),
        (dict(wgmma=True, K=96), "wgmma"),
        (dict(wgmma=True, ks=1), "wgmma"),
        (dict(wgmma=True, fused=False), "wgmma"),
    ],
)
def test_chunk_select_plan_refuses_options_that_do_not_apply(kw, name):
    with pytest.raises(ValueError, match=f"^{name}:"):
        chunk_plan(**kw)


def test_chunk_builds_only_the_plans_kernels(monkeypatch):
    """Each path compiles exactly the kernels it launches: the wgmma path builds prep alone (not
    the mma.sync state kernel beside it) and the sm_90a state kernel."""
    from cupy_kernels import chunk, sources

    built = []
    monkeypatch.setattr(sources, "raw_module", lambda src, names: built.append((src, names)) or names)

    class Module:
        def get_function(self, name):
            built.append(("sm90a", name))
            return name

    monkeypatch.setattr(sources, "sm90a_module", lambda src: built.append(("sm90a module", src)) or Module())
    chunk._functions.cache_clear()
    try:
        assert chunk._functions(chunk_plan()) == ("gdn_fused_prep", "gdn_fused_state_sm90_k128")
        assert built == [
            ("chunk_fused_prep.cu", ("gdn_fused_prep",)),
            ("sm90a module", "chunk_wgmma.cu"),
            ("sm90a", "gdn_fused_state_sm90_k128"),
        ]
        built.clear()
        chunk._functions(chunk_plan(HV=16, device=A100))
        assert built == [("chunk_fused_prep.cu", ("gdn_fused_prep",)), ("chunk_fused.cu", ("gdn_fused_state<2, 2>",))]
        built.clear()
        names = chunk._functions(chunk_plan("float32"))
        assert built == [("chunk_three_kernel.cu", names)] and len(names) == 3
    finally:
        chunk._functions.cache_clear()


def test_planning_modules_import_without_cupy():
    code = (
        "import sys; import cupy_kernels.chunk, cupy_kernels.chunk_plan, cupy_kernels.decode, cupy_kernels.layout, "
        "cupy_kernels.recurrent, cupy_kernels.recurrent_kernel, cupy_kernels.sources; "
        "assert not {'cupy', 'torch'} & set(sys.modules), sorted(m for m in sys.modules if 'cupy' in m)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(use_gate_in_kernel=True), "A_log: required"),
        (dict(A_log=np.zeros(2, np.float32)), "A_log: only read"),
        (dict(allow_neg_eigval=True), "allow_neg_eigval: requires"),
    ],
)
def test_chunk_and_recurrent_launchers_share_the_gate_option_rules(options, message):
    """FLA's in-kernel gate option rules, one function (``recurrent_kernel.options``) for both
    launchers: refused before any device is touched."""
    from cupy_kernels import chunk, recurrent_kernel

    with pytest.raises(ValueError, match=message):
        chunk.chunk_gated_delta_rule(None, None, None, None, None, **options)
    with pytest.raises(ValueError, match=message):
        recurrent_kernel.options(
            options.get("use_gate_in_kernel", False),
            options.get("A_log"),
            options.get("use_beta_sigmoid_in_kernel", False),
            options.get("allow_neg_eigval", False),
        )
