"""Direct reproduction: vLLM 0.33's chunk_gated_delta_rule with a zero-length sequence in cu_seqlens.

Outside the properties: vLLM's own function on plain torch tensors (its files loaded by
``gdn_verify.implementations.vllm.load_ops``, nothing else of ours), judged against (1) the same
sequences without the empty one, (2) FLA 0.6's chunk_gated_delta_rule on the same call, and (3) a
float64 token loop written here. Also prints vLLM's and FLA's ``prepare_chunk_indices`` for the
same ``cu_seqlens``. Usage: ``GDN_VERIFY_VLLM_OPS=.whl/vllm_fla python scripts/repro/vllm_empty_sequence_repro.py``.
"""

from __future__ import annotations

import sys

import torch

from gdn_verify.implementations.vllm import load_ops


def loop64(q, k, v, g, beta, cu, scale):
    """Float64 gated delta rule per sequence of ``cu`` (l2-normalised q, k): (o, final states [N, HV, K, V])."""
    q, k = (torch.nn.functional.normalize(x.double(), dim=-1) for x in (q, k))
    v, g, beta = v.double(), g.double(), beta.double()
    N, HV, K, V = len(cu) - 1, v.shape[2], q.shape[3], v.shape[3]
    o = torch.zeros(v.shape, dtype=torch.float64, device=v.device)
    states = torch.zeros(N, HV, K, V, dtype=torch.float64, device=v.device)
    group = HV // q.shape[2]
    for n in range(N):
        S = states[n]
        for t in range(int(cu[n]), int(cu[n + 1])):
            qt, kt = q[0, t].repeat_interleave(group, 0), k[0, t].repeat_interleave(group, 0)  # [HV, K]
            S = S * torch.exp(g[0, t])[:, None, None]
            u = beta[0, t, :, None] * (v[0, t] - torch.einsum("hk,hkv->hv", kt, S))
            S = S + kt[:, :, None] * u[:, None, :]
            o[0, t] = scale * torch.einsum("hk,hkv->hv", qt, S)
        states[n] = S
    return o, states


def main() -> None:
    ops = load_ops()
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk
    from fla.ops.utils.index import prepare_chunk_indices as fla_indices

    vllm_index = sys.modules[ops.chunk_gated_delta_rule.__module__.rsplit(".", 1)[0] + ".index"]
    print("torch", torch.__version__, "device", torch.cuda.get_device_name())
    for cu in ([0, 0, 1], [0, 0, 70], [0, 70, 70, 140], [0, 1]):
        c = torch.tensor(cu, dtype=torch.int32, device="cuda")
        print(
            f"cu_seqlens={cu}: vLLM chunk indices (sequence, chunk)",
            vllm_index.prepare_chunk_indices(c, 64).tolist(),
            "| FLA",
            fla_indices(c.long(), 64).tolist(),
        )
    torch.manual_seed(0)
    H, HV, K, V = 2, 4, 128, 128
    for cu in ([0, 0, 1], [0, 0, 70], [0, 70, 70, 140]):
        T = cu[-1]
        q, k = (torch.randn(1, T, H, K, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        v = torch.randn(1, T, HV, V, device="cuda", dtype=torch.bfloat16)
        g = torch.log(torch.rand(1, T, HV, device="cuda") * 0.1 + 0.9)
        beta = torch.rand(1, T, HV, device="cuda", dtype=torch.bfloat16)
        h0 = torch.zeros(len(cu) - 1, HV, K, V, device="cuda")
        c = torch.tensor(cu, dtype=torch.int32, device="cuda")
        kw = dict(scale=K**-0.5, output_final_state=True, use_qk_l2norm_in_kernel=True)
        # vLLM's state is [N, HV, V, K] (k-last); FLA's [N, HV, K, V]
        o_v, s_v = ops.chunk_gated_delta_rule(
            q, k, v, g, beta, initial_state=h0.transpose(-1, -2).contiguous(), cu_seqlens=c, **kw
        )
        o_f, s_f = fla_chunk(q, k, v, g, beta, initial_state=h0, cu_seqlens=c.long(), **kw)
        o_r, s_r = loop64(q, k, v, g, beta, cu, K**-0.5)
        keep = [n for n in range(len(cu) - 1) if cu[n + 1] > cu[n]]  # the non-empty sequences
        c2 = torch.tensor([0] + [cu[n + 1] for n in keep], dtype=torch.int32, device="cuda")
        o_2, s_2 = ops.chunk_gated_delta_rule(
            q, k, v, g, beta, initial_state=h0[keep].transpose(-1, -2).contiguous(), cu_seqlens=c2, **kw
        )
        err = lambda a, b: float((a.double() - b.double()).abs().max())  # noqa: E731
        print(f"cu_seqlens={cu} (T={T}, H={H}, HV={HV}, K=V={K}, bfloat16, l2norm):")
        print(
            f"  max|o - o64|: vLLM {err(o_v, o_r):.3g}, FLA {err(o_f, o_r):.3g}, "
            f"vLLM without the empty sequence {err(o_2, o_r):.3g}"
        )
        print(
            f"  o finite: vLLM {bool(o_v.isfinite().all())}; max|o| vLLM {float(o_v.float().abs().max()):.3g}, "
            f"oracle {float(o_r.abs().max()):.3g}"
        )
        for n in range(len(cu) - 1):
            sv = s_v[n].transpose(-1, -2)
            print(
                f"  final state of sequence {n} (length {cu[n + 1] - cu[n]}): max|S - S64| vLLM {err(sv, s_r[n]):.3g}, "
                f"FLA {err(s_f[n], s_r[n]):.3g}"
                + (f", vLLM alone {err(s_2[keep.index(n)].transpose(-1, -2), s_r[n]):.3g}" if n in keep else "")
            )


if __name__ == "__main__":
    main()
