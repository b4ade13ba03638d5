// The fused path's state kernel on mma.sync (bf16 inputs, C = 64, K a multiple of 16 up to 128, V a
// multiple of 16): gdn_fused_state<W, KS>, launched after gdn_fused_prep (chunk_fused_prep.cu). The
// algebra of the fused path is in chunk_common.cuh. On sm_90 with K in (64, 128) and V % 64 == 0
// the launcher takes chunk_wgmma.cu's kernel instead.

#include "chunk_common.cuh"

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

#ifndef __CUDACC_RTC__
// Standalone nvcc build (CI): instantiate every form the launcher picks, so that each is compiled and checked.
#define GDN_FUSED_STATE_ARGS                                                                        \
    const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const float*, \
        const long long*, const int*, const int*, const float*, int, int, int, int, int, int,             \
        __nv_bfloat16*, float*, int
template __global__ void gdn_fused_state<1, 1>(GDN_FUSED_STATE_ARGS);
template __global__ void gdn_fused_state<2, 1>(GDN_FUSED_STATE_ARGS);
template __global__ void gdn_fused_state<4, 1>(GDN_FUSED_STATE_ARGS);
template __global__ void gdn_fused_state<2, 2>(GDN_FUSED_STATE_ARGS);
#undef GDN_FUSED_STATE_ARGS
#endif
