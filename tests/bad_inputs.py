"""A corpus of bad metadata for every launcher in ``cupy_kernels`` (GPU only).

Each case calls one entry point with one bad ``cu_seqlens`` / slot index / accepted-token count
(on the host, or on the device in checked or deferred mode) and asserts the ``ValueError`` that
names the argument. Cases that write a state pool place it between two canary slots and check
that the canaries, and the slots nobody addresses, are bitwise unchanged (no write out of
bounds); compute-sanitizer memcheck checks the reads.

    python -m tests.bad_inputs NAME...   # run the named cases (``all``: every case), one process
    python -m tests.bad_inputs --list    # the case names

``tests/test_cupy_bad_inputs.py`` runs every case in its own process, so that a CUDA error in
one case cannot poison the next. Imports nothing GPU-related until a case runs.
"""

from __future__ import annotations

import re
import sys
import traceback
from collections.abc import Callable

import numpy as np

T, H, HV, K, V = 100, 1, 2, 16, 16
BAD_CU = {
    "end_past_T": [0, 50, 5000],
    "end_short": [0, 50, 80],
    "decreasing": [0, 60, 40, 100],
    "start_7": [7, 100],
    "negative": [0, -5, 100],
}
CANARY = 7.0
CASES: dict[str, Callable] = {}


def case(name: str):
    def register(fn):
        CASES[name] = fn
        return fn

    return register


def raises(name: str, fn: Callable, *args, **kw) -> str:
    """Call ``fn`` and return the message of the ``ValueError`` that must name ``name``."""
    try:
        fn(*args, **kw)
    except ValueError as exc:
        msg = str(exc)
        assert re.match(rf"^{re.escape(name)}:", msg), f"ValueError does not name {name!r}: {msg}"
        return msg
    raise AssertionError(f"no ValueError naming {name!r}")


def problem(cp, B=1, T_=T, seed=0):
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((B, T_, H, K))
    k /= np.linalg.norm(k, axis=-1, keepdims=True)
    host = dict(
        q=rng.standard_normal((B, T_, H, K)),
        k=k,
        v=rng.standard_normal((B, T_, HV, V)),
        g=np.log(rng.uniform(0.5, 1.0, (B, T_, HV))),
        beta=rng.uniform(0.0, 1.0, (B, T_, HV)),
    )
    return {n: cp.asarray(x.astype(np.float32)) for n, x in host.items()}


def guarded_pool(cp, slots: int, seed=1):
    """A ``[slots, HV, K, V]`` pool view between two canary slots: ``(big, pool, host copy)``."""
    big = cp.full((slots + 2, HV, K, V), CANARY, cp.float32)
    pool = big[1:-1]
    pool[...] = cp.asarray(np.random.default_rng(seed).standard_normal((slots, HV, K, V)).astype(np.float32))
    cp.cuda.get_current_stream().synchronize()
    return big, pool, cp.asnumpy(pool)


def assert_canaries(cp, big, pool=None, before=None, untouched=()):
    host = cp.asnumpy(big)
    assert np.all(host[0] == CANARY) and np.all(host[-1] == CANARY), "a canary slot was overwritten"
    for slot in untouched:
        np.testing.assert_array_equal(host[1 + slot], before[slot])


def devices(cp, values, dtype=np.int64):
    return cp.asarray(np.asarray(values, dtype))


def no_pending(cp):
    from cupy_kernels import check_errors

    check_errors()  # raises if any earlier kernel reported an error this case did not expect


# --------------------------------------------------------------------------- recurrent / chunk


def _recurrent(cp, cu, **kw):
    from cupy_kernels.recurrent import recurrent_gated_delta_rule

    N = len(cu) - 1
    state = cp.zeros((N, HV, K, V), cp.float32)
    return recurrent_gated_delta_rule(**problem(cp), initial_state=state, output_final_state=True, cu_seqlens=cu, **kw)


for _bad, _cu in BAD_CU.items():

    @case(f"recurrent/cu_seqlens/{_bad}/host")
    def _(cp, cu=_cu):
        raises("cu_seqlens", _recurrent, cp, np.asarray(cu))

    @case(f"recurrent/cu_seqlens/{_bad}/device-checked")
    def _(cp, cu=_cu):
        raises("cu_seqlens", _recurrent, cp, devices(cp, cu), checked=True)
        no_pending(cp)  # reported once, then cleared

    @case(f"recurrent/cu_seqlens/{_bad}/device-deferred")
    def _(cp, cu=_cu):
        from cupy_kernels import check_errors

        _recurrent(cp, devices(cp, cu, np.int32))  # launches; the kernel reports
        msg = raises("cu_seqlens", check_errors)
        assert "deferred" in msg, msg
        # the next call reports a deferred error too
        _recurrent(cp, devices(cp, cu))
        cp.cuda.runtime.deviceSynchronize()
        msg = raises("cu_seqlens", _recurrent, cp, devices(cp, [0, T]))
        assert "recurrent_gated_delta_rule" in msg, msg
        _recurrent(cp, devices(cp, [0, 30, T]), checked=True)  # good metadata: no error left

    @case(f"chunk/cu_seqlens/{_bad}")
    def _(cp, cu=_cu):
        from cupy_kernels.chunk import chunk_gated_delta_rule

        data = problem(cp)
        state = cp.zeros((len(cu) - 1, HV, K, V), cp.float32)
        for meta in (list(cu), np.asarray(cu), devices(cp, cu), devices(cp, cu, np.int32)):
            raises("cu_seqlens", chunk_gated_delta_rule, **data, initial_state=state, cu_seqlens=meta)

    @case(f"spec_decode/cu_seqlens/{_bad}")
    def _(cp, cu=_cu):
        N = len(cu) - 1
        big, pool, before = guarded_pool(cp, 2 * N + 2)
        idx = np.arange(2 * N).reshape(N, 2) % (2 * N + 2)
        for meta, checked in ((np.asarray(cu), None), (devices(cp, cu), True)):
            raises("cu_seqlens", _spec, cp, pool, meta, idx, np.ones(N, np.int64), checked=checked, device_meta=True)
        assert_canaries(cp, big, pool, before, untouched=range(2 * N + 2))


def _spec(cp, pool, cu, idx, accepted, checked=None, device_meta=True, T_=T):
    from cupy_kernels.decode import spec_decode

    if device_meta:  # int64: a slot past 2^31 must reach the kernel as it is
        idx = devices(cp, idx) if isinstance(idx, np.ndarray) else idx
        accepted = devices(cp, accepted) if isinstance(accepted, np.ndarray) else accepted
    return spec_decode(
        **problem(cp, T_=T_),
        state_pool=pool,
        cu_seqlens=cu,
        ssm_state_indices=idx,
        num_accepted_tokens=accepted,
        checked=checked,
    )


@case("recurrent/cu_seqlens/shape")
def _(cp):
    raises("cu_seqlens", _recurrent, cp, devices(cp, [[0, 100]]))
    raises("cu_seqlens", _recurrent, cp, devices(cp, [0, 100], np.float32))
    raises("cu_seqlens", _recurrent, cp, np.array([0.0, 100.0]))


@case("recurrent/good_after_bad")
def _(cp):
    """A good call after a reported error computes the same as in a fresh process."""
    from cupy_kernels.recurrent import recurrent_gated_delta_rule

    data = problem(cp)
    o1, s1 = recurrent_gated_delta_rule(**data, output_final_state=True, cu_seqlens=devices(cp, [0, 40, T]))
    raises("cu_seqlens", _recurrent, cp, devices(cp, [0, 60, 40, 100]), checked=True)
    o2, s2 = recurrent_gated_delta_rule(**data, output_final_state=True, cu_seqlens=devices(cp, [0, 40, T]))
    assert cp.array_equal(o1, o2) and cp.array_equal(s1, s2)


# --------------------------------------------------------------------------- pools


def _pooled(cp, pool, idx, checked=None):
    from cupy_kernels.decode import pooled_decode

    return pooled_decode(
        **problem(cp, B=len(idx) if hasattr(idx, "__len__") else idx.shape[0], T_=1),
        state_pool=pool,
        slot_indices=idx,
        checked=checked,
    )


@case("pooled_decode/slot_past_pool/host")
def _(cp):
    big, pool, before = guarded_pool(cp, 4)
    raises("slot_indices", _pooled, cp, pool, np.array([0, 4, 1]))
    raises("slot_indices", _pooled, cp, pool, [2, 1000])
    assert_canaries(cp, big, pool, before, untouched=range(4))


@case("pooled_decode/slot_past_pool/device-checked")
def _(cp):
    big, pool, before = guarded_pool(cp, 4)
    raises("slot_indices", _pooled, cp, pool, devices(cp, [3, 4, -1], np.int32), checked=True)
    assert_canaries(cp, big, pool, before, untouched=(0, 1, 2))  # slot 3 was legitimately updated
    no_pending(cp)


@case("pooled_decode/slot_past_pool/device-deferred")
def _(cp):
    from cupy_kernels import check_errors

    big, pool, before = guarded_pool(cp, 4)
    o = _pooled(cp, pool, devices(cp, [2, 5, 1 << 40]))  # no error yet: nothing synchronized
    msg = raises("slot_indices", check_errors)
    assert "pooled_decode" in msg, msg
    assert cp.all(o[1:] == 0), "rows with bad slots must be handled like padding"
    assert_canaries(cp, big, pool, before, untouched=(0, 1, 3))


@case("pooled_decode/slot_shape")
def _(cp):
    _, pool, _ = guarded_pool(cp, 4)
    from cupy_kernels.decode import pooled_decode

    raises("slot_indices", pooled_decode, **problem(cp, B=2, T_=1), state_pool=pool, slot_indices=devices(cp, [0]))
    raises(
        "slot_indices",
        pooled_decode,
        **problem(cp, B=2, T_=1),
        state_pool=pool,
        slot_indices=devices(cp, [0, 1], np.float32),
    )


# --------------------------------------------------------------------------- speculative decoding

SPEC_CU = [0, 2, 3, 3, 5]  # N = 4 requests, S = 2 slots each
SPEC_T = 5


def _spec_ok(cp):
    idx = np.array([[0, 1], [2, 3], [4, 5], [6, 7]])
    return idx, np.array([1, 2, 1, 2])


@case("spec_decode/request_longer_than_S")
def _(cp):
    big, pool, before = guarded_pool(cp, 8)
    idx, acc = _spec_ok(cp)
    cu = [0, 3, 3, 4, 5]  # request 0 has 3 tokens, S = 2
    raises("cu_seqlens", _spec, cp, pool, np.array(cu), idx, acc, T_=SPEC_T)
    raises("cu_seqlens", _spec, cp, pool, devices(cp, cu), idx, acc, checked=True, T_=SPEC_T)
    assert_canaries(cp, big, pool, before, untouched=(0, 1))


@case("spec_decode/state_index_past_pool")
def _(cp):
    big, pool, before = guarded_pool(cp, 8)
    idx, acc = _spec_ok(cp)
    bad_start = idx.copy()
    bad_start[1, 1] = 8  # request 1 starts from slot idx[1, acc - 1] = 8
    bad_write = idx.copy()
    bad_write[0, 1] = 1 << 33  # request 0 writes its second token's state there
    for bad in (bad_start, bad_write):
        raises("ssm_state_indices", _spec, cp, pool, np.array(SPEC_CU), bad, acc, device_meta=False, T_=SPEC_T)
        raises("ssm_state_indices", _spec, cp, pool, devices(cp, SPEC_CU), bad, acc, checked=True, T_=SPEC_T)
    assert_canaries(cp, big)


@case("spec_decode/num_accepted_out_of_range")
def _(cp):
    from cupy_kernels import check_errors

    big, pool, before = guarded_pool(cp, 8)
    idx, _ = _spec_ok(cp)
    for acc in ([1, 0, 1, 1], [1, 3, 1, 1], [1, -4, 1, 1]):
        acc = np.array(acc)
        raises("num_accepted_tokens", _spec, cp, pool, np.array(SPEC_CU), idx, acc, device_meta=False, T_=SPEC_T)
        raises("num_accepted_tokens", _spec, cp, pool, devices(cp, SPEC_CU), idx, acc, checked=True, T_=SPEC_T)
        _spec(cp, pool, devices(cp, SPEC_CU), idx, acc, T_=SPEC_T)
        raises("num_accepted_tokens", check_errors)
    assert_canaries(cp, big)


@case("spec_decode/good")
def _(cp):
    big, pool, before = guarded_pool(cp, 10)
    idx, acc = _spec_ok(cp)
    _spec(cp, pool, devices(cp, SPEC_CU), idx, acc, checked=True, T_=SPEC_T)
    assert_canaries(cp, big, pool, before, untouched=(8, 9))
    no_pending(cp)


# --------------------------------------------------------------------------- raw gates, DecodeStep


@case("fused_decode_raw_gates/bad_shapes")
def _(cp):
    from cupy_kernels.decode import fused_decode_raw_gates

    d = problem(cp, B=2, T_=1)
    state = cp.zeros((2, HV, V, K), cp.float32)
    A = cp.zeros(HV, cp.float32)
    a, b = d["g"], d["beta"]
    raises("state", fused_decode_raw_gates, d["q"], d["k"], d["v"], state[:1], A, a, A, b)
    raises("state", fused_decode_raw_gates, d["q"], d["k"], d["v"], state.astype(cp.float64), A, a, A, b)
    raises("state", fused_decode_raw_gates, d["q"], d["k"], d["v"], state.transpose(0, 1, 3, 2), A, a, A, b)
    raises("A_log", fused_decode_raw_gates, d["q"], d["k"], d["v"], state, A[:1], a, A, b)
    raises("dt_bias", fused_decode_raw_gates, d["q"], d["k"], d["v"], state, A, a, cp.zeros(3, cp.float32), b)
    raises("a", fused_decode_raw_gates, d["q"], d["k"], d["v"], state, A, a[:1], A, b)
    raises("b", fused_decode_raw_gates, d["q"], d["k"], d["v"], state, A, a, A, b[:, :, :1])


@case("DecodeStep/slot_past_pool")
def _(cp):
    from cupy_kernels.decode import DecodeStep

    big, pool, before = guarded_pool(cp, 4)
    d = problem(cp, B=3, T_=1)
    good = devices(cp, [0, -1, 2], np.int32)
    step = DecodeStep(**d, state=pool, slot_indices=good)
    step(**d, state=pool, slot_indices=good)
    no_pending(cp)
    bad = devices(cp, [1, 4, 3], np.int32)
    raises("slot_indices", step.checked, **d, state=pool, slot_indices=bad)
    step(**d, state=pool, slot_indices=bad)  # the unchecked path: skipped in the kernel, reported later
    cp.cuda.runtime.deviceSynchronize()
    msg = raises("slot_indices", step, **d, state=pool, slot_indices=good)
    assert "DecodeStep" in msg, msg
    assert_canaries(cp, big)
    raises("slot_indices", step, **d, state=pool, slot_indices=devices(cp, [0, 1], np.int32))
    raises("state", step, **d, state=pool[:3], slot_indices=good)
    raises("out", step, **d, state=pool, slot_indices=good, out=cp.empty((2, 1, HV, V), cp.float32))
    assert_canaries(cp, big)


@case("DecodeStep/checked_host_slots")
def _(cp):
    from cupy_kernels.decode import DecodeStep

    big, pool, before = guarded_pool(cp, 4)
    d = problem(cp, B=2, T_=1)
    step = DecodeStep(**d, state=pool, slot_indices=devices(cp, [0, 1], np.int32))
    raises("slot_indices", step.checked, **d, state=pool, slot_indices=np.array([0, 9]))
    assert_canaries(cp, big, pool, before, untouched=range(4))


# --------------------------------------------------------------------------- runner


def main(argv: list[str]) -> int:
    if argv == ["--list"]:
        print("\n".join(CASES))
        return 0
    names = list(CASES) if argv in ([], ["all"]) else argv
    import cupy as cp

    failed = 0
    for name in names:
        try:
            CASES[name](cp)
            cp.cuda.runtime.deviceSynchronize()  # a CUDA error surfaces here, inside its case
            print(f"PASS {name}", flush=True)
        except Exception:  # noqa: BLE001 - report every case
            failed += 1
            print(f"FAIL {name}\n{traceback.format_exc()}", flush=True)
    print(f"{len(names) - failed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
