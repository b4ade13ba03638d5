// The fused path's state kernel on sm_90a wgmma (H100 / H200), launched after gdn_fused_prep
// (chunk_fused_prep.cu). Built for sm_90a only, by chunk.py through NVRTC with -arch=sm_90a
// -DGDN_SM90A (cupy_kernels/sources.py: sm90a_module); tests/cuda/wgmma_probe.cu checks the
// shared-memory descriptors it relies on.

#include "chunk_common.cuh"

#if !defined(GDN_SM90A)
#error "chunk_wgmma.cu is built for sm_90a only: -arch=sm_90a -DGDN_SM90A (see sources.sm90a_module)"
#endif

// ---------------------------------------------------------------------------------------------
// Fused kernel 2 on sm_90a (H100 / H200):
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
// tests/cuda/wgmma_probe.cu checks both readings on the device.
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

// kOut = false: the state-only form for the context-parallel passes that build each segment's B and M
// (context_parallel.py), whose output is never read: no Y_q, no output product, no q or P copies
// (28 of a chunk's 72 m64n64k16-equivalents, 32 of its 73 KiB of copies), nothing stored to o.
// kValues = false (with kOut = false): the transition pass, whose values are zero: v is not read
// (the launcher then allocates no zero values, a tensor of v's size).
template <int K, bool kOut, bool kValues = true>
__device__ __forceinline__ void fused_state(const bf16* __restrict__ q, const bf16* __restrict__ k,
                                            const bf16* __restrict__ v, const bf16* __restrict__ mats,
                                            const float* __restrict__ vecs, const long long* __restrict__ chunk_start,
                                            const int* __restrict__ chunk_len, const int* __restrict__ seq_chunk_off,
                                            const float* __restrict__ initial_state, int has_initial,
                                            int state_v_first, int H, int HV, int V, bf16* __restrict__ o,
                                            float* __restrict__ final_state, int has_final) {
    using namespace gdn_fused;
    constexpr int BV = kWgmmaColumns, VP = BV + kPad;
    constexpr int KT = K / 8, KB = K / 16, CT = C / 8, CB = C / 16;
    // Warps 0-3: the consumer warpgroup (all products); warps 4, 5: the producers (all copies: k, q
    // and the vectors; T'/P' and v). Stage s is handed over through named barriers: kFull + s
    // (producers arrive once their copies landed, consumers wait) and kEmpty + s (consumers arrive
    // once done with it, producers wait). One producer warp was too slow: consumers waited for it
    // 18% of the time (ncu, H100, 2026-11-23).
    constexpr int kFull = 1, kEmpty = 3, kPair = kWgmmaThreads;
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
    static_assert(2 * kStage + C * VP * 2 == gdn_layout::wgmma_state_smem_bytes(K), "layout: chunk_common.cuh");
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
                if constexpr (kOut) copy_sw<K>(q_stage(s), q + row0, H * K, len);
#pragma unroll
                for (int e = lane; e < kVecs * C / 4; e += 32)
                    cp_async16(vec_stage(s) + 4 * e, vecs + unit * kVecs * C + 4 * e, true);
            } else {
                const bf16* mg = mats + unit * kMats * C * C;
                constexpr int kCopied = kOut ? kMats : 2;  // T' hi / lo, then P' hi / lo (the output's)
#pragma unroll
                for (int m = 0; m < kCopied; ++m) copy_sw<C>(m_stage(s, m), mg + m * C * C, C, C);
                if constexpr (kValues)
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
        if constexpr (kOut) {
#pragma unroll
            for (int kb = 0; kb < KB; ++kb) {
                wgmma_n64<0>(yq, sh[kb], desc_at(dq, sw_offset<K>(0, 16 * kb)));
                wgmma_n64<0>(yq, sl[kb], desc_at(dq, sw_offset<K>(0, 16 * kb)));
            }
            wg_commit();
        }
        // V^T (ldmatrix.trans, as gdn_fused_state) and a, read while the products run.
        unsigned vt[CT / 2][4] = {};
        float2 av[CT];
        if constexpr (kValues) {
#pragma unroll
            for (int tp = 0; tp < CT / 2; ++tp) ldsm_x4_t(vt[tp], at_frag(vs, VP, wc, 16 * tp));
        }
#pragma unroll
        for (int i = 0; i < CT; ++i) av[i] = *reinterpret_cast<const float2*>(vec + 8 * i + 2 * tq);
        wg_wait<kOut ? 1 : 0>();  // Y_k is in; Y_q may still run
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
        if constexpr (kOut) {
#pragma unroll
            for (int i = 0; i < CT; ++i)
                yq[i][0] *= dv[i].x, yq[i][1] *= dv[i].y, yq[i][2] *= dv[i].x, yq[i][3] *= dv[i].y;
        }
        unsigned ph[CB][4], pl[CB][4], ch[CB][4], cl[CB][4];
#pragma unroll
        for (int jb = 0; jb < CB; ++jb) {
            if constexpr (kOut) a_from_c(vn[2 * jb], vn[2 * jb + 1], 1.f, 1.f, 1.f, 1.f, ph[jb], pl[jb]);
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
        if constexpr (kOut) {
            split_product(yq, ph, pl, k_desc(m_stage(s, 2)), k_desc(m_stage(s, 3)));
            wg_commit();
        }
        wg_wait<kOut ? 1 : 0>();  // the state update is in; the output product may still run
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

        if constexpr (kOut) {
            // o: the warp's columns of the output tile (o^T fragments stored transposed: four 8 x 8 blocks
            // of token tiles 2 ip, 2 ip + 1 and column halves 0, 1 per stmatrix), then 16-byte rows to
            // global memory (its own columns only, so a __syncwarp suffices).
#pragma unroll
            for (int ip = 0; ip < CT / 2; ++ip) {
                const int j = lane >> 3;  // the block this lane addresses: token tile 2 ip + j / 2, half j % 2
                const float* lo = yq[2 * ip];
                const float* hi = yq[2 * ip + 1];
                stsm_x4_t(os + (16 * ip + 8 * (j >> 1) + (lane & 7)) * VP + wc + 8 * (j & 1), pack_bf16(lo[0], lo[1]),
                          pack_bf16(lo[2], lo[3]), pack_bf16(hi[0], hi[1]), pack_bf16(hi[2], hi[3]));
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
// and the argument list is gdn_fused_state's, K included, so one launch call serves every kernel):
// the output forms, the state-only forms (o neither read nor written: the context-parallel B pass)
// and the transition forms (state only, zero values, v not read: the M pass).
#define GDN_FUSED_STATE_SM90_ENTRY(NAME, ...)                                  \
    extern "C" __global__ void __launch_bounds__(gdn_fused::kWgmmaThreads, 1) \
        NAME(GDN_FUSED_STATE_SM90_PARAMS) {                                    \
        (void)K;                                                               \
        gdn_sm90::fused_state<__VA_ARGS__>(GDN_FUSED_STATE_SM90_ARGS);         \
    }
GDN_FUSED_STATE_SM90_ENTRY(gdn_fused_state_sm90_k128, 128, true)
GDN_FUSED_STATE_SM90_ENTRY(gdn_fused_state_sm90_k64, 64, true)
GDN_FUSED_STATE_SM90_ENTRY(gdn_fused_state_sm90_k128_state_only, 128, false)
GDN_FUSED_STATE_SM90_ENTRY(gdn_fused_state_sm90_k64_state_only, 64, false)
GDN_FUSED_STATE_SM90_ENTRY(gdn_fused_state_sm90_k128_transition, 128, false, false)
GDN_FUSED_STATE_SM90_ENTRY(gdn_fused_state_sm90_k64_transition, 64, false, false)
#undef GDN_FUSED_STATE_SM90_ENTRY
#undef GDN_FUSED_STATE_SM90_PARAMS
#undef GDN_FUSED_STATE_SM90_ARGS
