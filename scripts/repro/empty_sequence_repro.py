"""Direct reproduction: a chunked GDN kernel given a zero-length sequence in ``cu_seqlens``.

Outside the properties: the library's own ``chunk_gated_delta_rule`` on plain torch tensors (FLA's
``fla.ops.gated_delta_rule`` as imported, or vLLM's ops folder loaded by
``gdn_verify.implementations.vllm.load_ops``, nothing else of ours), judged against (1) the same
call with the empty sequence left out, (2) the same library's ``fused_recurrent_gated_delta_rule``
on the same call (an independent kernel; where it runs), and (3) a float64 token loop written here.
H = HV (no GVA needed), K = 128, V = 64 (so the state's layout shows in its shape), float16,
l2norm in the kernel, no initial state; the empty sequence first, between and last.

    PYTHONPATH=<FLA site> python scripts/repro/empty_sequence_repro.py fla
    GDN_VERIFY_VLLM_OPS=<ops folder> python scripts/repro/empty_sequence_repro.py vllm
    PYTHONPATH=<FlashInfer site> python scripts/repro/empty_sequence_repro.py flashinfer  (or flashinfer-cp)

FlashInfer (``flashinfer.gdn_prefill.chunk_gated_delta_rule``): one head size, so K = V = 128, its
own conventions (packed ``[T, H, K]`` tokens, a linear gate ``alpha = exp(g)``, float32 gates, a
k-last state ``[N, HV, V, K]``), no second kernel; before each call a freed block of the final
state's size is filled with 7 (``sentinel``: a state the kernel never wrote shows it); the cases
are run with and without an initial state (an empty sequence's final state is its initial state).
``flashinfer-cp``: the same with ``use_cp=True`` and the longest sequence as ``max_seqlen``.

Prints a line per case and ends with one JSON line per case (``{"case": ...}``).
"""

from __future__ import annotations

import json
import sys

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: only under TRITON_INTERPRET=1
# float16 on the CPU: Triton's interpreter computes on bfloat16's raw bits (jit-kernels.md)
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float16


def loop64(q, k, v, g, beta, cu, scale, h0=None):
    """Float64 gated delta rule per sequence of ``cu`` (l2-normalised q, k) from ``h0`` [N, HV, K, V]
    (zeros when None): (o, final states [N, HV, K, V])."""
    q, k = (torch.nn.functional.normalize(x.double(), dim=-1) for x in (q, k))
    v, g, beta = v.double(), g.double(), beta.double()
    N, HV, K, V = len(cu) - 1, v.shape[2], q.shape[3], v.shape[3]
    o = torch.zeros(v.shape, dtype=torch.float64, device=v.device)
    states = torch.zeros(N, HV, K, V, dtype=torch.float64, device=v.device) if h0 is None else h0.double().clone()
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


def kernels(library: str):
    """(chunk, fused_recurrent, a description, the cu_seqlens dtype the library's layer passes)."""
    if library == "fla":
        import fla
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

        return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule, f"FLA {fla.__version__}", torch.long
    if library in ("flashinfer", "flashinfer-cp"):
        import flashinfer
        from flashinfer.gdn_prefill import chunk_gated_delta_rule as fi_chunk

        def cp(cu_seqlens) -> dict:  # use_cp=True with the longest sequence as the grids' hint
            if library == "flashinfer":
                return {}
            return dict(use_cp=True, max_seqlen=int((cu_seqlens[1:] - cu_seqlens[:-1]).max()))

        def chunk(q, k, v, g, beta, cu_seqlens, initial_state=None, **kw):
            o, s = fi_chunk(
                q=q[0].contiguous(),
                k=k[0].contiguous(),
                v=v[0].contiguous(),
                g=g[0].exp().float(),
                beta=beta[0].float(),
                cu_seqlens=cu_seqlens,
                initial_state=None if initial_state is None else initial_state.transpose(-1, -2).contiguous(),
                **kw,
                **cp(cu_seqlens),
            )
            return o[None], s.transpose(-1, -2)  # k-last [N, HV, V, K] -> [N, HV, K, V]

        return chunk, None, f"FlashInfer {flashinfer.__version__} ({library})", torch.long
    from gdn_verify.implementations.vllm import load_ops

    ops = load_ops()
    return ops.chunk_gated_delta_rule, ops.fused_recurrent_gated_delta_rule, f"vLLM ops at {ops.root}", torch.int32


def k_first(state, K: int, V: int):
    """A final state ``[N, HV, K, V]`` whichever layout the kernel returned (K != V tells them apart)."""
    return state if state.shape[-2:] == (K, V) else state.transpose(-1, -2)


def main() -> None:
    library = sys.argv[1] if len(sys.argv) > 1 else "fla"
    chunk, recurrent, what, index_dtype = kernels(library)
    print(what, "| torch", torch.__version__, "| device", (torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"))
    torch.manual_seed(0)
    H = HV = 4
    K, V = (128, 128) if library.startswith("flashinfer") else (128, 64)
    rows = []
    cases = ([0, 0, 1], [0, 0, 70], [0, 70, 70, 140], [0, 70, 140, 140], [0, 1, 2])
    for cu, with_h0 in [(cu, False) for cu in cases] + [(cu, True) for cu in cases if library.startswith("flashinfer")]:
        T, N = cu[-1], len(cu) - 1
        q, k = (torch.randn(1, T, H, K, device=DEVICE, dtype=DTYPE) for _ in range(2))
        v = torch.randn(1, T, HV, V, device=DEVICE, dtype=DTYPE)
        g = torch.log(torch.rand(1, T, HV, device=DEVICE) * 0.1 + 0.9)
        beta = torch.rand(1, T, HV, device=DEVICE, dtype=DTYPE)
        h0 = torch.randn(N, HV, K, V, device=DEVICE) if with_h0 else None
        kw = dict(scale=K**-0.5, output_final_state=True, use_qk_l2norm_in_kernel=True)
        c = torch.tensor(cu, dtype=index_dtype, device=DEVICE)
        torch.full((N, HV, K, V), 7.0, device=DEVICE).zero_().fill_(7.0)  # freed: the next block of this size
        try:
            o_c, s_c = chunk(
                q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=c, **kw, **({"initial_state": h0} if with_h0 else {})
            )
        except Exception as exc:  # noqa: BLE001 - a refusal (CP's heuristics) is a row of its own
            rows.append(dict(case=cu, initial_state=with_h0, library=what, error=f"{type(exc).__name__}: {exc}"[:300]))
            print(f"cu_seqlens={cu}{' with h0' if with_h0 else ''}: {rows[-1]['error']}")
            continue
        o_r, s_r = loop64(q, k, v, g, beta, cu, K**-0.5, h0)
        keep = [n for n in range(N) if cu[n + 1] > cu[n]]  # the non-empty sequences
        c2 = torch.tensor([0] + [cu[n + 1] for n in keep], dtype=index_dtype, device=DEVICE)
        h0_2 = {"initial_state": h0[keep].contiguous()} if with_h0 else {}
        o_2, s_2 = chunk(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=c2, **kw, **h0_2)
        second: float | str = "no second kernel"
        if recurrent is not None:
            try:
                o_f, _ = recurrent(q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=c, **kw)
                second = float((o_f.double() - o_r).abs().max())
            except Exception as exc:  # noqa: BLE001 - report why the second path did not run
                second = f"{type(exc).__name__}: {str(exc).splitlines()[-1][:160]}"
        err = lambda a, b: float((a.double() - b.double()).abs().max())  # noqa: E731
        S = k_first(s_c, K, V)
        row = dict(
            case=cu,
            initial_state=with_h0,
            library=what,
            finite=bool(o_c.isfinite().all()) and bool(s_c.isfinite().all()),
            o_err=err(o_c, o_r),
            o_err_without_empty=err(o_2, o_r),
            o_err_recurrent=second,
            o_scale=float(o_r.abs().max()),
            state_err=[err(S[n], s_r[n]) for n in range(N)],
            state_sentinel=[float((S[n] == 7.0).double().mean()) for n in range(N)],
            state_err_without_empty=[err(k_first(s_2, K, V)[i], s_r[n]) for i, n in enumerate(keep)],
        )
        rows.append(row)
        print(
            f"cu_seqlens={cu}{' with h0' if with_h0 else ''}: chunk finite {row['finite']}; max|o - o64| "
            f"{row['o_err']:.3g} (without the empty sequence {row['o_err_without_empty']:.3g}, second {second}; "
            f"max|o64| {row['o_scale']:.3g}); max|S - S64| per sequence "
            + ", ".join(f"{e:.3g}" for e in row["state_err"])
            + "; share of 7s per sequence "
            + ", ".join(f"{e:.3g}" for e in row["state_sentinel"])
        )
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
