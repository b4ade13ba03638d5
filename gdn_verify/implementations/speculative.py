"""The speculative-decoding form (vLLM-style state slots): its NumPy reference and a planted bug.

A plug-in in this convention is called as::

    fn(q, k, v, g, beta, state_pool, cu_seqlens, ssm_state_indices, num_accepted_tokens,
       scale=None, use_qk_l2norm_in_kernel=False) -> o

- ``q, k`` ``[1, T, H, K]``, ``v`` ``[1, T, HV, V]``, ``g, beta`` ``[1, T, HV]`` (native meaning),
  tokens of ``N`` requests packed by ``cu_seqlens`` ``[N + 1]`` (int64);
- ``state_pool`` ``[slots, HV, K, V]`` float32, updated in place;
- ``ssm_state_indices`` ``[N, C]`` int32 (``C`` = speculative tokens + 1), ``num_accepted_tokens``
  ``[N]`` int32 in ``1..C``.

Request ``n`` starts from slot ``ssm_state_indices[n, num_accepted_tokens[n] - 1]`` (the state
after the last accepted token of the previous step) and, for each of its ``L_n <= C`` tokens,
writes the state after token ``t`` to slot ``ssm_state_indices[n, t]``. A request whose start
slot is negative is padding: its outputs are zero and it reads and writes no slot. Columns
``t >= L_n`` are not written. ``o`` is ``[1, T, HV, V]`` in the input dtype.

Other kernels' padding and slot rules (vLLM's null slot 0, FlashInfer's negative read index and
k-last pool) are a :class:`gdn_verify.core.conventions.SpecRules` in
``Implementation.extra["spec_rules"]``; :func:`rules_reference` is the NumPy reference of any
rules, and a form that takes ``output=`` writes into that buffer.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gdn_verify.core.conventions import NATIVE_SPEC, SpecRules
from gdn_verify.implementations import numpy_impl


def _spec_numpy(
    q,
    k,
    v,
    g,
    beta,
    state_pool,
    cu_seqlens,
    ssm_state_indices,
    num_accepted_tokens,
    scale=None,
    use_qk_l2norm_in_kernel=False,
    *,
    read_column: Callable | None = None,
    rules: SpecRules = NATIVE_SPEC,
    output=None,
):
    cu = np.asarray(cu_seqlens, np.int64)
    indices = np.asarray(ssm_state_indices)
    accepted = np.asarray(num_accepted_tokens)
    o = np.zeros(np.shape(v), np.asarray(v).dtype) if output is None else output
    layout = (lambda s: s.swapaxes(-1, -2)) if rules.pool_v_first else (lambda s: s)
    for n in range(len(cu) - 1):
        column = accepted[n] - 1 if read_column is None else read_column(n, accepted[n])
        slot = indices[n, column]
        if rules.is_padding_slot(int(slot)):
            if rules.padding_output == "zeros":
                o[:, cu[n] : cu[n + 1]] = 0
            continue  # padding request
        state = layout(state_pool[slot])[None].astype(np.float32)
        for t in range(int(cu[n]), int(cu[n + 1])):
            token = {name: x[:, t : t + 1] for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta))}
            o_t, state = numpy_impl.recurrent_gated_delta_rule(
                **token,
                scale=scale,
                initial_state=state,
                output_final_state=True,
                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
            )
            o[:, t] = o_t[:, 0]
            if rules.stores(int(indices[n, t - cu[n]])):
                state_pool[indices[n, t - cu[n]]] = layout(state[0])
    return o


def spec_reads_first_slot(
    q,
    k,
    v,
    g,
    beta,
    state_pool,
    cu_seqlens,
    ssm_state_indices,
    num_accepted_tokens,
    scale=None,
    use_qk_l2norm_in_kernel=False,
) -> np.ndarray:
    """Planted bug: every request starts from ``ssm_state_indices[n, 0]``, ignoring the accepted count."""
    return _spec_numpy(
        q,
        k,
        v,
        g,
        beta,
        state_pool,
        cu_seqlens,
        ssm_state_indices,
        num_accepted_tokens,
        scale,
        use_qk_l2norm_in_kernel,
        read_column=lambda n, accepted: 0,
    )


def check_accepted(accepted: np.ndarray, width: int) -> None:
    """Raise ``ValueError`` unless every accepted count lies in ``1..width`` (``width``: the
    ``ssm_state_indices`` columns), the form's domain: request ``n`` reads column ``accepted[n] - 1``."""
    if np.any((accepted < 1) | (accepted > width)):
        raise ValueError(f"num_accepted_tokens: must lie in 1..{width}, got {accepted.tolist()}")


def rules_reference(rules: SpecRules) -> Callable:
    """The NumPy reference of the speculative-decoding form under ``rules`` (takes ``output=``)."""

    def reference(
        q,
        k,
        v,
        g,
        beta,
        state_pool,
        cu_seqlens,
        ssm_state_indices,
        num_accepted_tokens,
        scale=None,
        use_qk_l2norm_in_kernel=False,
        output=None,
    ):
        check_accepted(np.asarray(num_accepted_tokens), np.shape(ssm_state_indices)[1])
        return _spec_numpy(
            q,
            k,
            v,
            g,
            beta,
            state_pool,
            cu_seqlens,
            ssm_state_indices,
            num_accepted_tokens,
            scale,
            use_qk_l2norm_in_kernel,
            rules=rules,
            output=output,
        )

    return reference


# The native rules (negative start slot = padding, zero outputs); ``output`` ``[1, T, HV, V]``,
# when given, is written and returned. ``num_accepted_tokens`` outside ``1..C`` raises ValueError.
spec_reference = rules_reference(NATIVE_SPEC)
