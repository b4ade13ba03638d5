// The first kernel of both fused paths (chunk_fused.cu on mma.sync, chunk_wgmma.cu on sm_90a
// wgmma): gdn_fused_prep, one CTA per (chunk, value head), fully parallel. The algebra of the fused
// path is in chunk_common.cuh. Compiled on its own (plain sm_90 NVRTC), so that neither state
// kernel's path builds the other state kernel to get it.

#include "chunk_common.cuh"

namespace gdn_fused {

// Store the pair (x0, x1) at hi[o], lo[o] (bf16 pairs, 4-byte aligned) as x = hi + lo.
__device__ __forceinline__ void store_split(__nv_bfloat16* hi, __nv_bfloat16* lo, int o, float x0, float x1) {
    unsigned h, l;
    gdn_chunk::split_pair<true>(x0, x1, h, l);
    *reinterpret_cast<unsigned*>(hi + o) = h;
    *reinterpret_cast<unsigned*>(lo + o) = l;
}

// G[i] = g[0] + ... + g[i] in fp64, by one warp (two values a lane, a shuffle scan). The decays
// Gamma[i][j] = exp(G[i] - G[j]) then come from a difference of fp64 prefix sums: as accurate as
// gdn_chunk::gate_sums' fp32 segment sums (never a ratio of exps) without their C x C table.
__device__ __forceinline__ void gate_prefix_warp(const float* g, double* G) {
    const int lane = threadIdx.x & 31;
    const double a = g[2 * lane], pair = a + g[2 * lane + 1];
    double s = pair;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const double t = __shfl_up_sync(0xffffffffu, s, o);
        if (lane >= o) s += t;
    }
    double before = __shfl_up_sync(0xffffffffu, s, 1);
    if (lane == 0) before = 0.0;
    G[2 * lane] = before + a;
    G[2 * lane + 1] = s;
}

// T = (I + A)^-1 for strictly lower-triangular A [C][C] (row stride C + 1) into t (same stride),
// fp32 throughout like gdn_chunk::unit_lower_inverse, restructured for fewer shared-memory loads:
// each 16 x 16 diagonal block by forward substitution with the column in registers (thread j of
// a block: col = e_j, then col[i] = -sum_{m < i} A[i][m] col[m] for i > j), then the doubling
// [[T11, 0], [A21, T22]] -> [[T11, 0], [-T22 A21 T11, T22]] with 2 x 2 outputs per thread.
// tmp holds C * C / 4 floats; t need not be zero on entry. Ends with a barrier.
template <int Cn>
__device__ __forceinline__ void unit_lower_inverse_fast(const float* a, float* t, float* tmp, int nthreads) {
    constexpr int S = Cn + 1;
    for (int e = threadIdx.x; e < Cn * S; e += nthreads) t[e] = 0.f;
    __syncthreads();
    if (threadIdx.x < Cn) {
        const int o = (threadIdx.x / 16) * 16, j = threadIdx.x % 16;
        float col[16];
#pragma unroll
        for (int m = 0; m < 16; ++m) col[m] = m == j ? 1.f : 0.f;
#pragma unroll
        for (int i = 1; i < 16; ++i) {
            float acc = 0.f;
#pragma unroll
            for (int m = 0; m < i; ++m) acc = fmaf(a[(o + i) * S + o + m], col[m], acc);
            if (i > j) col[i] = -acc;
        }
#pragma unroll
        for (int m = 0; m < 16; ++m) t[(o + m) * S + o + j] = col[m];
    }
    __syncthreads();
#pragma unroll
    for (int s = 16; s < Cn; s *= 2) {
        const int quads = (Cn / (2 * s)) * (s / 2) * (s / 2);  // 2 x 2 output blocks of all pairs
        for (int e = threadIdx.x; e < quads; e += nthreads) {
            const int p = e / ((s / 2) * (s / 2)), r = 2 * ((e / (s / 2)) % (s / 2)), c = 2 * (e % (s / 2));
            const int c0 = 2 * p * s, r0 = c0 + s;
            float x00 = 0.f, x01 = 0.f, x10 = 0.f, x11 = 0.f;
            for (int m = 0; m < s; ++m) {
                const float a0 = a[(r0 + r) * S + c0 + m], a1 = a[(r0 + r + 1) * S + c0 + m];
                const float t0 = t[(c0 + m) * S + c0 + c], t1 = t[(c0 + m) * S + c0 + c + 1];
                x00 = fmaf(a0, t0, x00), x01 = fmaf(a0, t1, x01), x10 = fmaf(a1, t0, x10), x11 = fmaf(a1, t1, x11);
            }
            float* y = tmp + p * s * s;  // (A21 T11)
            y[r * s + c] = x00, y[r * s + c + 1] = x01, y[(r + 1) * s + c] = x10, y[(r + 1) * s + c + 1] = x11;
        }
        __syncthreads();
        for (int e = threadIdx.x; e < quads; e += nthreads) {
            const int p = e / ((s / 2) * (s / 2)), r = 2 * ((e / (s / 2)) % (s / 2)), c = 2 * (e % (s / 2));
            const int c0 = 2 * p * s, r0 = c0 + s;
            const float* y = tmp + p * s * s;
            float x00 = 0.f, x01 = 0.f, x10 = 0.f, x11 = 0.f;
            for (int m = 0; m < s; ++m) {
                const float a0 = t[(r0 + r) * S + r0 + m], a1 = t[(r0 + r + 1) * S + r0 + m];
                const float t0 = y[m * s + c], t1 = y[m * s + c + 1];
                x00 = fmaf(a0, t0, x00), x01 = fmaf(a0, t1, x01), x10 = fmaf(a1, t0, x10), x11 = fmaf(a1, t1, x11);
            }
            t[(r0 + r) * S + c0 + c] = -x00, t[(r0 + r) * S + c0 + c + 1] = -x01;
            t[(r0 + r + 1) * S + c0 + c] = -x10, t[(r0 + r + 1) * S + c0 + c + 1] = -x11;
        }
        __syncthreads();
    }
}

}  // namespace gdn_fused

// ---------------------------------------------------------------------------------------------
// Fused kernel 1: prep. Grid (num_chunks, HV), 256 threads.
// Shared memory: G [C] fp64; g, beta, rk, rq [C] fp32; A [C][C + 1] fp32; then k and q rows
// [C][K + 8] bf16, whose space T [C][C + 1] and tmp [C * C / 4] (fp32) take over once the products
// are done (about 53 KiB at K = 128: four CTAs per SM).
// Output per (chunk, hv): mats [4][C][C] bf16 (T'hi, T'lo, P'hi, P'lo), vecs [4][C] fp32 (a, c, d, G).
__global__ void __launch_bounds__(gdn_chunk::kThreads)
    gdn_fused_prep(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                   const void* __restrict__ g, const void* __restrict__ beta, int gate_flags,
                   const float* __restrict__ A_log, const float* __restrict__ dt_bias,
                   const long long* __restrict__ chunk_start, const int* __restrict__ chunk_len, int H, int HV,
                   int K, int l2norm, float scale, __nv_bfloat16* __restrict__ mats, float* __restrict__ vecs) {
    using namespace gdn_fused;
    using gdn_chunk::kThreads;
    constexpr int S = C + 1;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int chunk = blockIdx.x, hv = blockIdx.y, hk = hv / (HV / H);
    const long long t0 = chunk_start[chunk];
    const int len = chunk_len[chunk];
    const int KP = K + kPad;
    double* G = reinterpret_cast<double*>(smem_raw);
    float* gs = reinterpret_cast<float*>(G + C);
    float* bs = gs + C;
    float* rk = bs + C;
    float* rq = rk + C;
    float* am = rq + C;
    __nv_bfloat16* ks = reinterpret_cast<__nv_bfloat16*>(am + C * S);  // 16-byte aligned: 18176 bytes in
    __nv_bfloat16* qs = ks + C * KP;
    float* tm = reinterpret_cast<float*>(ks);  // T and tmp over k and q, once the products are done
    float* tmp = tm + C * S;
    const size_t base = static_cast<size_t>(chunk) * HV + hv;

    const size_t row0 = static_cast<size_t>(t0) * H * K + static_cast<size_t>(hk) * K;
    copy_rows(ks, KP, k + row0, static_cast<size_t>(H) * K, C, len, K, kThreads);
    copy_rows(qs, KP, q + row0, static_cast<size_t>(H) * K, C, len, K, kThreads);
    cp_async_commit();
    for (int i = threadIdx.x; i < C; i += kThreads) {
        const size_t idx = static_cast<size_t>(t0 + i) * HV + hv;
        gs[i] = i < len ? gdn_chunk::native_gate<__nv_bfloat16>(g, idx, gate_flags, A_log, dt_bias, hv) : 0.f;
        bs[i] = i < len ? gdn_chunk::native_beta<__nv_bfloat16>(beta, idx, gate_flags) : 0.f;
    }
    cp_async_wait<0>();
    __syncthreads();

    // l2norm row scales from the bf16 values (2 * C rows, one thread each); 1 without l2norm.
    if (threadIdx.x < 2 * C) {
        const int r = threadIdx.x % C;
        const __nv_bfloat16* x = (threadIdx.x < C ? ks : qs) + r * KP;
        float scale_r = 1.f;
        if (l2norm) {
            float ss = 0.f;
            for (int d = 0; d < K; ++d) {
                const float v = __bfloat162float(x[d]);
                ss = fmaf(v, v, ss);
            }
            scale_r = 1.f / sqrtf(ss + gdn_chunk::kL2NormEps);
        }
        (threadIdx.x < C ? rk : rq)[r] = scale_r;
    }
    if (threadIdx.x / 32 == 4) gate_prefix_warp(gs, G);  // warps 0-3 take the l2norm rows
    __syncthreads();

    // K K^T (for A) and Q K^T (for P'), both exact bf16 products: warp w takes rows 16 (w % 4)
    // and columns 32 (w / 4) .. + 31 of each. The decays at this thread's 16 positions serve both.
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
    const int m0 = 16 * (warp & 3), n0 = 32 * (warp >> 2);
    float gam[4][2][2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int i = m0 + gr + 8 * h;
        const double gi = G[i];
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int j = n0 + 8 * nt + 2 * tq + e;
                gam[nt][h][e] = j <= i ? expf(static_cast<float>(gi - G[j])) : 0.f;
            }
    }
    __nv_bfloat16* out = mats + base * kMats * C * C;
    for (int which = 0; which < 2; ++which) {
        const __nv_bfloat16* am_src = which == 0 ? ks : qs;
        float acc[4][4] = {};
        for (int k0 = 0; k0 < K; k0 += 16) {
            unsigned a[4], b0[4], b1[4];
            ldsm_x4(a, a_frag(am_src, KP, m0, k0));
            ldsm_x4(b0, bt_frag(ks, KP, k0, n0));
            ldsm_x4(b1, bt_frag(ks, KP, k0, n0 + 16));
            const unsigned x0[2] = {b0[0], b0[1]}, x1[2] = {b0[2], b0[3]};
            const unsigned x2[2] = {b1[0], b1[1]}, x3[2] = {b1[2], b1[3]};
            mma_bf16_16816(acc[0], a, x0);
            mma_bf16_16816(acc[1], a, x1);
            mma_bf16_16816(acc[2], a, x2);
            mma_bf16_16816(acc[3], a, x3);
        }
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int i = m0 + gr + 8 * h, j = n0 + 8 * nt + 2 * tq;
                float x[2];
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int jj = j + e;
                    const float prod = acc[nt][2 * h + e];
                    if (which == 0)
                        x[e] = i > jj ? bs[i] * rk[i] * rk[jj] * prod * gam[nt][h][e] : 0.f;
                    else
                        x[e] = jj <= i ? scale * rq[i] * rk[jj] * prod * gam[nt][h][e] : 0.f;
                }
                if (which == 0) {
                    am[i * S + j] = x[0];
                    am[i * S + j + 1] = x[1];
                } else {
                    store_split(out + 2 * C * C, out + 3 * C * C, i * C + j, x[0], x[1]);
                }
            }
    }
    __syncthreads();

    unit_lower_inverse_fast<C>(am, tm, tmp, kThreads);  // ends with a barrier

    // T' = T diag(beta), split; the row vectors.
    for (int e = threadIdx.x; e < C * C / 2; e += kThreads) {
        const int i = e / (C / 2), j = 2 * (e % (C / 2));
        store_split(out, out + C * C, i * C + j, tm[i * S + j] * bs[j], tm[i * S + j + 1] * bs[j + 1]);
    }
    float* vout = vecs + base * kVecs * C;
    for (int i = threadIdx.x; i < C; i += kThreads) {
        const float Gi = static_cast<float>(G[i]), eg = expf(Gi);
        vout[i] = eg * rk[i];
        vout[C + i] = expf(static_cast<float>(G[C - 1] - G[i])) * rk[i];
        vout[2 * C + i] = scale * eg * rq[i];
        vout[3 * C + i] = Gi;
    }
}
