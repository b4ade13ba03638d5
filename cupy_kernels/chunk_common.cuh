// Shared by the three chunked (WY/UT) Gated DeltaNet forward paths; each path is one source file
// that includes this header, compiled on its own (cupy_kernels/chunk.py builds only the kernels of
// the path a call takes):
//
//   chunk_three_kernel.cu  gdn_chunk_intra, gdn_chunk_state, gdn_chunk_output: any input type,
//                          C = 16, 32, 64, plain FP32 or tensor-core (TC) products.
//   chunk_fused_prep.cu    gdn_fused_prep: the first kernel of both fused paths.
//   chunk_fused.cu         gdn_fused_state<W, KS>: the fused path's state kernel on mma.sync.
//   chunk_wgmma.cu         gdn_fused_state_sm90_k64 / _k128: the same on sm_90a wgmma.
//
// Everything here is shared by at least two of those files: the input conventions (element types,
// FLA's in-kernel gate options), the PTX wrappers, the bf16 split, the fused path's constants and
// fragment helpers, and the dynamic shared memory of every kernel (the launcher's copy of the
// latter is cupy_kernels/layout.py; tests/test_kernel_layout.py compiles these with nvcc and
// compares). Cost model and measurements: CHUNK_NOTES.md.
//
// Input element type T is float, __half or __nv_bfloat16; g and beta are float or T (gate_flags
// bit 0: g is T, bit 1: beta is T); bits 2-4 select FLA's in-kernel gate options (native_gate,
// native_beta). Metadata (chunk tables) is built by the launcher from validated offsets: chunks
// never straddle sequences, and a ragged last chunk is masked.

#ifndef GDN_CHUNK_COMMON_CUH
#define GDN_CHUNK_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace gdn_chunk {

constexpr int kThreads = 256;
constexpr int kStateTile = 16;   // V columns per CTA in the state-passing kernel
constexpr int kOutTile = 64;     // V columns per pass in the output kernel
constexpr float kL2NormEps = 1e-6f;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

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

}  // namespace gdn_chunk

// ---------------------------------------------------------------------------------------------
// PTX wrappers. mma.sync bf16 m16n8k16 fragment layouts: see the tensor-core comment in
// chunk_three_kernel.cu.

// d += a b.
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    // Not volatile: a pure function of its registers, so the compiler may interleave independent MMAs.
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Wait until at most N of this thread's most recent groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
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

namespace gdn_chunk {

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

}  // namespace gdn_chunk

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

namespace gdn_fused {

constexpr int C = 64;             // chunk size of the fused path
constexpr int kPad = 8;           // bf16 row padding: 16 bytes, so ldmatrix rows hit distinct banks
constexpr int CP = C + kPad;      // row stride of the C x C operands in shared memory
constexpr int kMaxK = 128;        // state rows; bounds the registers that hold S
constexpr int kMats = 4;          // T'hi, T'lo, P'hi, P'lo
constexpr int kVecs = 4;          // a, c, d, G
constexpr int kWgmmaColumns = 64;  // value columns per CTA of the sm_90a state kernel (one warpgroup)
constexpr int kWgmmaThreads = 192;  // threads of that kernel: a consumer warpgroup and two producer warps

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

// A fragment (16 x 16, depth block kb) from two C-fragment tiles in registers: the fp32 pairs of
// tiles 2 kb and 2 kb + 1, split into bf16 hi / lo (the register layouts of C and A agree).
__device__ __forceinline__ void a_from_c(const float (&c0)[4], const float (&c1)[4], float scale0, float scale1,
                                         float scale2, float scale3, unsigned (&hi)[4], unsigned (&lo)[4]) {
    gdn_chunk::split_pair<true>(c0[0] * scale0, c0[1] * scale1, hi[0], lo[0]);
    gdn_chunk::split_pair<true>(c0[2] * scale0, c0[3] * scale1, hi[1], lo[1]);
    gdn_chunk::split_pair<true>(c1[0] * scale2, c1[1] * scale3, hi[2], lo[2]);
    gdn_chunk::split_pair<true>(c1[2] * scale2, c1[3] * scale3, hi[3], lo[3]);
}

}  // namespace gdn_fused

// ---------------------------------------------------------------------------------------------
// Dynamic shared memory of each kernel in bytes, as its carve-up lays it out (the comment above
// each kernel gives the layout). cupy_kernels/layout.py holds the launcher's copy;
// tests/test_kernel_layout.py compiles these with nvcc and checks that both agree.
namespace gdn_layout {

__host__ __device__ constexpr int max_int(int a, int b) { return a > b ? a : b; }

// gdn_chunk_intra: xs C * (max(K, V) | 1), A and T C * (C + 1) each, tmp C * C / 4, 6 vectors of C (floats).
__host__ __device__ constexpr int chunk_intra_smem_bytes(int C, int K, int V) {
    return 4 * (C * (max_int(K, V) | 1) + 2 * C * (C + 1) + C * C / 4 + 6 * C);
}
// gdn_chunk_state: W and Kd C * KP each (KP = K, or K + 4 with TC), U and v_new C * kStateTile each,
// S K * kStateTile (floats).
__host__ __device__ constexpr int chunk_state_smem_bytes(int C, int K, bool tc) {
    return 4 * (2 * C * (tc ? K + 4 : K) + 2 * C * gdn_chunk::kStateTile + K * gdn_chunk::kStateTile);
}
// gdn_chunk_output: qs C * KS (KS = K | 1), xs max(C * KS, kOutTile (K + C)), P C * (C + 1), 2 vectors of C.
__host__ __device__ constexpr int chunk_output_smem_bytes(int C, int K) {
    return 4 * (C * (K | 1) + max_int(C * (K | 1), gdn_chunk::kOutTile * (K + C)) + C * (C + 1) + 2 * C);
}
// gdn_fused_prep: G [C] fp64; g, beta, rk, rq [C] fp32; A [C][C + 1] fp32; then k and q [C][K + kPad]
// bf16, whose space T [C][C + 1] and tmp [C * C / 4] (fp32) take over.
__host__ __device__ constexpr int fused_prep_smem_bytes(int K) {
    using namespace gdn_fused;
    return (2 * C + 4 * C + C * (C + 1)) * 4 + max_int(2 * C * (K + kPad) * 2, (C * (C + 1) + C * C / 4) * 4);
}
// gdn_fused_state<W, KS>: k + vectors double-buffered; q, v, T'/P' single-buffered (KS = 1) or
// double-buffered (KS = 2); the output tile [C][16 W + kPad]; with KS = 2 an exchange buffer of
// 2 (C / 8) 4 floats a lane per warp.
__host__ __device__ constexpr int fused_state_smem_bytes(int K, int W, int KS) {
    using namespace gdn_fused;
    const int kp = K + kPad, vp = 16 * W + kPad;
    const int k_and_vectors = C * kp * 2 + kVecs * C * 4;
    const int q_v_mats = (C * kp * 2 + C * vp * 2 + kMats * C * CP * 2) * (KS > 1 ? 2 : 1);
    const int exchange = KS > 1 ? W * KS * C * 32 * 4 : 0;
    return 2 * k_and_vectors + q_v_mats + C * vp * 2 + exchange;
}
// gdn_fused_state_sm90_k<K>: two stages of k, q [C][K], T'hi, T'lo, P'hi, P'lo [C][C] (swizzled, no
// padding), v [C][kWgmmaColumns + kPad] and the vectors [4][C] fp32; then the output tile.
__host__ __device__ constexpr int wgmma_state_smem_bytes(int K) {
    using namespace gdn_fused;
    const int vp = kWgmmaColumns + kPad;
    return 2 * (2 * C * K * 2 + kMats * C * C * 2 + C * vp * 2 + kVecs * C * 4) + C * vp * 2;
}

}  // namespace gdn_layout

#endif  // GDN_CHUNK_COMMON_CUH
