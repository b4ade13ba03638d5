"""Arbitrary-precision (mpmath) gated delta rule: the oracle's own oracle, for tiny cases."""

from __future__ import annotations

import mpmath
import numpy as np


def mp_gated_delta_rule(
    q, k, v, g, beta, scale=None, initial_state=None, use_qk_l2norm_in_kernel=False, cu_seqlens=None, dps: int = 50
):
    """Token loop in ``dps`` decimal digits; native convention, k-first state. Returns float64 arrays."""
    with mpmath.workdps(dps):
        B, T, H, K = q.shape
        HV, V = v.shape[2], v.shape[3]
        scale = mpmath.mpf(K) ** mpmath.mpf(-0.5) if scale is None else mpmath.mpf(scale)
        bounds = list(cu_seqlens) if cu_seqlens is not None else [b * T for b in range(B + 1)]
        N = len(bounds) - 1
        flat = lambda x: np.asarray(x, np.float64).reshape((B * T,) + x.shape[2:])  # noqa: E731
        qf, kf, vf, gf, bf = flat(q), flat(k), flat(v), flat(g), flat(beta)
        o = np.zeros((B * T, HV, V))
        final = np.zeros((N, HV, K, V))

        def vec(x):
            x = [mpmath.mpf(float(e)) for e in x]
            if use_qk_l2norm_in_kernel:
                norm = mpmath.sqrt(mpmath.fsum(e * e for e in x) + mpmath.mpf("1e-6"))
                x = [e / norm for e in x]
            return x

        for n in range(N):
            for h in range(HV):
                qk_head = h // (HV // H)
                S = [[mpmath.mpf(0)] * V for _ in range(K)]
                if initial_state is not None:
                    S = [[mpmath.mpf(float(initial_state[n, h, i, j])) for j in range(V)] for i in range(K)]
                for t in range(bounds[n], bounds[n + 1]):
                    qt, kt = vec(qf[t, qk_head]), vec(kf[t, qk_head])
                    a = mpmath.exp(mpmath.mpf(float(gf[t, h])))
                    S = [[a * e for e in row] for row in S]
                    pred = [mpmath.fsum(kt[i] * S[i][j] for i in range(K)) for j in range(V)]
                    u = [mpmath.mpf(float(bf[t, h])) * (mpmath.mpf(float(vf[t, h, j])) - pred[j]) for j in range(V)]
                    S = [[S[i][j] + kt[i] * u[j] for j in range(V)] for i in range(K)]
                    for j in range(V):
                        o[t, h, j] = float(scale * mpmath.fsum(qt[i] * S[i][j] for i in range(K)))
                final[n, h] = [[float(e) for e in row] for row in S]
        return o.reshape(B, T, HV, V), final
