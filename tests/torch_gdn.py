"""A differentiable torch token loop in FLA's convention (CPU or CUDA), for the autograd path.

Written for tests of ``implementations.autograd``: autograd of this loop is an independent
backward (torch's, not our adjoint), in any dtype the arithmetic is done in.
"""

from __future__ import annotations

import torch


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def recurrent_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    scale=None,
    initial_state=None,
    output_final_state=False,
    use_qk_l2norm_in_kernel=False,
    cu_seqlens=None,
):
    """``(o [B, T, HV, V] in v's dtype, final_state float32 or None)``, computed in float32 (float64
    inputs in float64)."""
    work = torch.float64 if v.dtype == torch.float64 else torch.float32
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    scale = K**-0.5 if scale is None else scale
    q, k = q.to(work), k.to(work)
    if use_qk_l2norm_in_kernel:
        q, k = _l2norm(q), _l2norm(k)
    rep = HV // H
    q, k = q.repeat_interleave(rep, dim=2), k.repeat_interleave(rep, dim=2)
    v, g, beta = v.to(work), g.to(work), beta.to(work)
    if cu_seqlens is None:
        bounds = [(b, 0, T) for b in range(B)]
    else:
        cu = [int(x) for x in cu_seqlens]
        bounds = [(0, cu[n], cu[n + 1]) for n in range(len(cu) - 1)]
    outputs = torch.zeros((B, T, HV, V), dtype=work, device=v.device)
    finals = []
    for n, (b, start, end) in enumerate(bounds):
        S = torch.zeros((HV, K, V), dtype=work, device=v.device) if initial_state is None else initial_state[n].to(work)
        rows = []
        for t in range(start, end):
            S = S * torch.exp(g[b, t])[:, None, None]
            r = v[b, t] - torch.einsum("hk,hkv->hv", k[b, t], S)
            S = S + k[b, t][:, :, None] * (beta[b, t][:, None] * r)[:, None, :]
            rows.append(scale * torch.einsum("hk,hkv->hv", q[b, t], S))
        if rows:
            outputs = outputs.index_put((torch.tensor([b]), torch.arange(start, end)), torch.stack(rows))
        finals.append(S)
    final = torch.stack(finals).to(torch.float32 if work == torch.float32 else work) if output_final_state else None
    return outputs.to(v.dtype), final
