"""The autograd path of ``check --grad``: a torch forward's backward through ``autograd_backward``."""

from __future__ import annotations

import numpy as np
import pytest

from gdn_verify.core.grad_verdict import gradient_contract_violations
from gdn_verify.core.gradients import cotangents, problem_gradients
from gdn_verify.core.implementation import Implementation
from gdn_verify.core.problem import DTYPES, Problem

torch = pytest.importorskip("torch", reason="the autograd path needs PyTorch (pip install '.[torch]')")

from gdn_verify.implementations.autograd import autograd_backward  # noqa: E402
from tests.torch_gdn import recurrent_gated_delta_rule  # noqa: E402


def _problem(varlen: bool, initial_state: bool, l2norm: bool) -> Problem:
    rng = np.random.default_rng(int(varlen) + 2 * int(initial_state) + 4 * int(l2norm))
    B, T, H, HV, K, V = (1, 30, 1, 2, 8, 6) if varlen else (2, 17, 2, 4, 5, 8)
    N = 2
    return Problem(
        rng.standard_normal((B, T, H, K)),
        rng.standard_normal((B, T, H, K)),
        rng.standard_normal((B, T, HV, V)),
        -rng.random((B, T, HV)) * 0.3,
        rng.random((B, T, HV)),
        initial_state=rng.standard_normal((N, HV, K, V)) if initial_state else None,
        use_qk_l2norm_in_kernel=l2norm,
        cu_seqlens=np.array([0, 11, 30]) if varlen else None,
    )


@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("initial_state", [False, True])
@pytest.mark.parametrize("with_dht", [False, True])
def test_autograd_of_a_torch_loop_equals_the_adjoint(varlen, initial_state, with_dht):
    """Torch's autograd of an independent float64 token loop, through the wrapper, equals the
    oracle's hand-written adjoint to rounding: a check of both, GVA and l2norm included."""
    problem = _problem(varlen, initial_state, l2norm=varlen)
    impl = Implementation("loop", {"recurrent": recurrent_gated_delta_rule}, array="torch")
    impl.forms["backward"] = autograd_backward(recurrent_gated_delta_rule)
    do, dht = cotangents(problem, seed=3, with_dht=with_dht)
    grads = impl.run_backward(problem, do, None if dht is None else dht.astype(np.float64))
    reference = problem_gradients(problem, do, dht)
    assert (grads.grads["dh0"] is None) == (not initial_state)
    for name, ref in reference.items():
        if ref is None:
            continue
        err = np.abs(grads.grads[name] - ref).max() / max(np.abs(ref).max(), 1e-300)
        assert err < 1e-12, (name, err)


def test_autograd_in_float32_keeps_the_input_dtypes():
    problem = _problem(varlen=True, initial_state=True, l2norm=False).astype(np.float32)
    problem = problem.replace(initial_state=problem.initial_state.astype(np.float32))
    impl = Implementation("loop", {"recurrent": recurrent_gated_delta_rule}, array="torch")
    impl.forms["backward"] = autograd_backward(recurrent_gated_delta_rule)
    grads = impl.run_backward(problem, *cotangents(problem, seed=1))
    assert gradient_contract_violations(grads, problem) == []
    assert grads.dtypes["dq"] == "float32" and grads.dtypes["dh0"] == "float32"


def test_a_call_without_tokens_has_zero_gradients():
    problem = _problem(varlen=False, initial_state=True, l2norm=False).astype(np.float32)
    problem = problem.tokens(0, 0, initial_state=problem.initial_state.astype(np.float32))
    impl = Implementation("loop", {"recurrent": recurrent_gated_delta_rule}, array="torch")
    impl.forms["backward"] = autograd_backward(recurrent_gated_delta_rule)
    do, dht = cotangents(problem, seed=2, with_dht=False)
    grads = impl.run_backward(problem, do, dht)
    assert gradient_contract_violations(grads, problem) == []
    assert all(not np.any(x) for x in grads.grads.values())


def test_flashqla_contract_refuses_empty_sequences_and_passes_float32_gates():
    from gdn_verify.implementations.flashqla import training_contract
    from gdn_verify.properties.gradients import with_empty_sequence

    seen = []

    def kernel(q, k, v, g, beta, cu_seqlens=None, **kw):  # FlashQLA 0.1.3's answers
        lengths = [q.shape[1]] if cu_seqlens is None else (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        if min(lengths) == 0:
            raise ValueError(f"invalid sequence lengths: {lengths}")
        seen.append(g.dtype)
        return recurrent_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu_seqlens, **kw)

    impl = Implementation("qla", {"chunk": training_contract(kernel)}, array="torch")
    impl.forms["backward"] = autograd_backward(impl.forms["chunk"])
    empty = _problem(varlen=False, initial_state=False, l2norm=False).tokens(0, 0)
    full = _problem(varlen=True, initial_state=True, l2norm=False).astype(DTYPES["bfloat16"])
    for problem in (empty, with_empty_sequence(full, 1, seed=0)):
        with pytest.raises(NotImplementedError, match="empty sequence"):
            impl.run_backward(problem, *cotangents(problem, seed=0, with_dht=False))
    grads = impl.run_backward(full, *cotangents(full, seed=0))
    assert grads.grads["dq"].shape == full.q.shape
    assert seen and all(str(d) == "torch.float32" for d in seen)
