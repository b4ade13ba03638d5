// Chunked (WY/UT) Gated DeltaNet forward with fp32 accumulation throughout. Template flag TC picks
// the arithmetic: false = plain FP32 FMAs; true = tensor cores (mma.sync bf16 m16n8k16, fp32
// operands split into bf16 hi + lo, three MMAs per product, about 2^-16 relative error; see
// cta_product) plus a cp.async pipeline in the state kernel. Cost model: CHUNK_NOTES.md.
//
// Three kernels, run in order by cupy_kernels/chunk.py (same algebra as
// gdn_verify.core.reference.chunk_core; shapes per (chunk, value head), C = chunk size):
//
//   gdn_chunk_intra   one CTA per (chunk, value head):
//                     G = cumsum(g), Gamma_ij = exp(g_{j+1} + ... + g_i) (a segment sum, never a
//                     ratio of exps), A = tril(diag(beta) (K K^T * Gamma), -1), T = (I + A)^-1 in
//                     shared memory, W = T diag(beta exp(G)) K [C, K], U = T diag(beta) V [C, V],
//                     Kd = K * exp(G_last - G) [C, K], gates = (G, G_last - G) [2, C].
//   gdn_chunk_state   one CTA per (sequence, value head, 16-column V tile), sequential over the
//                     sequence's chunks: v_new = U - W S, S <- exp(G_last) S + Kd^T v_new.
//                     Writes the state entering each chunk, v_new and the final state.
//   gdn_chunk_output  one CTA per (chunk, value head):
//                     O = scale (exp(G) * (Q S) + ((Q K^T) * Gamma, causal incl. diagonal) v_new).
//
// Scratch (W, U, Kd, gates, states, v_new) is fp32 and indexed by a global chunk id: chunks never
// straddle sequences, so a ragged last chunk is masked (rows past the end read as zero, g = 0,
// beta = 0) and no kernel touches another sequence's rows. Masked rows give zero rows in W, U,
// Kd and v_new, so they leave the state exactly unchanged.
//
// Input conventions (element types, gate flags): chunk_common.cuh. Head sizes K, V in 1..256 (any
// value: loads are guarded and shared-memory tiles zero padded). All CTAs have 256 threads;
// block-level products use a 16 x 16 thread grid where thread (ty, tx) owns rows ty + 16 r and
// columns tx + 16 c of the result.
//
// Compiled at run time by cupy.RawModule (NVRTC, name_expressions: only the three instantiations a
// call launches) and, for CI, standalone by nvcc, which instantiates every variant below so that
// all of them are checked.

#include "chunk_common.cuh"

namespace gdn_chunk {

constexpr int kGrid = 16;        // thread grid is kGrid x kGrid
constexpr int kColsPerPass = 128;  // columns per pass of the W / U products (8 per thread)

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Odd row stride: threads reading the same column of consecutive rows hit distinct banks.
__device__ __forceinline__ int odd_stride(int n) { return n | 1; }

// dst[r][d] = src[r * src_stride + d] for r < len, d < cols; rows len..C-1 are zero.
// Consecutive threads take consecutive d, so global loads are coalesced along a row.
template <typename T, int C>
__device__ __forceinline__ void load_rows(float* dst, int dst_stride, const T* __restrict__ src,
                                          size_t src_stride, int len, int cols) {
    for (int e = threadIdx.x; e < C * cols; e += kThreads) {
        const int r = e / cols, d = e - r * cols;
        dst[r * dst_stride + d] = r < len ? to_float(src[r * src_stride + d]) : 0.f;
    }
}

// x[r] /= sqrt(sum(x[r]^2) + 1e-6) for the C rows (all-zero rows stay zero). Every thread of the
// CTA must call it; a row's 256 / C threads sit in one warp and reduce by shuffles.
template <int C>
__device__ __forceinline__ void l2norm_rows(float* x, int stride, int cols) {
    constexpr int kPerRow = kThreads / C;
    const int r = threadIdx.x / kPerRow, part = threadIdx.x % kPerRow;
    float ss = 0.f;
    for (int d = part; d < cols; d += kPerRow) {
        const float v = x[r * stride + d];
        ss = fmaf(v, v, ss);
    }
#pragma unroll
    for (int off = kPerRow / 2; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    const float norm = sqrtf(ss + kL2NormEps);
    for (int d = part; d < cols; d += kPerRow) x[r * stride + d] /= norm;
}

// Gamma[i][j] = exp(g[j+1] + ... + g[i]) for i >= j (1 on the diagonal; the upper triangle is
// not written). Thread j sums its column top-down, the order of
// gdn_verify.core.reference.segment_sums, so a saturated gate (g = -1e4) only zeroes the segments
// that contain it. Optionally thread C writes G = cumsum(g) and thread j writes
// D_last[j] = g[j+1] + ... + g[C-1] (masked rows have g = 0).
template <int C>
__device__ __forceinline__ void gate_sums(const float* g, float* gamma, int stride, float* G, float* d_last) {
    const int j = threadIdx.x;
    if (j < C) {
        float s = 0.f;
        gamma[j * stride + j] = 1.f;
        for (int i = j + 1; i < C; ++i) {
            s += g[i];
            gamma[i * stride + j] = expf(s);
        }
        if (d_last != nullptr) d_last[j] = s;
    } else if (j == C && G != nullptr) {
        float s = 0.f;
        for (int i = 0; i < C; ++i) {
            s += g[i];
            G[i] = s;
        }
    }
}

// acc[r][c] += sum_d a[(ty + 16 r) * as + d] * b[(tx + 16 c) * bs + d]   (A B^T, d < depth)
template <int RM, int RN>
__device__ __forceinline__ void tile_nt(float (&acc)[RM][RN], const float* a, int as, const float* b, int bs,
                                        int depth) {
    const int ty = threadIdx.x / kGrid, tx = threadIdx.x % kGrid;
#pragma unroll 4
    for (int d = 0; d < depth; ++d) {
        float av[RM], bv[RN];
#pragma unroll
        for (int r = 0; r < RM; ++r) av[r] = a[(ty + kGrid * r) * as + d];
#pragma unroll
        for (int c = 0; c < RN; ++c) bv[c] = b[(tx + kGrid * c) * bs + d];
#pragma unroll
        for (int r = 0; r < RM; ++r)
#pragma unroll
            for (int c = 0; c < RN; ++c) acc[r][c] = fmaf(av[r], bv[c], acc[r][c]);
    }
}

// acc[r][c] += sum_m a[(ty + 16 r) * as + m] * b[m * bs + col0 + tx + 16 c]   (A B, m < depth);
// columns col0 + tx + 16 c >= ncols read as zero (never past the valid width of b).
template <int RM, int RN>
__device__ __forceinline__ void tile_nn(float (&acc)[RM][RN], const float* a, int as, const float* b, int bs,
                                        int depth, int col0, int ncols) {
    const int ty = threadIdx.x / kGrid, tx = threadIdx.x % kGrid;
#pragma unroll 4
    for (int m = 0; m < depth; ++m) {
        float av[RM], bv[RN];
#pragma unroll
        for (int r = 0; r < RM; ++r) av[r] = a[(ty + kGrid * r) * as + m];
#pragma unroll
        for (int c = 0; c < RN; ++c) {
            const int col = col0 + tx + kGrid * c;
            bv[c] = col < ncols ? b[m * bs + col] : 0.f;
        }
#pragma unroll
        for (int r = 0; r < RM; ++r)
#pragma unroll
            for (int c = 0; c < RN; ++c) acc[r][c] = fmaf(av[r], bv[c], acc[r][c]);
    }
}

// T = (I + A)^-1 for strictly lower-triangular A [C][C] (row stride C + 1), into t (same stride),
// which must be zero on entry. Diagonal 16 x 16 blocks by forward substitution, one thread per
// column (a column only depends on itself), then blocks are doubled:
// [[T11, 0], [A21, T22]] -> [[T11, 0], [-T22 A21 T11, T22]]. tmp holds C * C / 4 floats.
template <int C>
__device__ __forceinline__ void unit_lower_inverse(const float* a, float* t, float* tmp) {
    constexpr int S = C + 1;
    if (threadIdx.x < C) {
        const int o = (threadIdx.x / 16) * 16, j = threadIdx.x % 16;
        t[(o + j) * S + o + j] = 1.f;
        for (int i = j + 1; i < 16; ++i) {
            // Row i of (I + A) T = I within the block: T[i][j] = -(A[i][j] + sum_{j<m<i} A[i][m] T[m][j]).
            float s = a[(o + i) * S + o + j];
            for (int m = j + 1; m < i; ++m) s = fmaf(a[(o + i) * S + o + m], t[(o + m) * S + o + j], s);
            t[(o + i) * S + o + j] = -s;
        }
    }
    __syncthreads();
#pragma unroll
    for (int s = 16; s < C; s *= 2) {
        const int work = (C / (2 * s)) * s * s;
        for (int e = threadIdx.x; e < work; e += kThreads) {
            const int p = e / (s * s), r = (e / s) % s, c = e % s;
            const int c0 = 2 * p * s, r0 = c0 + s;
            float acc = 0.f;
            for (int m = 0; m < s; ++m) acc = fmaf(a[(r0 + r) * S + c0 + m], t[(c0 + m) * S + c0 + c], acc);
            tmp[e] = acc;  // (A21 T11)[r][c]
        }
        __syncthreads();
        for (int e = threadIdx.x; e < work; e += kThreads) {
            const int p = e / (s * s), r = (e / s) % s, c = e % s;
            const int c0 = 2 * p * s, r0 = c0 + s;
            float acc = 0.f;
            for (int m = 0; m < s; ++m) acc = fmaf(t[(r0 + r) * S + r0 + m], tmp[p * s * s + m * s + c], acc);
            t[(r0 + r) * S + c0 + c] = -acc;
        }
        __syncthreads();
    }
}

}  // namespace gdn_chunk

// ---------------------------------------------------------------------------------------------
// Tensor-core products (the TC = true variants of the kernels). Warp-level
// mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32 with fp32 accumulation; operands come from fp32
// shared memory and are rounded to bf16 in registers. An fp32 operand x is split as
// x = hi + lo, hi = bf16(x), lo = bf16(x - hi), and a product takes three MMAs
// (hi hi + hi lo + lo hi): relative error about 2^-16, far below bf16 output rounding (fp16
// inputs are exact in hi + lo). Fragment layouts (PTX ISA, groupID g = lane >> 2,
// threadID_in_group t = lane % 4): A 16 x 16 row-major, register r holds the pair
// (row g + 8 (r & 1), k 2t + 8 (r >> 1) + {0, 1}); B 16 x 8, register r holds (k 2t + 8 r + {0, 1},
// col g); C/D 16 x 8, element e is (row g + 8 (e >> 1), col 2t + (e & 1)). The low 16 bits of a
// register hold the element with the lower index.

// 4-byte global -> shared copy that bypasses registers; completion per thread by groups.
__device__ __forceinline__ void cp_async4(float* dst, const float* src) {
    const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src) : "memory");
}

namespace gdn_chunk {

constexpr int kWarps = kThreads / 32;

// One strided fp32 operand in shared memory: element (r, c) is p[r * rs + c * cs] for r < rows,
// c < cols, and reads as zero outside (never dereferenced there).
struct Operand {
    const float* p;
    int rs, cs, rows, cols;
    __device__ __forceinline__ float at(int r, int c) const { return r < rows && c < cols ? p[r * rs + c * cs] : 0.f; }
};

// acc[nb] += A[m0 : m0 + 16, :] B[:, n0 + 8 nb : n0 + 8 nb + 8] over the depth A.cols (= B.rows).
// Warp-uniform: all 32 lanes must call it together.
template <int NB, bool kSplitA, bool kSplitB>
__device__ __forceinline__ void mma_accumulate(float (&acc)[NB][4], const Operand& a, const Operand& b, int m0, int n0) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    for (int k0 = 0; k0 < a.cols; k0 += 16) {
        unsigned ahi[4], alo[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int i = m0 + g + 8 * (r & 1), kk = k0 + 2 * t + 8 * (r >> 1);
            split_pair<kSplitA>(a.at(i, kk), a.at(i, kk + 1), ahi[r], alo[r]);
        }
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
            const int j = n0 + 8 * nb + g;
            unsigned bhi[2], blo[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int kk = k0 + 2 * t + 8 * r;
                split_pair<kSplitB>(b.at(kk, j), b.at(kk + 1, j), bhi[r], blo[r]);
            }
            mma_bf16_16816(acc[nb], ahi, bhi);
            if (kSplitB) mma_bf16_16816(acc[nb], ahi, blo);
            if (kSplitA) mma_bf16_16816(acc[nb], alo, bhi);
        }
    }
}

// D = A1 B1 (+ A2 B2 when a2 is given), D [M = a1.rows, N = b1.cols], split over the CTA's warps in
// strips of 16 x 8 NB; epi(i, j, d) is called once for every i < M, j < N, by the one thread
// that owns (i, j). Ownership depends only on (M, N, NB), so two products of the same shape give
// each element to the same thread. Every thread of the CTA must call it.
template <int NB, bool kSplitA, bool kSplitB, typename Epi>
__device__ __forceinline__ void cta_product(const Operand& a1, const Operand& b1, const Operand* a2, const Operand* b2,
                                            Epi epi) {
    const int M = a1.rows, N = b1.cols;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int mt = (M + 15) / 16, nt = (N + 8 * NB - 1) / (8 * NB);
    for (int s = threadIdx.x / 32; s < mt * nt; s += kWarps) {
        const int m0 = (s / nt) * 16, n0 = (s % nt) * 8 * NB;
        float acc[NB][4] = {};
        mma_accumulate<NB, kSplitA, kSplitB>(acc, a1, b1, m0, n0);
        if (a2 != nullptr) mma_accumulate<NB, kSplitA, kSplitB>(acc, *a2, *b2, m0, n0);
#pragma unroll
        for (int nb = 0; nb < NB; ++nb)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int i = m0 + g + 8 * (e >> 1), j = n0 + 8 * nb + 2 * t + (e & 1);
                if (i < M && j < N) epi(i, j, acc[nb][e]);
            }
    }
}

}  // namespace gdn_chunk

// ---------------------------------------------------------------------------------------------
// Kernel a: intra-chunk. Grid (num_chunks, HV), 256 threads.
// Shared memory (floats): xs C * XS (XS = max(K, V) | 1; K rows, later V rows), A and T
// C * (C + 1) each, tmp C * C / 4, and 6 vectors of C.
template <typename T, int C, bool TC>
__global__ void __launch_bounds__(gdn_chunk::kThreads)
    gdn_chunk_intra(const T* __restrict__ k, const T* __restrict__ v, const void* __restrict__ g,
                    const void* __restrict__ beta, int gate_flags, const float* __restrict__ A_log,
                    const float* __restrict__ dt_bias, const long long* __restrict__ chunk_start,
                    const int* __restrict__ chunk_len, int H, int HV, int K, int V, int l2norm,
                    float* __restrict__ w_out, float* __restrict__ u_out, float* __restrict__ kd_out,
                    float* __restrict__ gates_out) {
    using namespace gdn_chunk;
    static_assert(C == 16 || C == 32 || C == 64, "chunk size must be 16, 32 or 64");
    constexpr int RM = C / kGrid;
    constexpr int S = C + 1;
    extern __shared__ float smem[];

    const int chunk = blockIdx.x, hv = blockIdx.y, hk = hv / (HV / H);
    const long long t0 = chunk_start[chunk];
    const int len = chunk_len[chunk];
    const int XS = odd_stride(K > V ? K : V);
    float* xs = smem;
    float* a = xs + C * XS;
    float* tm = a + C * S;
    float* tmp = tm + C * S;
    float* gs = tmp + C * C / 4;
    float* bs = gs + C;
    float* G = bs + C;
    float* d_last = G + C;
    float* w_scale = d_last + C;   // beta exp(G)
    float* kd_scale = w_scale + C;  // exp(G_last - G)
    const size_t base = static_cast<size_t>(chunk) * HV + hv;

    for (int i = threadIdx.x; i < C; i += kThreads) {
        const size_t idx = static_cast<size_t>(t0 + i) * HV + hv;
        gs[i] = i < len ? native_gate<T>(g, idx, gate_flags, A_log, dt_bias, hv) : 0.f;
        bs[i] = i < len ? native_beta<T>(beta, idx, gate_flags) : 0.f;
    }
    load_rows<T, C>(xs, XS, k + static_cast<size_t>(t0) * H * K + static_cast<size_t>(hk) * K,
                    static_cast<size_t>(H) * K, len, K);
    for (int e = threadIdx.x; e < C * S; e += kThreads) tm[e] = 0.f;
    __syncthreads();

    if (l2norm) l2norm_rows<C>(xs, XS, K);
    gate_sums<C>(gs, a, S, G, d_last);  // Gamma goes into a's lower triangle
    __syncthreads();

    for (int i = threadIdx.x; i < C; i += kThreads) {
        w_scale[i] = bs[i] * expf(G[i]);
        kd_scale[i] = expf(d_last[i]);
        gates_out[base * 2 * C + i] = G[i];
        gates_out[base * 2 * C + C + i] = d_last[i];
    }
    if constexpr (TC) {
        // A = tril(diag(beta) (K K^T * Gamma), -1); every thread rewrites only its own entries.
        const Operand kr{xs, XS, 1, C, K}, kt{xs, 1, XS, K, C};
        cta_product<2, true, true>(kr, kt, nullptr, nullptr, [&](int i, int j, float x) {
            a[i * S + j] = i > j ? bs[i] * x * a[i * S + j] : 0.f;
        });
    } else {
        // A = tril(diag(beta) (K K^T * Gamma), -1); every thread rewrites only its own entries.
        float acc[RM][RM] = {};
        tile_nt<RM, RM>(acc, xs, XS, xs, XS, K);
        const int ty = threadIdx.x / kGrid, tx = threadIdx.x % kGrid;
#pragma unroll
        for (int r = 0; r < RM; ++r)
#pragma unroll
            for (int c = 0; c < RM; ++c) {
                const int i = ty + kGrid * r, j = tx + kGrid * c;
                a[i * S + j] = i > j ? bs[i] * acc[r][c] * a[i * S + j] : 0.f;
            }
    }
    __syncthreads();

    unit_lower_inverse<C>(a, tm, tmp);  // ends with a barrier

    // Kd = K exp(G_last - G) leaves before the rows of K are scaled by beta exp(G) for W.
    for (int e = threadIdx.x; e < C * K; e += kThreads) {
        const int i = e / K, d = e - i * K;
        const float x = xs[i * XS + d];
        kd_out[base * C * K + e] = x * kd_scale[i];
        xs[i * XS + d] = x * w_scale[i];
    }
    __syncthreads();

    const int ty = threadIdx.x / kGrid, tx = threadIdx.x % kGrid;
    constexpr int RN = kColsPerPass / kGrid;
    const Operand tmat{tm, S, 1, C, C};
    if constexpr (TC) {  // W = T (diag(beta exp(G)) K)
        const Operand kw{xs, XS, 1, C, K};
        cta_product<2, true, true>(tmat, kw, nullptr, nullptr,
                                   [&](int i, int j, float x) { w_out[(base * C + i) * K + j] = x; });
    } else
    for (int d0 = 0; d0 < K; d0 += kColsPerPass) {  // W = T (diag(beta exp(G)) K)
        float acc[RM][RN] = {};
        tile_nn<RM, RN>(acc, tm, S, xs, XS, C, d0, K);
#pragma unroll
        for (int r = 0; r < RM; ++r)
#pragma unroll
            for (int c = 0; c < RN; ++c) {
                const int d = d0 + tx + kGrid * c;
                if (d < K) w_out[(base * C + ty + kGrid * r) * K + d] = acc[r][c];
            }
    }
    __syncthreads();  // xs is reused for V

    const T* vp = v + static_cast<size_t>(t0) * HV * V + static_cast<size_t>(hv) * V;
    for (int e = threadIdx.x; e < C * V; e += kThreads) {
        const int i = e / V, d = e - i * V;
        xs[i * XS + d] = i < len ? to_float(vp[static_cast<size_t>(i) * HV * V + d]) * bs[i] : 0.f;
    }
    __syncthreads();
    if constexpr (TC) {  // U = T (diag(beta) V)
        const Operand vb{xs, XS, 1, C, V};
        cta_product<2, true, true>(tmat, vb, nullptr, nullptr,
                                   [&](int i, int j, float x) { u_out[(base * C + i) * V + j] = x; });
    } else
    for (int d0 = 0; d0 < V; d0 += kColsPerPass) {  // U = T (diag(beta) V)
        float acc[RM][RN] = {};
        tile_nn<RM, RN>(acc, tm, S, xs, XS, C, d0, V);
#pragma unroll
        for (int r = 0; r < RM; ++r)
#pragma unroll
            for (int c = 0; c < RN; ++c) {
                const int d = d0 + tx + kGrid * c;
                if (d < V) u_out[(base * C + ty + kGrid * r) * V + d] = acc[r][c];
            }
    }
}

// ---------------------------------------------------------------------------------------------
// Kernel b: state passing. Grid (N * ceil(V / 16), HV), 256 threads; CTA (n, tile, hv) owns
// columns [16 tile, 16 tile + 16) of the [K, V] state of sequence n, value head hv, and walks the
// sequence's chunks [seq_chunk_off[n], seq_chunk_off[n + 1]) in order (none for an empty
// sequence: the final state is the initial state).
// Shared memory (floats): W and Kd C * KP each (row stride KP = K, or K + 4 on the tensor-core
// path: a stride of 4 mod 32 words spreads the fragment loads over the banks), U and v_new
// C * 16 each, S K * 16.
template <int C, bool TC>
__global__ void __launch_bounds__(gdn_chunk::kThreads)
    gdn_chunk_state(const float* __restrict__ w, const float* __restrict__ u, const float* __restrict__ kd,
                    const float* __restrict__ gates, const int* __restrict__ seq_chunk_off,
                    const float* __restrict__ initial_state, int has_initial, int state_v_first, int HV, int K,
                    int V, float* __restrict__ states, float* __restrict__ v_new, float* __restrict__ final_state,
                    int has_final) {
    using namespace gdn_chunk;
    static_assert(C == 16 || C == 32 || C == 64, "chunk size must be 16, 32 or 64");
    constexpr int VT = kStateTile;
    constexpr int RM = C / kGrid;
    extern __shared__ float smem[];

    const int tiles = (V + VT - 1) / VT;
    const int n = blockIdx.x / tiles, v0 = (blockIdx.x % tiles) * VT, hv = blockIdx.y;
    const int ty = threadIdx.x / kGrid, tx = threadIdx.x % kGrid;
    const int KP = TC ? K + 4 : K;
    float* ws = smem;
    float* ks = ws + C * KP;
    float* us = ks + C * KP;
    float* vn = us + C * VT;
    float* st = vn + C * VT;  // st[kk * VT + c] = S[kk][v0 + c]
    const size_t state_base = (static_cast<size_t>(n) * HV + hv) * K * V;

    for (int e = threadIdx.x; e < K * VT; e += kThreads) {
        const int kk = e / VT, vv = v0 + e % VT;
        float x = 0.f;
        if (has_initial && vv < V)
            x = initial_state[state_base + (state_v_first ? static_cast<size_t>(vv) * K + kk
                                                          : static_cast<size_t>(kk) * V + vv)];
        st[e] = x;
    }

    const int first = seq_chunk_off[n], last = seq_chunk_off[n + 1];
    if constexpr (TC) {
        // Software pipeline over chunks with cp.async: W and U of chunk c + 1 load while the state
        // update of chunk c runs; Kd of chunk c + 1 loads while v_new of chunk c + 1 is computed.
        // Every step commits exactly one group (maybe empty), in the order
        // WU(first), Kd(first), WU(first + 1), Kd(first + 1), ..., so "the group before the
        // newest one" is always the one needed next: cp_async_wait<1>() then a barrier.
        auto load_wu = [&](int c) {
            if (c < last) {
                const size_t b = static_cast<size_t>(c) * HV + hv;
                for (int e = threadIdx.x; e < C * K; e += kThreads) {
                    const int i = e / K, d = e - i * K;
                    cp_async4(ws + i * KP + d, w + b * C * K + e);
                }
                for (int e = threadIdx.x; e < C * VT; e += kThreads) {
                    const int i = e / VT, vv = v0 + e % VT;
                    if (vv < V) cp_async4(us + e, u + (b * C + i) * V + vv);
                    else us[e] = 0.f;
                }
            }
            cp_async_commit();
        };
        auto load_kd = [&](int c) {
            if (c < last) {
                const size_t b = static_cast<size_t>(c) * HV + hv;
                for (int e = threadIdx.x; e < C * K; e += kThreads) {
                    const int i = e / K, d = e - i * K;
                    cp_async4(ks + i * KP + d, kd + b * C * K + e);
                }
            }
            cp_async_commit();
        };
        load_wu(first);
        load_kd(first);
        for (int chunk = first; chunk < last; ++chunk) {
            const size_t base = static_cast<size_t>(chunk) * HV + hv;
            cp_async_wait<1>();  // WU(chunk) has landed (Kd(chunk) may still be in flight)
            __syncthreads();     // everyone's copies and st are complete
            for (int e = threadIdx.x; e < K * VT; e += kThreads) {
                const int kk = e / VT, vv = v0 + e % VT;
                if (vv < V) states[base * K * V + static_cast<size_t>(kk) * V + vv] = st[e];
            }
            const float decay = expf(gates[base * 2 * C + C - 1]);  // exp(G_last)
            // v_new = U - W S, then S = exp(G_last) S + Kd^T v_new; each element of v_new and of S
            // is written by the one thread that owns it in the product.
            const Operand wm{ws, KP, 1, C, K}, sm{st, VT, 1, K, VT};
            cta_product<1, true, true>(wm, sm, nullptr, nullptr, [&](int i, int j, float x) {
                const float y = us[i * VT + j] - x;
                vn[i * VT + j] = y;
                if (v0 + j < V) v_new[(base * C + i) * V + v0 + j] = y;
            });
            __syncthreads();  // vn complete; ws, us and st (as an operand) are free
            load_wu(chunk + 1);
            cp_async_wait<1>();  // Kd(chunk) has landed
            __syncthreads();
            const Operand kt{ks, 1, KP, K, C}, vm{vn, VT, 1, C, VT};
            cta_product<1, true, true>(kt, vm, nullptr, nullptr, [&](int i, int j, float x) {
                st[i * VT + j] = decay * st[i * VT + j] + x;
            });
            __syncthreads();  // ks and vn are free
            load_kd(chunk + 1);
        }
        cp_async_wait<0>();
    } else
    for (int chunk = first; chunk < last; ++chunk) {
        const size_t base = static_cast<size_t>(chunk) * HV + hv;
        __syncthreads();  // st is complete; the previous chunk is done with ws, ks and vn
        for (int e = threadIdx.x; e < K * VT; e += kThreads) {
            const int kk = e / VT, vv = v0 + e % VT;
            if (vv < V) states[base * K * V + static_cast<size_t>(kk) * V + vv] = st[e];
        }
        for (int e = threadIdx.x; e < C * K; e += kThreads) {
            ws[e] = w[base * C * K + e];
            ks[e] = kd[base * C * K + e];
        }
        for (int e = threadIdx.x; e < C * VT; e += kThreads) {
            const int i = e / VT, vv = v0 + e % VT;
            us[e] = vv < V ? u[(base * C + i) * V + vv] : 0.f;
        }
        const float decay = expf(gates[base * 2 * C + C - 1]);  // exp(G_last)
        __syncthreads();

        // v_new = U - W S: thread owns rows ty + 16 r, column tx.
        float acc[RM][1] = {};
        tile_nn<RM, 1>(acc, ws, K, st, VT, K, 0, VT);
#pragma unroll
        for (int r = 0; r < RM; ++r) {
            const int i = ty + kGrid * r;
            const float x = us[i * VT + tx] - acc[r][0];
            vn[i * VT + tx] = x;
            if (v0 + tx < V) v_new[(base * C + i) * V + v0 + tx] = x;
        }
        __syncthreads();

        // S = exp(G_last) S + Kd^T v_new: thread owns state rows ty + 16 r, column tx, so it is
        // the only reader and writer of those entries in this phase.
        for (int kk = ty; kk < K; kk += kGrid) {
            float s = 0.f;
#pragma unroll 4
            for (int i = 0; i < C; ++i) s = fmaf(ks[i * K + kk], vn[i * VT + tx], s);
            st[kk * VT + tx] = decay * st[kk * VT + tx] + s;
        }
    }
    if (!has_final) return;
    __syncthreads();
    for (int e = threadIdx.x; e < K * VT; e += kThreads) {
        const int kk = e / VT, vv = v0 + e % VT;
        if (vv < V)
            final_state[state_base + (state_v_first ? static_cast<size_t>(vv) * K + kk
                                                    : static_cast<size_t>(kk) * V + vv)] = st[e];
    }
}

// ---------------------------------------------------------------------------------------------
// Kernel c: output. Grid (num_chunks, HV), 256 threads.
// Shared memory (floats): qs C * KS (KS = K | 1), xs max(C * KS, 64 K + 64 C) (K rows, later an
// S tile [K][64] and a v_new tile [C][64]), P C * (C + 1), 2 vectors of C.
template <typename T, int C, bool TC>
__global__ void __launch_bounds__(gdn_chunk::kThreads)
    gdn_chunk_output(const T* __restrict__ q, const T* __restrict__ k, const void* __restrict__ g, int gate_flags,
                     const float* __restrict__ A_log, const float* __restrict__ dt_bias,
                     const long long* __restrict__ chunk_start, const int* __restrict__ chunk_len,
                     const float* __restrict__ states, const float* __restrict__ v_new,
                     const float* __restrict__ gates, int H, int HV, int K, int V, int l2norm, float scale,
                     T* __restrict__ o) {
    using namespace gdn_chunk;
    static_assert(C == 16 || C == 32 || C == 64, "chunk size must be 16, 32 or 64");
    constexpr int RM = C / kGrid;
    constexpr int S = C + 1;
    constexpr int VT = kOutTile;
    extern __shared__ float smem[];

    const int chunk = blockIdx.x, hv = blockIdx.y, hk = hv / (HV / H);
    const long long t0 = chunk_start[chunk];
    const int len = chunk_len[chunk];
    const int KS = odd_stride(K);
    const int x_size = C * KS > VT * (K + C) ? C * KS : VT * (K + C);
    float* qs = smem;
    float* xs = qs + C * KS;
    float* p = xs + x_size;
    float* gs = p + C * S;
    float* eg = gs + C;
    const size_t base = static_cast<size_t>(chunk) * HV + hv;
    const int ty = threadIdx.x / kGrid, tx = threadIdx.x % kGrid;

    for (int i = threadIdx.x; i < C; i += kThreads) {
        // the same function as the intra kernel's, so both kernels see bitwise identical gates
        gs[i] = i < len ? native_gate<T>(g, static_cast<size_t>(t0 + i) * HV + hv, gate_flags, A_log, dt_bias, hv)
                        : 0.f;
        eg[i] = expf(gates[base * 2 * C + i]);  // exp(G), G as kernel a summed it
    }
    const size_t qk_off = static_cast<size_t>(t0) * H * K + static_cast<size_t>(hk) * K;
    load_rows<T, C>(qs, KS, q + qk_off, static_cast<size_t>(H) * K, len, K);
    load_rows<T, C>(xs, KS, k + qk_off, static_cast<size_t>(H) * K, len, K);
    __syncthreads();

    if (l2norm) {
        l2norm_rows<C>(qs, KS, K);
        l2norm_rows<C>(xs, KS, K);
    }
    gate_sums<C>(gs, p, S, nullptr, nullptr);
    __syncthreads();
    if constexpr (TC) {
        // P = (Q K^T) * Gamma on and below the diagonal, zero above; then Q <- diag(exp(G)) Q, so
        // that O = scale (Q S + P v_new) is one accumulation.
        const Operand qr{qs, KS, 1, C, K}, kt{xs, 1, KS, K, C};
        cta_product<2, true, true>(qr, kt, nullptr, nullptr, [&](int i, int j, float x) {
            p[i * S + j] = j <= i ? x * p[i * S + j] : 0.f;
        });
        __syncthreads();
        for (int e = threadIdx.x; e < C * K; e += kThreads) {
            const int i = e / K, d = e - i * K;
            qs[i * KS + d] *= eg[i];
        }
    } else {
        // P = (Q K^T) * Gamma on and below the diagonal, zero above.
        float acc[RM][RM] = {};
        tile_nt<RM, RM>(acc, qs, KS, xs, KS, K);
#pragma unroll
        for (int r = 0; r < RM; ++r)
#pragma unroll
            for (int c = 0; c < RM; ++c) {
                const int i = ty + kGrid * r, j = tx + kGrid * c;
                p[i * S + j] = j <= i ? acc[r][c] * p[i * S + j] : 0.f;
            }
    }

    float* ss = xs;           // S tile [K][VT]
    float* vs = xs + VT * K;  // v_new tile [C][VT]
    constexpr int RN = VT / kGrid;
    for (int v0 = 0; v0 < V; v0 += VT) {
        __syncthreads();  // xs is free: Q K^T or the previous tile is done with it
        for (int e = threadIdx.x; e < K * VT; e += kThreads) {
            const int kk = e / VT, vv = v0 + e % VT;
            ss[e] = vv < V ? states[base * K * V + static_cast<size_t>(kk) * V + vv] : 0.f;
        }
        for (int e = threadIdx.x; e < C * VT; e += kThreads) {
            const int i = e / VT, vv = v0 + e % VT;
            vs[e] = vv < V ? v_new[(base * C + i) * V + vv] : 0.f;
        }
        __syncthreads();
        if constexpr (TC) {
            const Operand qm{qs, KS, 1, C, K}, sm{ss, VT, 1, K, VT}, pm{p, S, 1, C, C}, vm{vs, VT, 1, C, VT};
            cta_product<2, true, true>(qm, sm, &pm, &vm, [&](int i, int j, float x) {
                if (i < len && v0 + j < V) o[(static_cast<size_t>(t0 + i) * HV + hv) * V + v0 + j] = from_float<T>(scale * x);
            });
            continue;
        }
        float inter[RM][RN] = {}, intra[RM][RN] = {};
        tile_nn<RM, RN>(inter, qs, KS, ss, VT, K, 0, VT);
        tile_nn<RM, RN>(intra, p, S, vs, VT, C, 0, VT);
#pragma unroll
        for (int r = 0; r < RM; ++r) {
            const int i = ty + kGrid * r;
            if (i >= len) continue;
            T* orow = o + (static_cast<size_t>(t0 + i) * HV + hv) * V;
#pragma unroll
            for (int c = 0; c < RN; ++c) {
                const int vv = v0 + tx + kGrid * c;
                if (vv < V) orow[vv] = from_float<T>(scale * (eg[i] * inter[r][c] + intra[r][c]));
            }
        }
    }
}

#ifndef __CUDACC_RTC__
// Standalone nvcc build (CI): instantiate every variant so that each one is compiled and checked.
#define GDN_CHUNK_INSTANTIATE(T, C, TC)                                                                    \
    template __global__ void gdn_chunk_intra<T, C, TC>(const T*, const T*, const void*, const void*, int,  \
                                                       const float*, const float*,                         \
                                                       const long long*, const int*, int, int, int, int,   \
                                                       int, float*, float*, float*, float*);               \
    template __global__ void gdn_chunk_output<T, C, TC>(const T*, const T*, const void*, int,              \
                                                        const float*, const float*,                        \
                                                        const long long*, const int*, const float*,        \
                                                        const float*, const float*, int, int, int, int,    \
                                                        int, float, T*);
#define GDN_CHUNK_INSTANTIATE_STATE(C, TC)                                                                \
    template __global__ void gdn_chunk_state<C, TC>(const float*, const float*, const float*, const float*, \
                                                    const int*, const float*, int, int, int, int, int,     \
                                                    float*, float*, float*, int);
#define GDN_CHUNK_INSTANTIATE_ALL(C)           \
    GDN_CHUNK_INSTANTIATE(float, C, false)     \
    GDN_CHUNK_INSTANTIATE(__half, C, false)    \
    GDN_CHUNK_INSTANTIATE(__nv_bfloat16, C, false) \
    GDN_CHUNK_INSTANTIATE(float, C, true)      \
    GDN_CHUNK_INSTANTIATE(__half, C, true)     \
    GDN_CHUNK_INSTANTIATE(__nv_bfloat16, C, true) \
    GDN_CHUNK_INSTANTIATE_STATE(C, false)      \
    GDN_CHUNK_INSTANTIATE_STATE(C, true)
GDN_CHUNK_INSTANTIATE_ALL(16)
GDN_CHUNK_INSTANTIATE_ALL(32)
GDN_CHUNK_INSTANTIATE_ALL(64)
#undef GDN_CHUNK_INSTANTIATE_ALL
#undef GDN_CHUNK_INSTANTIATE_STATE
#undef GDN_CHUNK_INSTANTIATE
#endif
