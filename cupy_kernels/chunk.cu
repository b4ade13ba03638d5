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
// Input element type T is float, __half or __nv_bfloat16; g and beta are float or T (gate_flags
// bit 0: g is T, bit 1: beta is T); bits 2-4 select FLA's in-kernel gate options (native_gate,
// native_beta). Metadata (chunk tables) is built by the launcher from validated offsets. Head sizes K, V in 1..256 (any value: loads are guarded and
// shared-memory tiles zero padded). All CTAs have 256 threads; block-level products use a 16 x 16
// thread grid where thread (ty, tx) owns rows ty + 16 r and columns tx + 16 c of the result.
//
// Compiled at run time by cupy.RawModule (NVRTC, name_expressions) and, for CI, standalone by
// nvcc, which instantiates every variant below so that all of them are checked.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace gdn_chunk {

constexpr int kThreads = 256;
constexpr int kGrid = 16;        // thread grid is kGrid x kGrid
constexpr int kStateTile = 16;   // V columns per CTA in the state-passing kernel
constexpr int kOutTile = 64;     // V columns per pass in the output kernel
constexpr int kColsPerPass = 128;  // columns per pass of the W / U products (8 per thread)
constexpr float kL2NormEps = 1e-6f;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// One gate value: the gate arrays are either fp32 or the input type T.
template <typename T>
__device__ __forceinline__ float load_gate(const void* p, size_t i, bool is_t) {
    return is_t ? to_float(static_cast<const T*>(p)[i]) : static_cast<const float*>(p)[i];
}

// gate_flags bits: how g and beta are stored and which of FLA's in-kernel gate options apply.
constexpr int kGateIsT = 1;       // g is stored as T (else fp32)
constexpr int kBetaIsT = 2;       // beta is stored as T (else fp32)
constexpr int kGateInKernel = 4;  // use_gate_in_kernel: g = -exp(A_log) * softplus(g + dt_bias)
constexpr int kBetaSigmoid = 8;   // use_beta_sigmoid_in_kernel: beta = sigmoid(beta)
constexpr int kNegEigval = 16;    // allow_neg_eigval: beta = 2 * sigmoid(beta)

// The native log decay of flat gate element idx (value head hv). A_log and dt_bias are fp32 [HV];
// dt_bias may be null (0). Softplus is the identity above 20, like FLA's and torch's.
template <typename T>
__device__ __forceinline__ float native_gate(const void* g, size_t idx, int flags, const float* A_log,
                                             const float* dt_bias, int hv) {
    float x = load_gate<T>(g, idx, flags & kGateIsT);
    if (flags & kGateInKernel) {
        x += dt_bias != nullptr ? dt_bias[hv] : 0.f;
        x = -expf(A_log[hv]) * (x > 20.f ? x : log1pf(expf(x)));
    }
    return x;
}

// The native beta of flat element idx: stored, or sigmoid of stored logits (x2 with kNegEigval).
template <typename T>
__device__ __forceinline__ float native_beta(const void* beta, size_t idx, int flags) {
    float x = load_gate<T>(beta, idx, flags & kBetaIsT);
    if (flags & kBetaSigmoid) {
        const float e = expf(-fabsf(x));  // no overflow for large |x|
        x = x >= 0.f ? 1.f / (1.f + e) : e / (1.f + e);
        if (flags & kNegEigval) x *= 2.f;
    }
    return x;
}

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

#ifndef GDN_CHUNK_HOST_EMULATION
// d += a b (the CPU emulator used by the tests supplies its own definition).
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    // Not volatile: a pure function of its registers, so the compiler may interleave independent MMAs.
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// 4-byte global -> shared copy that bypasses registers; completion per thread by groups.
__device__ __forceinline__ void cp_async4(float* dst, const float* src) {
    const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Wait until at most N of this thread's most recent groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
#endif

namespace gdn_chunk {

constexpr int kWarps = kThreads / 32;

// (x0, x1) -> packed bf16 pairs hi = bf16(x), lo = bf16(x - hi) (lo = 0 without kSplit).
// Both roundings are one paired conversion (cvt.rn.bf16x2.f32), and hi is unpacked with two
// integer operations (a bf16 is the upper half of its fp32).
template <bool kSplit>
__device__ __forceinline__ void split_pair(float x0, float x1, unsigned& hi, unsigned& lo) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);  // .x (x0) in the low 16 bits
    hi = *reinterpret_cast<const unsigned*>(&h);
    lo = 0u;
    if (kSplit) {
        const float h0 = __uint_as_float(hi << 16), h1 = __uint_as_float(hi & 0xffff0000u);
        const __nv_bfloat162 l = __floats2bfloat162_rn(x0 - h0, x1 - h1);
        lo = *reinterpret_cast<const unsigned*>(&l);
    }
}

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

// ---------------------------------------------------------------------------------------------
// Fused path (bf16 inputs, C = 64, K a multiple of 16 up to 128, V a multiple of 16). Two kernels
// instead of three, no fp32 W / U / per-chunk states in global memory, and every product an MMA
// whose exact bf16 operands (k, q) are used as they are, so only fp32 operands pay for a split:
//
//   gdn_fused_prep    one CTA per (chunk, value head), fully parallel. With rk, rq the l2norm row
//                     scales (1 without l2norm), G = cumsum(g) in fp64, Gamma_ij = exp(G_i - G_j):
//                     A = tril(beta_i rk_i rk_j (K K^T)_ij Gamma_ij, -1), T = (I + A)^-1,
//                     T' = T diag(beta), P' = scale rq_i rk_j (Q K^T)_ij Gamma_ij (j <= i), written
//                     as bf16 hi / lo pairs [4][C][C] (T'hi, T'lo, P'hi, P'lo), and the row vectors
//                     a = exp(G) rk, c = exp(G_last - G) rk, d = scale exp(G) rq and G [4][C] fp32.
//   gdn_fused_state   one CTA per (sequence, BV-column V tile, value head), sequential over the
//                     sequence's chunks, state S [K, BV] in fp32 registers (bf16 hi / lo copy in
//                     shared memory as the MMA operand):
//                       X     = V - diag(a) (K S)              (K exact bf16, S split: 2 MMAs)
//                       v_new = T' X                            (both split: 3 MMAs)
//                       o     = diag(d) (Q S) + P' v_new        (2 + 3 MMAs)
//                       S    <- exp(G_last) S + K^T diag(c) v_new (2 MMAs)
//                     This is the algebra of the three-kernel path: W S = T diag(beta exp(G)) K S
//                     and U = T diag(beta) V give v_new = T' (V - diag(exp(G)) K S), and l2norm is a
//                     row scale of K and Q, folded into a, c, d, T' and P'.
// The next chunk's k, q, v, T', P' and vectors are loaded with cp.async while the current chunk
// computes (two stages). Operand rows are padded by 8 bf16 (16 bytes) so that the eight 16-byte
// rows an ldmatrix reads fall in distinct banks. Masked rows of a ragged last chunk are zero-filled
// by the copies (k, q, v) and by prep (beta = 0, g = 0), so they leave S unchanged.

#ifndef GDN_CHUNK_HOST_EMULATION
// Four 8 x 8 b16 matrices from shared memory; lane l gives the row address of matrix l / 8.
__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], const void* p) {
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
// The same, each matrix transposed.
__device__ __forceinline__ void ldsm_x4_t(unsigned (&r)[4], const void* p) {
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
// 16-byte global -> shared copy; valid = false writes 16 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
}
#endif

namespace gdn_fused {

constexpr int C = 64;             // chunk size of the fused path
constexpr int kPad = 8;           // bf16 row padding: 16 bytes, so ldmatrix rows hit distinct banks
constexpr int CP = C + kPad;      // row stride of the C x C operands in shared memory
constexpr int kMaxK = 128;        // state rows; bounds the registers that hold S
constexpr int kMats = 4;          // T'hi, T'lo, P'hi, P'lo
constexpr int kVecs = 4;          // a, c, d, G

// Store the pair (x0, x1) at hi[o], lo[o] (bf16 pairs, 4-byte aligned) as x = hi + lo.
__device__ __forceinline__ void store_split(__nv_bfloat16* hi, __nv_bfloat16* lo, int o, float x0, float x1) {
    unsigned h, l;
    gdn_chunk::split_pair<true>(x0, x1, h, l);
    *reinterpret_cast<unsigned*>(hi + o) = h;
    *reinterpret_cast<unsigned*>(lo + o) = l;
}

// Lane address of an ldmatrix.x4 A fragment (16 x 16 at rows m0, columns k0) of a row-major
// matrix with row stride ld: matrices (m0, k0), (m0 + 8, k0), (m0, k0 + 8), (m0 + 8, k0 + 8).
__device__ __forceinline__ const __nv_bfloat16* a_frag(const __nv_bfloat16* m, int ld, int m0, int k0) {
    const int lane = threadIdx.x & 31, q = lane >> 3, r = lane & 7;
    return m + (m0 + r + 8 * (q & 1)) * ld + k0 + 8 * (q >> 1);
}
// A fragment of A = M^T from row-major M (A[m][k] = M[k][m]); load with ldsm_x4_t.
__device__ __forceinline__ const __nv_bfloat16* at_frag(const __nv_bfloat16* m, int ld, int m0, int k0) {
    const int lane = threadIdx.x & 31, q = lane >> 3, r = lane & 7;
    return m + (k0 + r + 8 * (q >> 1)) * ld + m0 + 8 * (q & 1);
}
// B fragments of two n-tiles (n0, n0 + 8), depth k0..k0 + 15, of a row-major B[k][n]; load with
// ldsm_x4_t: registers 0, 1 are n-tile n0, registers 2, 3 n-tile n0 + 8.
__device__ __forceinline__ const __nv_bfloat16* b_frag(const __nv_bfloat16* m, int ld, int k0, int n0) {
    const int lane = threadIdx.x & 31, q = lane >> 3, r = lane & 7;
    return m + (k0 + r + 8 * (q & 1)) * ld + n0 + 8 * (q >> 1);
}
// The same two n-tiles of B = M^T from row-major M (B[k][n] = M[n][k]); load with ldsm_x4.
__device__ __forceinline__ const __nv_bfloat16* bt_frag(const __nv_bfloat16* m, int ld, int k0, int n0) {
    const int lane = threadIdx.x & 31, q = lane >> 3, r = lane & 7;
    return m + (n0 + r + 8 * (q >> 1)) * ld + k0 + 8 * (q & 1);
}

// Copy `rows` rows of `cols` bf16 (cols a multiple of 8) from global (row stride gs elements) to
// shared memory (row stride ss); rows at or past `valid` are zero-filled. All threads take part.
__device__ __forceinline__ void copy_rows(__nv_bfloat16* dst, int ss, const __nv_bfloat16* src, size_t gs, int rows,
                                          int valid, int cols, int nthreads) {
    const int per_row = cols / 8;
    for (int e = threadIdx.x; e < rows * per_row; e += nthreads) {
        const int r = e / per_row, c = (e - r * per_row) * 8;
        const bool ok = r < valid;
        cp_async16(dst + r * ss + c, ok ? src + r * gs + c : src, ok);
    }
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

// ---------------------------------------------------------------------------------------------
// Fused kernel 2: state and output. Grid (N * V / (16 W), HV), 32 W threads: W warps, and warp w
// owns value columns v0 + 16 w .. + 15 of one (sequence, value head). Everything a warp computes is
// in the transposed form, so that each product's C fragment is the next product's A fragment and
// stays in registers (no shared S, one barrier per chunk for the shared input stage):
//   S^T [16, K] fp32 in registers (C fragments of 8-column k tiles)
//   Y_k = S^T K^T, Y_q = S^T Q^T                 [16, C]   A = S^T split, B = K, Q from shared memory
//   X^T = V^T - Y_k diag(a)                        [16, C]
//   v_new^T = X^T T'^T                             [16, C]   T' lower triangular: blocks j <= i only
//   o^T = Y_q diag(d) + v_new^T P'^T               [16, C]   staged through shared memory for the store
//   S^T <- exp(G_last) S^T + v_new^T diag(c) K     [16, K]
// Shared memory (bf16 unless noted), two stages of: k, q [C][K + 8], v [C][16 W + 8],
// mats [4][C][C + 8], vecs [4][C] fp32; then the output tile [C][16 W + 8].
namespace gdn_fused {

// A fragment (16 x 16, depth block kb) from two C-fragment tiles in registers: the fp32 pairs of
// tiles 2 kb and 2 kb + 1, split into bf16 hi / lo (the register layouts of C and A agree).
__device__ __forceinline__ void a_from_c(const float (&c0)[4], const float (&c1)[4], float scale0, float scale1,
                                         float scale2, float scale3, unsigned (&hi)[4], unsigned (&lo)[4]) {
    gdn_chunk::split_pair<true>(c0[0] * scale0, c0[1] * scale1, hi[0], lo[0]);
    gdn_chunk::split_pair<true>(c0[2] * scale0, c0[3] * scale1, hi[1], lo[1]);
    gdn_chunk::split_pair<true>(c1[0] * scale2, c1[1] * scale3, hi[2], lo[2]);
    gdn_chunk::split_pair<true>(c1[2] * scale2, c1[3] * scale3, hi[3], lo[3]);
}

// acc[t] += A B_t for NT n tiles with a split A (and, with kLoB, a split B): all a_hi b_hi first,
// then a_lo b_hi, then a_hi b_lo, so that MMAs on one accumulator are NT instructions apart and
// the tensor pipe is not left waiting for each result. b[t] = {hi0, hi1, lo0, lo1} of tile t.
template <int NT, bool kLoB>
__device__ __forceinline__ void mma_group(float* const (&acc)[NT], const unsigned (&ahi)[4], const unsigned (&alo)[4],
                                          const unsigned (&b)[NT][4]) {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        const unsigned bh[2] = {b[t][0], b[t][1]};
        mma_bf16_16816(*reinterpret_cast<float(*)[4]>(acc[t]), ahi, bh);
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        const unsigned bh[2] = {b[t][0], b[t][1]};
        mma_bf16_16816(*reinterpret_cast<float(*)[4]>(acc[t]), alo, bh);
    }
    if (kLoB) {
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const unsigned bl[2] = {b[t][2], b[t][3]};
            mma_bf16_16816(*reinterpret_cast<float(*)[4]>(acc[t]), ahi, bl);
        }
    }
}

}  // namespace gdn_fused

// A named barrier for the KS warps of one slab (ids 1..W; 0 is __syncthreads).
__device__ __forceinline__ void slab_barrier(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// W slabs of 16 value columns per CTA; KS warps per slab, each holding K / KS rows of the slab's
// S^T. With KS = 2 each warp's chain of dependent MMAs per chunk is about 0.56 of the whole
// (Y_k, Y_q and the state update halve, v_new is computed by both, the output tiles are shared
// out): the form for few sequences, where one CTA per SM leaves the chain's latency exposed.
template <int W, int KS>
__global__ void __launch_bounds__(32 * W * KS)
    gdn_fused_state(const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k,
                    const __nv_bfloat16* __restrict__ v, const __nv_bfloat16* __restrict__ mats,
                    const float* __restrict__ vecs, const long long* __restrict__ chunk_start,
                    const int* __restrict__ chunk_len, const int* __restrict__ seq_chunk_off,
                    const float* __restrict__ initial_state, int has_initial, int state_v_first, int H, int HV,
                    int K, int V, __nv_bfloat16* __restrict__ o, float* __restrict__ final_state, int has_final) {
    using namespace gdn_fused;
    static_assert(W == 1 || W == 2 || W == 4, "1, 2 or 4 slabs per CTA");
    static_assert(KS == 1 || KS == 2, "1 or 2 warps per slab");
    constexpr int kThreadsW = 32 * W * KS;
    constexpr int BV = 16 * W;                // value columns per CTA
    constexpr int VP = BV + kPad;             // row stride of the v and output tiles
    constexpr int KT = kMaxK / 8 / KS;        // k tiles of S^T held per thread (at most)
    constexpr int CT = C / 8;                 // token tiles of a [16, C] product
    constexpr int kX = 2 * CT * 4;            // floats per lane of a partial (Y_k, Y_q) for the exchange
    extern __shared__ __align__(16) unsigned char smem_raw[];

    const int tiles = V / BV;
    const int n = blockIdx.x / tiles, hv = blockIdx.y, hk = hv / (HV / H);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
    const int slab = warp % W, part = warp / W;  // the warp's 16 columns and its share of K
    const int v0 = (blockIdx.x % tiles) * BV;    // the CTA's first column; the slab's is v0 + 16 slab
    const int KP = K + kPad;
    const int kt = K / 8 / KS;                   // k tiles of this warp (K % (16 KS) == 0)
    const int k0 = 8 * kt * part;                // its first state row

    // Shared memory: k and the row vectors double-buffered (k is read again by the state update at
    // the end of the chunk). q, v and T'/P': with KS = 1 single-buffered, each reloaded for the next
    // chunk as soon as every warp is done with it (about 107 KiB at K = 128, W = 4: two CTAs per SM,
    // so one CTA's waits are the other's turn); with KS = 2, where the exchange buffers keep it at one
    // CTA per SM anyway, double-buffered and loaded a whole chunk ahead with one barrier per chunk.
    constexpr bool kDouble = KS > 1;
    const int k_bytes = C * KP * 2, v_bytes = C * VP * 2, m_bytes = kMats * C * CP * 2, vec_bytes = kVecs * C * 4;
    const int kv_bytes = k_bytes + vec_bytes, qvm_bytes = k_bytes + v_bytes + m_bytes;
    auto k_stage = [&](int s) { return reinterpret_cast<__nv_bfloat16*>(smem_raw + s * kv_bytes); };
    auto vec_stage = [&](int s) { return reinterpret_cast<float*>(smem_raw + s * kv_bytes + k_bytes); };
    auto q_stage = [&](int s) {
        return reinterpret_cast<__nv_bfloat16*>(smem_raw + 2 * kv_bytes + (kDouble ? s : 0) * qvm_bytes);
    };
    auto v_stage = [&](int s) { return q_stage(s) + C * KP; };
    auto m_stage = [&](int s) { return q_stage(s) + C * KP + C * VP; };
    __nv_bfloat16* os = reinterpret_cast<__nv_bfloat16*>(smem_raw + 2 * kv_bytes + (kDouble ? 2 : 1) * qvm_bytes);
    // Partials of the KS warps of a slab, [warp][kX][32]: lane-minor, so each store and load is one
    // conflict-free 128-byte row.
    float* xs = reinterpret_cast<float*>(os + C * VP);

    // Each load commits one cp.async group, empty past the sequence's last chunk, so that every
    // thread counts the same groups: per chunk k + vectors, then q + v, then T'/P'.
    const int first = seq_chunk_off[n], last = seq_chunk_off[n + 1];
    const size_t row_stride = static_cast<size_t>(H) * K;
    auto load_k = [&](int chunk, int s) {
        if (chunk < last) {
            const size_t row0 = static_cast<size_t>(chunk_start[chunk]) * row_stride + static_cast<size_t>(hk) * K;
            copy_rows(k_stage(s), KP, k + row0, row_stride, C, chunk_len[chunk], K, kThreadsW);
            const float* vsrc = vecs + (static_cast<size_t>(chunk) * HV + hv) * kVecs * C;
            float* vd = vec_stage(s);
            for (int e = threadIdx.x; e < kVecs * C / 4; e += kThreadsW) cp_async16(vd + 4 * e, vsrc + 4 * e, true);
        }
        cp_async_commit();
    };
    auto load_qv = [&](int chunk, int s) {
        if (chunk < last) {
            const long long t0 = chunk_start[chunk];
            const int len = chunk_len[chunk];
            const size_t row0 = static_cast<size_t>(t0) * row_stride + static_cast<size_t>(hk) * K;
            copy_rows(q_stage(s), KP, q + row0, row_stride, C, len, K, kThreadsW);
            copy_rows(v_stage(s), VP, v + static_cast<size_t>(t0) * HV * V + static_cast<size_t>(hv) * V + v0,
                      static_cast<size_t>(HV) * V, C, len, BV, kThreadsW);
        }
        cp_async_commit();
    };
    auto load_m = [&](int chunk, int s) {
        if (chunk < last) {
            const size_t base = static_cast<size_t>(chunk) * HV + hv;
            copy_rows(m_stage(s), CP, mats + base * kMats * C * C, C, kMats * C, kMats * C, C, kThreadsW);
        }
        cp_async_commit();
    };

    // S^T: element (row gr + 8 (e >> 1), k = k0 + 8 j + 2 tq + (e & 1)) of the slab's 16 x K.
    const int vw = v0 + 16 * slab;
    const size_t state_base = (static_cast<size_t>(n) * HV + hv) * K * V;
    auto state_index = [&](int j, int e) {
        const int vv = vw + gr + 8 * (e >> 1), kk = k0 + 8 * j + 2 * tq + (e & 1);
        return state_base + (state_v_first ? static_cast<size_t>(vv) * K + kk : static_cast<size_t>(kk) * V + vv);
    };
    float st[KT][4];
#pragma unroll
    for (int j = 0; j < KT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[j][e] = (j < kt && has_initial) ? initial_state[state_index(j, e)] : 0.f;
    // Output token-tile pairs of this warp: all of them, or with KS = 2 pairs {0, 3} and {1, 2}
    // (the triangular P' product costs 1 + 4 and 2 + 3 k blocks).
    auto mine = [&](int ip) { return KS == 1 || ((ip == 0 || ip == 3) == (part == 0)); };

    load_k(first, 0);
    load_qv(first, 0);
    load_m(first, 0);
    for (int chunk = first; chunk < last; ++chunk) {
        const int s = (chunk - first) & 1;
        if (kDouble)
            cp_async_wait<0>();  // everything of this chunk has landed
        else
            cp_async_wait<1>();  // k, vectors, q, v of this chunk have landed (T'/P' may still be in flight)
        __syncthreads();         // ... for every thread; every warp is done with stage s ^ 1 and the output tile
        load_k(chunk + 1, s ^ 1);
        if (kDouble) {
            load_qv(chunk + 1, s ^ 1);
            load_m(chunk + 1, s ^ 1);
        }
        const __nv_bfloat16* ks = k_stage(s);
        const __nv_bfloat16* qs = q_stage(s);
        const __nv_bfloat16* vs = v_stage(s);
        const __nv_bfloat16* ms = m_stage(s);
        const float* vec = vec_stage(s);
        const long long t0 = chunk_start[chunk];
        const int len = chunk_len[chunk];

        // Y_k = S^T K^T and Y_q = S^T Q^T over the warp's rows of K in blocks of 16, token tiles in pairs.
        float yk[CT][4] = {}, yq[CT][4] = {};
#pragma unroll
        for (int kb = 0; kb < KT / 2; ++kb) {
            if (2 * kb >= kt) break;
            unsigned ahi[4], alo[4];
            a_from_c(st[2 * kb], st[2 * kb + 1], 1.f, 1.f, 1.f, 1.f, ahi, alo);
#pragma unroll
            for (int tp = 0; tp < CT / 2; ++tp) {
                unsigned bk[4], bq[4];
                ldsm_x4(bk, bt_frag(ks, KP, k0 + 16 * kb, 16 * tp));
                ldsm_x4(bq, bt_frag(qs, KP, k0 + 16 * kb, 16 * tp));
                const unsigned b[4][4] = {{bk[0], bk[1]}, {bk[2], bk[3]}, {bq[0], bq[1]}, {bq[2], bq[3]}};
                float* const acc[4] = {yk[2 * tp], yk[2 * tp + 1], yq[2 * tp], yq[2 * tp + 1]};
                mma_group<4, false>(acc, ahi, alo, b);
            }
        }
        if (KS > 1) {  // sum the two halves; own + other in both warps, so both hold the same bits
            float* mine_x = xs + warp * kX * 32 + lane;
            const float* other_x = xs + (warp ^ W) * kX * 32 + lane;  // W = 1, 2, 4: the slab's other warp
#pragma unroll
            for (int i = 0; i < CT; ++i)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    mine_x[(4 * i + e) * 32] = yk[i][e];
                    mine_x[(4 * (CT + i) + e) * 32] = yq[i][e];
                }
            slab_barrier(1 + slab, 32 * KS);
#pragma unroll
            for (int i = 0; i < CT; ++i)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    yk[i][e] += other_x[(4 * i + e) * 32];
                    yq[i][e] += other_x[(4 * (CT + i) + e) * 32];
                }
        }

        // X^T = V^T - Y_k diag(a), in place of Y_k. V^T comes as A-layout pairs through ldmatrix.trans.
        const int wc = 16 * slab;  // the slab's first column inside the CTA's v / output tiles
#pragma unroll
        for (int tp = 0; tp < CT / 2; ++tp) {
            unsigned vt[4];
            ldsm_x4_t(vt, at_frag(vs, VP, wc, 16 * tp));
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const unsigned pair = vt[2 * h + r];  // tile 2 tp + h, row gr + 8 r
                    const int t = 16 * tp + 8 * h + 2 * tq;
                    float* y = yk[2 * tp + h];
                    y[2 * r] = __bfloat162float(__ushort_as_bfloat16(pair & 0xffffu)) - vec[t] * y[2 * r];
                    y[2 * r + 1] = __bfloat162float(__ushort_as_bfloat16(pair >> 16)) - vec[t + 1] * y[2 * r + 1];
                }
        }

        if (!kDouble) {
            cp_async_wait<1>();  // T'/P' of this chunk have landed (the next chunk's k may be in flight)
            __syncthreads();     // ... for every thread; every warp is done with q and v
            load_qv(chunk + 1, 0);
        }

        // v_new^T = X^T T'^T (every warp of the slab: each needs all of it for its state rows) and
        // o^T += v_new^T P'^T (the warp's own token tiles). T'[i][j] and P'[i][j] vanish for j > i,
        // so the i tiles of depth block jb start at 2 jb.
        float vn[CT][4] = {};
#pragma unroll
        for (int jb = 0; jb < CT / 2; ++jb) {
            unsigned ahi[4], alo[4];
            a_from_c(yk[2 * jb], yk[2 * jb + 1], 1.f, 1.f, 1.f, 1.f, ahi, alo);
#pragma unroll
            for (int ip = jb; ip < CT / 2; ++ip) {
                unsigned bh[4], bl[4];
                ldsm_x4(bh, bt_frag(ms, CP, 16 * jb, 16 * ip));
                ldsm_x4(bl, bt_frag(ms + C * CP, CP, 16 * jb, 16 * ip));
                const unsigned b[2][4] = {{bh[0], bh[1], bl[0], bl[1]}, {bh[2], bh[3], bl[2], bl[3]}};
                float* const acc[2] = {vn[2 * ip], vn[2 * ip + 1]};
                mma_group<2, true>(acc, ahi, alo, b);
            }
        }
#pragma unroll
        for (int i = 0; i < CT; ++i) {
            const int t = 8 * i + 2 * tq;
            const float d0 = vec[2 * C + t], d1 = vec[2 * C + t + 1];
            yq[i][0] *= d0, yq[i][1] *= d1, yq[i][2] *= d0, yq[i][3] *= d1;
        }
#pragma unroll
        for (int jb = 0; jb < CT / 2; ++jb) {
            unsigned ahi[4], alo[4];
            a_from_c(vn[2 * jb], vn[2 * jb + 1], 1.f, 1.f, 1.f, 1.f, ahi, alo);
#pragma unroll
            for (int ip = jb; ip < CT / 2; ++ip) {
                if (!mine(ip)) continue;
                unsigned bh[4], bl[4];
                ldsm_x4(bh, bt_frag(ms + 2 * C * CP, CP, 16 * jb, 16 * ip));
                ldsm_x4(bl, bt_frag(ms + 3 * C * CP, CP, 16 * jb, 16 * ip));
                const unsigned b[2][4] = {{bh[0], bh[1], bl[0], bl[1]}, {bh[2], bh[3], bl[2], bl[3]}};
                float* const acc[2] = {yq[2 * ip], yq[2 * ip + 1]};
                mma_group<2, true>(acc, ahi, alo, b);
            }
        }

        if (!kDouble) {
            __syncthreads();  // every warp is done with T'/P'
            load_m(chunk + 1, 0);
        }

        // o: the warp's token tiles of o^T through its columns of the output tile, then 16-byte rows
        // (its own rows only, so a __syncwarp suffices) to global memory.
#pragma unroll
        for (int ip = 0; ip < CT / 2; ++ip) {
            if (!mine(ip)) continue;
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    os[(16 * ip + 8 * h + 2 * tq + (e & 1)) * VP + wc + gr + 8 * (e >> 1)] =
                        __float2bfloat16_rn(yq[2 * ip + h][e]);
        }
        __syncwarp();
#pragma unroll
        for (int ip = 0; ip < CT / 2; ++ip) {
            if (!mine(ip)) continue;
            const int r = 16 * ip + (lane >> 1), c = wc + 8 * (lane & 1);  // 16 rows x two 16-byte pieces
            if (r < len)
                *reinterpret_cast<uint4*>(o + (static_cast<size_t>(t0 + r) * HV + hv) * V + v0 + c) =
                    *reinterpret_cast<const uint4*>(os + r * VP + c);
        }

        // S^T <- exp(G_last) S^T + (v_new^T diag(c)) K over the warp's rows: depth C (token blocks),
        // k tiles in pairs.
        const float decay = expf(vec[3 * C + C - 1]);
#pragma unroll
        for (int j = 0; j < KT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) st[j][e] *= decay;
#pragma unroll
        for (int tb = 0; tb < CT / 2; ++tb) {
            const int t = 16 * tb + 2 * tq;
            unsigned ahi[4], alo[4];
            a_from_c(vn[2 * tb], vn[2 * tb + 1], vec[C + t], vec[C + t + 1], vec[C + t + 8], vec[C + t + 9], ahi, alo);
#pragma unroll
            for (int kp = 0; kp < (KT + 3) / 4; ++kp) {  // two 16-column k blocks at a time
                if (4 * kp >= kt) break;
                unsigned b0[4], b1[4] = {0u, 0u, 0u, 0u};
                ldsm_x4_t(b0, b_frag(ks, KP, 16 * tb, k0 + 32 * kp));
                if (4 * kp + 2 < kt) ldsm_x4_t(b1, b_frag(ks, KP, 16 * tb, k0 + 32 * kp + 16));
                const unsigned b[4][4] = {{b0[0], b0[1]}, {b0[2], b0[3]}, {b1[0], b1[1]}, {b1[2], b1[3]}};
                float* const acc[4] = {st[4 * kp], st[4 * kp + 1], st[4 * kp + 2], st[4 * kp + 3]};
                mma_group<4, false>(acc, ahi, alo, b);  // k tiles past the warp's rows multiply zeros, never stored
            }
        }
    }
    cp_async_wait<0>();
    if (!has_final) return;
#pragma unroll
    for (int j = 0; j < KT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            if (j < kt) final_state[state_index(j, e)] = st[j][e];
}

#if defined(GDN_SM90A)
// ---------------------------------------------------------------------------------------------
// Fused kernel 2 on sm_90a (H100 / H200; compiled with -arch=sm_90a -DGDN_SM90A by chunk.py):
// gdn_fused_state's algebra with every product a wgmma. One warpgroup (four warps, 64 value
// columns; warp w owns columns 16 w .. 16 w + 15 as in gdn_fused_state) per (sequence, 64 value
// columns, value head). A comes from registers: S^T, X^T and v_new^T split into bf16 hi / lo, the
// very fragments gdn_fused_state feeds mma.sync (wgmma's A fragment is mma.sync's, one warp per
// 16 rows); B (k, q, T', P') from shared memory; the accumulators are mma.sync C fragments too.
// Each phase's products are issued back to back and run asynchronously, so the splits, the X update
// and the output store overlap tensor work instead of sitting between ~500 dependent mma.sync:
//   Y_k, Y_q   2 K / 16 wgmma m64n64k16 each (S split)        | X^T (while Y_q runs)
//   v_new      3 C / 16 m64n64k16 (X and T' split)
//   o, S       3 C / 16 m64n64k16 (v_new and P' split), 2 C / 16 m64nKk16 (v_new diag(c) split)
// Warp specialized: two more warps issue every copy (cp.async into two stages), so the warpgroup's
// instruction stream holds only the products and their fp32 glue.
// B tiles are stored in wgmma's 128-byte swizzle (sw_offset): rows of 128 bytes, 16-byte chunks
// XORed with the row within each 8-row, 1 KiB atom. One [C][K] tile of k serves both K^T (K-major B
// of Y_k) and K (MN-major B of the S update). Without the swizzle, a copy either reads eight rows
// per eight lanes or writes eight chunks into the same banks: 8-way conflicts that took most of the
// shared-memory pipe (ncu, H100, 2026-11-23).
namespace gdn_sm90 {

using gdn_fused::C;
using bf16 = __nv_bfloat16;

// Element offset of (r, c) in a [C][D] bf16 tile in wgmma's 128-byte swizzle: D / 64 column blocks
// of [C][64] (8 KiB each, 1 KiB-aligned), row r at 128 r bytes, its 16-byte chunk j at j ^ (r % 8).
template <int D>
__host__ __device__ constexpr int sw_offset(int r, int c) {
    return (c >> 6) * (C * 64) + r * 64 + ((((c & 63) >> 3) ^ (r & 7)) << 3) + (c & 7);
}

// C rows of D bf16 (global row stride gs elements) into a swizzled tile by one warp; rows at or
// past `valid` are zero-filled. Each instruction moves four 128-byte row pieces: eight lanes read
// one contiguous 128 bytes and write the eight chunks of one shared row, all 32 banks (the swizzle
// is what makes both hold at once); unrolled, so a copy is an address add and the cp.async.
template <int D>
__device__ __forceinline__ void copy_sw(bf16* dst, const bf16* src, int gs, int valid) {
    static_assert(D % 64 == 0, "whole 64-column blocks");
    const int lane = threadIdx.x & 31, c = 8 * (lane & 7), rr = lane >> 3;
#pragma unroll
    for (int h = 0; h < D / 64; ++h)
#pragma unroll
        for (int rb = 0; rb < C / 4; ++rb) {
            const int r = 4 * rb + rr;
            const bool ok = r < valid;
            cp_async16(dst + sw_offset<D>(r, 64 * h + c), ok ? src + r * gs + 64 * h + c : src, ok);
        }
}

// C rows of D bf16 into a row-major tile with row stride ds (ldmatrix operand) by one warp.
template <int D>
__device__ __forceinline__ void copy_plain(bf16* dst, int ds, const bf16* src, size_t gs, int valid) {
    constexpr int P = D / 8, kPass = 32 / P;
    static_assert(32 % P == 0 && C % kPass == 0, "whole rows per instruction");
    const int lane = threadIdx.x & 31, p = lane % P, r0 = lane / P;
#pragma unroll
    for (int i = 0; i < C / kPass; ++i) {
        const int r = r0 + i * kPass;
        const bool ok = r < valid;
        cp_async16(dst + r * ds + 8 * p, ok ? src + r * gs + 8 * p : src, ok);
    }
}

// Named barriers of the producer warp and the consumer warpgroup: bar.arrive signals without
// waiting (release), bar.sync waits for `threads` arrivals (acquire).
__device__ __forceinline__ void bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Four 8 x 8 b16 matrices to shared memory, each transposed: register j of lane l holds the pair
// (row l / 4, columns 2 (l % 4), + 1) of matrix j (an mma C fragment packed to bf16); lane l gives
// the address of stored row l % 8 (= column l % 8 of matrix l / 8).
__device__ __forceinline__ void stsm_x4_t(void* p, unsigned r0, unsigned r1, unsigned r2, unsigned r3) {
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(r0), "r"(r1),
                 "r"(r2), "r"(r3)
                 : "memory");
}
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    const __nv_bfloat162 x = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&x);
}

// wgmma shared-memory matrix descriptor, 128-byte swizzle (layout type 1 in bits 62-63): start
// address, leading- and stride-dimension byte offsets (each >> 4, 14 bits), base offset 0 (the
// swizzle atoms are 1 KiB-aligned). K-major tiles: sbo = 1 KiB between 8-row groups, lbo unused
// (a k16 step stays inside one 128-byte row). MN-major: lbo between 64-column blocks, sbo as K-major.
__device__ __forceinline__ unsigned long long smem_desc(const void* p, unsigned lbo, unsigned sbo) {
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
    return static_cast<unsigned long long>((a >> 4) & 0x3FFFu) |
           (static_cast<unsigned long long>((lbo >> 4) & 0x3FFFu) << 16) |
           (static_cast<unsigned long long>((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// cp.async writes shared memory through the generic proxy and wgmma reads it through the async
// proxy: each writing thread fences after its copies land, before the barrier.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Pin registers at this point of the instruction stream: after a wait, so that no read of an
// accumulator moves above it; before an issue, so that every write to it lands first; and on the
// A fragments after the wait, so that they stay live (unclobbered) while wgmma may read them.
template <int R>
__device__ __forceinline__ void pin(float (&x)[R][4]) {
#pragma unroll
    for (int r = 0; r < R; ++r) asm volatile("" : "+f"(x[r][0]), "+f"(x[r][1]), "+f"(x[r][2]), "+f"(x[r][3])::"memory");
}
template <int R>
__device__ __forceinline__ void pin(unsigned (&x)[R][4]) {
#pragma unroll
    for (int r = 0; r < R; ++r) asm volatile("" : "+r"(x[r][0]), "+r"(x[r][1]), "+r"(x[r][2]), "+r"(x[r][3])::"memory");
}

// d[64 x 64] += A[64 x 16] B[16 x 64]: A from registers (this warp's 16 rows, the mma.sync A
// fragment), B through a shared-memory descriptor, K-major (kTrans = 0) or MN-major (1).
template <int kTrans>
__device__ __forceinline__ void wgmma_n64(float (&d)[8][4], const unsigned (&a)[4], unsigned long long b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, "
                 "%1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
                 "%23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %37;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
                   "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                   "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                   "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
                   "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
                   "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                   "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
                   "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(kTrans));
}

// d[64 x 128] += A[64 x 16] B[16 x 128]: A from registers (this warp's 16 rows, the mma.sync A
// fragment), B through a shared-memory descriptor, K-major (kTrans = 0) or MN-major (1).
template <int kTrans>
__device__ __forceinline__ void wgmma_n128(float (&d)[16][4], const unsigned (&a)[4], unsigned long long b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\nwgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, "
                 "%1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
                 "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, "
                 "%43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, "
                 "%63}, {%64, %65, %66, %67}, %68, p, 1, 1, %69;\n}\n"
                 : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
                   "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
                   "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
                   "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
                   "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
                   "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
                   "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
                   "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),
                   "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
                   "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),
                   "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),
                   "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
                   "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
                   "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
                   "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
                   "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(kTrans));
}



// K-major B (K^T, Q^T, T'^T, P'^T) and MN-major B (K in the state update) over swizzled tiles;
// gdn_wgmma_probe checks both readings on the device.
__device__ __forceinline__ unsigned long long k_desc(const bf16* p) { return smem_desc(p, 16, 1024); }
__device__ __forceinline__ unsigned long long mn_desc(const bf16* p) { return smem_desc(p, C * 128, 1024); }
// The descriptor `elements` bf16 further on: the start address field holds bytes >> 4 and shared
// addresses stay below 2^18 bytes, so the sum never carries out of its 14 bits.
__device__ __forceinline__ unsigned long long desc_at(unsigned long long d, int elements) { return d + (elements >> 3); }

// acc += A B over the C tokens of a [C][C] swizzled B tile (T' or P', K-major) with A and B both
// split: hi hi, lo hi, hi lo for each depth block of 16.
template <int CB, int CT>
__device__ __forceinline__ void split_product(float (&acc)[CT][4], const unsigned (&ah)[CB][4],
                                              const unsigned (&al)[CB][4], unsigned long long bh,
                                              unsigned long long bl) {
#pragma unroll
    for (int jb = 0; jb < CB; ++jb) {
        wgmma_n64<0>(acc, ah[jb], desc_at(bh, sw_offset<C>(0, 16 * jb)));
        wgmma_n64<0>(acc, al[jb], desc_at(bh, sw_offset<C>(0, 16 * jb)));
        wgmma_n64<0>(acc, ah[jb], desc_at(bl, sw_offset<C>(0, 16 * jb)));
    }
}

template <int K>
__device__ __forceinline__ void fused_state(const bf16* __restrict__ q, const bf16* __restrict__ k,
                                            const bf16* __restrict__ v, const bf16* __restrict__ mats,
                                            const float* __restrict__ vecs, const long long* __restrict__ chunk_start,
                                            const int* __restrict__ chunk_len, const int* __restrict__ seq_chunk_off,
                                            const float* __restrict__ initial_state, int has_initial,
                                            int state_v_first, int H, int HV, int V, bf16* __restrict__ o,
                                            float* __restrict__ final_state, int has_final) {
    using namespace gdn_fused;
    constexpr int BV = 64, VP = BV + kPad;
    constexpr int KT = K / 8, KB = K / 16, CT = C / 8, CB = C / 16;
    // Warps 0-3: the consumer warpgroup (all products); warps 4, 5: the producers (all copies: k, q
    // and the vectors; T'/P' and v). Stage s is handed over through named barriers: kFull + s
    // (producers arrive once their copies landed, consumers wait) and kEmpty + s (consumers arrive
    // once done with it, producers wait). One producer warp was too slow: consumers waited for it
    // 18% of the time (ncu, H100, 2026-11-23).
    constexpr int kFull = 1, kEmpty = 3, kPair = 192;
    // Stage (two of them): k, q [C][K] and T'hi, T'lo, P'hi, P'lo [C][C] as swizzled tiles, v
    // [C][VP] row-major (ldmatrix), vectors [4][C] fp32; then the output tile [C][VP]. Every
    // offset is a multiple of 128 bytes.
    constexpr int kKBytes = C * K * 2, kMBytes = C * C * 2, kVBytes = C * VP * 2, kVecBytes = kVecs * C * 4;
    constexpr int kStage = 2 * kKBytes + kMats * kMBytes + kVBytes + kVecBytes;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    auto k_stage = [&](int s) { return reinterpret_cast<bf16*>(smem_raw + s * kStage); };
    auto q_stage = [&](int s) { return reinterpret_cast<bf16*>(smem_raw + s * kStage + kKBytes); };
    auto m_stage = [&](int s, int m) {
        return reinterpret_cast<bf16*>(smem_raw + s * kStage + 2 * kKBytes + m * kMBytes);
    };
    auto v_stage = [&](int s) { return reinterpret_cast<bf16*>(smem_raw + s * kStage + 2 * kKBytes + kMats * kMBytes); };
    auto vec_stage = [&](int s) {
        return reinterpret_cast<float*>(smem_raw + s * kStage + 2 * kKBytes + kMats * kMBytes + kVBytes);
    };
    bf16* os = reinterpret_cast<bf16*>(smem_raw + 2 * kStage);
    if (static_cast<unsigned>(__cvta_generic_to_shared(smem_raw)) & 1023u) __trap();  // swizzle atoms: 1 KiB-aligned

    const int tiles = V / BV;
    const int n = blockIdx.x / tiles, hv = blockIdx.y, hk = hv / (HV / H);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
    const int v0 = (blockIdx.x % tiles) * BV, wc = 16 * warp;  // the CTA's and the warp's first column
    const int first = seq_chunk_off[n], last = seq_chunk_off[n + 1];
    const size_t row_stride = static_cast<size_t>(H) * K;
    // A sequence's chunks are consecutive and C long but for the last (chunk.py's chunk_tables), so
    // a chunk's tokens follow from the sequence's bounds: no table read on each chunk's critical path.
    const long long seq_t0 = last > first ? chunk_start[first] : 0;
    const long long seq_end = last > first ? chunk_start[last - 1] + chunk_len[last - 1] : 0;
    auto chunk_t0 = [&](int chunk) { return seq_t0 + static_cast<long long>(C) * (chunk - first); };
    auto chunk_len_of = [&](int chunk) { return static_cast<int>(min(static_cast<long long>(C), seq_end - chunk_t0(chunk))); };

    if (warp >= 4) {  // the producers: chunk first + i into stage i & 1, once its consumers are done with it
        for (int i = 0; i < last - first; ++i) {
            const int chunk = first + i, s = i & 1;
            if (i >= 2) bar_sync(kEmpty + s, kPair);
            const long long t0 = chunk_t0(chunk);
            const int len = chunk_len_of(chunk);
            const size_t unit = static_cast<size_t>(chunk) * HV + hv;
            if (warp == 4) {
                const size_t row0 = static_cast<size_t>(t0) * row_stride + static_cast<size_t>(hk) * K;
                copy_sw<K>(k_stage(s), k + row0, H * K, len);
                copy_sw<K>(q_stage(s), q + row0, H * K, len);
#pragma unroll
                for (int e = lane; e < kVecs * C / 4; e += 32)
                    cp_async16(vec_stage(s) + 4 * e, vecs + unit * kVecs * C + 4 * e, true);
            } else {
                const bf16* mg = mats + unit * kMats * C * C;
#pragma unroll
                for (int m = 0; m < kMats; ++m) copy_sw<C>(m_stage(s, m), mg + m * C * C, C, C);
                copy_plain<BV>(v_stage(s), VP,
                               v + static_cast<size_t>(t0) * HV * V + static_cast<size_t>(hv) * V + v0,
                               static_cast<size_t>(HV) * V, len);
            }
            cp_async_commit();
            cp_async_wait<0>();
            fence_proxy_async();  // generic-proxy writes that wgmma reads through the async proxy
            bar_arrive(kFull + s, kPair);
        }
        return;
    }

    // S^T: element (column vw + gr + 8 (e >> 1), state row 8 j + 2 tq + (e & 1)), as gdn_fused_state.
    const int vw = v0 + wc;
    const size_t state_base = (static_cast<size_t>(n) * HV + hv) * K * V;
    auto state_index = [&](int j, int e) {
        const int vv = vw + gr + 8 * (e >> 1), kk = 8 * j + 2 * tq + (e & 1);
        return state_base + (state_v_first ? static_cast<size_t>(vv) * K + kk : static_cast<size_t>(kk) * V + vv);
    };
    float st[KT][4];
#pragma unroll
    for (int j = 0; j < KT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) st[j][e] = has_initial ? initial_state[state_index(j, e)] : 0.f;
    // S^T split into bf16 hi / lo, the A fragments of Y_k and Y_q: made before each chunk, from the
    // previous chunk's state update while its output product still runs.
    unsigned sh[KB][4], sl[KB][4];
#pragma unroll
    for (int kb = 0; kb < KB; ++kb) a_from_c(st[2 * kb], st[2 * kb + 1], 1.f, 1.f, 1.f, 1.f, sh[kb], sl[kb]);

    for (int chunk = first; chunk < last; ++chunk) {
        const int i = chunk - first, s = i & 1;
        bar_sync(kFull + s, kPair);  // the producer's copies of this chunk have landed
        const bf16* ks = k_stage(s);
        const bf16* qs = q_stage(s);
        const bf16* vs = v_stage(s);
        const float* vec = vec_stage(s);
        const long long t0 = chunk_t0(chunk);
        const int len = chunk_len_of(chunk);

        // Y_k = S^T K^T and Y_q = S^T Q^T: K-major B, depth block kb = state rows 16 kb .. + 15.
        float yk[CT][4] = {}, yq[CT][4] = {};
        pin(yk);
        pin(yq);
        wg_fence();
        const unsigned long long dk = k_desc(ks), dq = k_desc(qs);
#pragma unroll
        for (int kb = 0; kb < KB; ++kb) {
            wgmma_n64<0>(yk, sh[kb], desc_at(dk, sw_offset<K>(0, 16 * kb)));
            wgmma_n64<0>(yk, sl[kb], desc_at(dk, sw_offset<K>(0, 16 * kb)));
        }
        wg_commit();
#pragma unroll
        for (int kb = 0; kb < KB; ++kb) {
            wgmma_n64<0>(yq, sh[kb], desc_at(dq, sw_offset<K>(0, 16 * kb)));
            wgmma_n64<0>(yq, sl[kb], desc_at(dq, sw_offset<K>(0, 16 * kb)));
        }
        wg_commit();
        // V^T (ldmatrix.trans, as gdn_fused_state) and a, read while the products run.
        unsigned vt[CT / 2][4];
        float2 av[CT];
#pragma unroll
        for (int tp = 0; tp < CT / 2; ++tp) ldsm_x4_t(vt[tp], at_frag(vs, VP, wc, 16 * tp));
#pragma unroll
        for (int i = 0; i < CT; ++i) av[i] = *reinterpret_cast<const float2*>(vec + 8 * i + 2 * tq);
        wg_wait<1>();  // Y_k is in; Y_q may still run
        pin(yk);

        // X^T = V^T - Y_k diag(a), in place of Y_k.
#pragma unroll
        for (int tp = 0; tp < CT / 2; ++tp)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const unsigned pair = vt[tp][2 * h + r];
                    const float2 a = av[2 * tp + h];
                    float* y = yk[2 * tp + h];
                    y[2 * r] = __uint_as_float(pair << 16) - a.x * y[2 * r];
                    y[2 * r + 1] = __uint_as_float(pair & 0xffff0000u) - a.y * y[2 * r + 1];
                }

        wg_wait<0>();  // Y_q is in (it ran while X was computed): S's fragments are free again
        pin(yq);
        pin(sh);
        pin(sl);

        // v_new^T = X^T T'^T: K-major B from T' [i][j] (depth j), both split: hi hi, lo hi, hi lo.
        unsigned xh[CB][4], xl[CB][4];
#pragma unroll
        for (int jb = 0; jb < CB; ++jb) a_from_c(yk[2 * jb], yk[2 * jb + 1], 1.f, 1.f, 1.f, 1.f, xh[jb], xl[jb]);
        float vn[CT][4] = {};
        pin(vn);
        wg_fence();
        // Full n = 64 products although T' and P' are lower triangular: products over column sub-ranges
        // of one accumulator (n = 48, 32, 16) make ptxas serialize every wgmma (C7511), which costs more.
        split_product(vn, xh, xl, k_desc(m_stage(s, 0)), k_desc(m_stage(s, 1)));
        wg_commit();
        // d, c and the chunk's decay, read while v_new runs.
        float2 dv[CT], cv[CT];
#pragma unroll
        for (int i = 0; i < CT; ++i) {
            dv[i] = *reinterpret_cast<const float2*>(vec + 2 * C + 8 * i + 2 * tq);
            cv[i] = *reinterpret_cast<const float2*>(vec + C + 8 * i + 2 * tq);
        }
        const float decay = expf(vec[3 * C + C - 1]);
#pragma unroll
        for (int j = 0; j < KT; ++j)  // S is no operand of v_new: decay it while v_new runs
#pragma unroll
            for (int e = 0; e < 4; ++e) st[j][e] *= decay;
        wg_wait<0>();
        pin(vn);
        pin(xh);
        pin(xl);

        // o^T = Y_q diag(d) + v_new^T P'^T and S^T <- exp(G_last) S^T + v_new^T diag(c) K, issued together.
#pragma unroll
        for (int i = 0; i < CT; ++i) yq[i][0] *= dv[i].x, yq[i][1] *= dv[i].y, yq[i][2] *= dv[i].x, yq[i][3] *= dv[i].y;
        unsigned ph[CB][4], pl[CB][4], ch[CB][4], cl[CB][4];
#pragma unroll
        for (int jb = 0; jb < CB; ++jb) {
            a_from_c(vn[2 * jb], vn[2 * jb + 1], 1.f, 1.f, 1.f, 1.f, ph[jb], pl[jb]);
            a_from_c(vn[2 * jb], vn[2 * jb + 1], cv[2 * jb].x, cv[2 * jb].y, cv[2 * jb + 1].x, cv[2 * jb + 1].y, ch[jb],
                     cl[jb]);
        }
        pin(yq);
        pin(st);
        wg_fence();
        const unsigned long long dkn = mn_desc(ks);
#pragma unroll
        for (int tb = 0; tb < CB; ++tb) {  // depth: tokens 16 tb .. + 15, two 8-row swizzle groups
            const unsigned long long b = desc_at(dkn, sw_offset<K>(16 * tb, 0));
            if constexpr (K == 128) {
                wgmma_n128<1>(st, ch[tb], b);
                wgmma_n128<1>(st, cl[tb], b);
            } else {
                wgmma_n64<1>(st, ch[tb], b);
                wgmma_n64<1>(st, cl[tb], b);
            }
        }
        wg_commit();
        split_product(yq, ph, pl, k_desc(m_stage(s, 2)), k_desc(m_stage(s, 3)));
        wg_commit();
        wg_wait<1>();  // the state update is in; the output product may still run
        pin(st);
        pin(ch);
        pin(cl);
#pragma unroll
        for (int kb = 0; kb < KB; ++kb) a_from_c(st[2 * kb], st[2 * kb + 1], 1.f, 1.f, 1.f, 1.f, sh[kb], sl[kb]);
        wg_wait<0>();
        pin(yq);
        pin(ph);
        pin(pl);
        if (i + 2 < last - first) bar_arrive(kEmpty + s, kPair);  // stage s is free for chunk + 2

        // o: the warp's columns of the output tile (o^T fragments stored transposed: four 8 x 8 blocks
        // of token tiles 2 ip, 2 ip + 1 and column halves 0, 1 per stmatrix), then 16-byte rows to
        // global memory (its own columns only, so a __syncwarp suffices).
#pragma unroll
        for (int ip = 0; ip < CT / 2; ++ip) {
            const int j = lane >> 3;  // the block this lane addresses: token tile 2 ip + j / 2, half j % 2
            stsm_x4_t(os + (16 * ip + 8 * (j >> 1) + (lane & 7)) * VP + wc + 8 * (j & 1),
                      pack_bf16(yq[2 * ip][0], yq[2 * ip][1]), pack_bf16(yq[2 * ip][2], yq[2 * ip][3]),
                      pack_bf16(yq[2 * ip + 1][0], yq[2 * ip + 1][1]), pack_bf16(yq[2 * ip + 1][2], yq[2 * ip + 1][3]));
        }
        __syncwarp();
#pragma unroll
        for (int ip = 0; ip < CT / 2; ++ip) {
            const int r = 16 * ip + (lane >> 1), c = wc + 8 * (lane & 1);
            if (r < len)
                *reinterpret_cast<uint4*>(o + (static_cast<size_t>(t0 + r) * HV + hv) * V + v0 + c) =
                    *reinterpret_cast<const uint4*>(os + r * VP + c);
        }
    }
    if (!has_final) return;
#pragma unroll
    for (int j = 0; j < KT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) final_state[state_index(j, e)] = st[j][e];
}

}  // namespace gdn_sm90

#define GDN_FUSED_STATE_SM90_PARAMS                                                                              \
    const __nv_bfloat16 *__restrict__ q, const __nv_bfloat16 *__restrict__ k, const __nv_bfloat16 *__restrict__ v, \
        const __nv_bfloat16 *__restrict__ mats, const float *__restrict__ vecs,                                  \
        const long long *__restrict__ chunk_start, const int *__restrict__ chunk_len,                            \
        const int *__restrict__ seq_chunk_off, const float *__restrict__ initial_state, int has_initial,         \
        int state_v_first, int H, int HV, int K, int V, __nv_bfloat16 *__restrict__ o,                           \
        float *__restrict__ final_state, int has_final
#define GDN_FUSED_STATE_SM90_ARGS                                                                               \
    q, k, v, mats, vecs, chunk_start, chunk_len, seq_chunk_off, initial_state, has_initial, state_v_first, H, HV, V, \
        o, final_state, has_final
// The launcher's entry points (unmangled names; K is a template constant for the register arrays,
// and the argument list is gdn_fused_state's, K included, so one launch call serves both kernels).
extern "C" __global__ void __launch_bounds__(192, 1) gdn_fused_state_sm90_k128(GDN_FUSED_STATE_SM90_PARAMS) {
    (void)K;
    gdn_sm90::fused_state<128>(GDN_FUSED_STATE_SM90_ARGS);
}
extern "C" __global__ void __launch_bounds__(192, 1) gdn_fused_state_sm90_k64(GDN_FUSED_STATE_SM90_PARAMS) {
    (void)K;
    gdn_sm90::fused_state<64>(GDN_FUSED_STATE_SM90_ARGS);
}
#undef GDN_FUSED_STATE_SM90_PARAMS
#undef GDN_FUSED_STATE_SM90_ARGS

// Layout probe for the tests: tile [64][128] bf16 row-major (global) goes to shared memory swizzled
// (sw_offset), a [64][16] bf16 row-major is the A operand. d1 [64][64] = a tile[:, 80 : 96]^T (K-major
// B: second 64-column block, k-step 1 in it; descriptor offsets lbo_k, sbo_k); d2 [64][128] =
// a tile[16 : 32, :] (MN-major B, token step 1, offsets lbo_mn, sbo_mn). One warpgroup.
extern "C" __global__ void __launch_bounds__(128) gdn_wgmma_probe(const __nv_bfloat16* __restrict__ a,
                                                                   const __nv_bfloat16* __restrict__ tile,
                                                                   float* __restrict__ d1, float* __restrict__ d2,
                                                                   int lbo_k, int sbo_k, int lbo_mn, int sbo_mn) {
    using namespace gdn_sm90;
    __shared__ __align__(1024) bf16 ts[64 * 128];
    if (threadIdx.x < 32) copy_sw<128>(ts, tile, 128, 64);
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
    unsigned af[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const int row = 16 * warp + gr + 8 * (r & 1), col = 2 * tq + 8 * (r >> 1);
        af[r] = *reinterpret_cast<const unsigned*>(a + row * 16 + col);
    }
    float x1[8][4] = {}, x2[16][4] = {};
    pin(x1);
    pin(x2);
    wg_fence();
    wgmma_n64<0>(x1, af, smem_desc(ts + sw_offset<128>(0, 80), lbo_k, sbo_k));
    wgmma_n128<1>(x2, af, smem_desc(ts + sw_offset<128>(16, 0), lbo_mn, sbo_mn));
    wg_commit();
    wg_wait<0>();
    pin(x1);
    pin(x2);
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int row = 16 * warp + gr + 8 * (e >> 1), col = 8 * j + 2 * tq + (e & 1);
            if (j < 8) d1[row * 64 + col] = x1[j][e];
            d2[row * 128 + col] = x2[j][e];
        }
}
#endif  // GDN_SM90A

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
#define GDN_FUSED_STATE_ARGS                                                                        \
    const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const float*, \
        const long long*, const int*, const int*, const float*, int, int, int, int, int, int,             \
        __nv_bfloat16*, float*, int
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
template __global__ void gdn_fused_state<1, 1>(GDN_FUSED_STATE_ARGS);
template __global__ void gdn_fused_state<2, 1>(GDN_FUSED_STATE_ARGS);
template __global__ void gdn_fused_state<4, 1>(GDN_FUSED_STATE_ARGS);
template __global__ void gdn_fused_state<2, 2>(GDN_FUSED_STATE_ARGS);
#undef GDN_CHUNK_INSTANTIATE_ALL
#undef GDN_CHUNK_INSTANTIATE_STATE
#undef GDN_CHUNK_INSTANTIATE
#undef GDN_FUSED_STATE_ARGS
#endif
