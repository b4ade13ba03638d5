// EXPERIMENTAL, not built, launched or tested by the product: the persistent decode kernel of the
// decode variants "narrow-cs-pf" and "wide-cs-pf", as it was in cupy_kernels/recurrent.cu until
// it left the product (it measured 5-13 points slower than the default "wide-cs": NOTES.md beside
// this file). Kept so that the design and its measurements can be picked up again.
//
// It is gdn::recurrent_kernel's per-item work (a copy of it, minus prefill and speculative
// decoding) inside a persistent loop, and uses recurrent.cu's helpers, which it includes; the
// launcher side it needs is in decode_variants.py (beside this file). Compiles standalone with
// nvcc -arch=sm_90 -std=c++17 -c (checked when it moved here, not since).

#include "../recurrent.cu"

namespace gdn {
// ---------------------------------------------------------------------------------------------
// Persistent decode kernel (T <= 1 per sequence, MODE_DECODE only): decode variants "*-pf".
//
// The grid is sized by the launcher to the resident warps (SMs x CTAs/SM x 4 warps); each warp
// loops over work items item = warp, warp + stride, ... (item = (n, hv, vtile), the same
// numbering as recurrent_kernel's warps, Params::total_warps of them). The state tile of the
// NEXT item is loaded into a second register tile (nx) before the current item is computed and
// stored, so every warp always has one tile of state loads in flight, like a copy loop, and no
// CTA launch/exit gaps or partial last wave separate the items. The pool slot of the item after
// next is loaded one iteration ahead too, so the next tile's addresses never wait on it.
// Per item the work and the checks are recurrent_kernel's: bad cu_seqlens / slots are reported
// and never used as an address (a tile prefetched for an item whose cu_seqlens turn out bad was
// read through its own in-bounds slot, and is dropped). Two tiles per lane: the narrow tiling
// (32 + 32 floats) keeps the wide kernel's register count; the wide one (64 + 64) needs MINB 2.
template <int DT, typename AccT, bool VFIRST, int LC, int AC, int BR, bool CS, int MINB>
__global__ void __launch_bounds__(128, MINB) decode_persistent_kernel(const Params p) {
    using In = typename Storage<DT>::type;
    constexpr int ODT = sizeof(AccT) == 8 ? F64 : DT;
    using Out = typename Storage<ODT>::type;
    constexpr int VW = 16 / sizeof(AccT);
    constexpr int LR = 32 / LC;
    constexpr int NQK = VFIRST ? AC * VW : BR;
    constexpr int NV = VFIRST ? BR : AC * VW;
    constexpr int WV = VFIRST ? LR * BR : VW * LC * AC;
    constexpr int KFIRST_BIT = VFIRST ? 1 : LC;
    constexpr int KLAST_BIT = VFIRST ? LC : 32;
    static_assert(LC * LR == 32, "LC must divide 32");

    const long long stride = static_cast<long long>(gridDim.x) * (blockDim.x >> 5);
    long long w = static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const long long total = p.total_warps;
    if (w >= total) return;  // whole warp exits together
    const int lane = threadIdx.x & 31;
    const int lc = lane % LC, lr = lane / LC;
    const int HV = static_cast<int>(p.HV), K = static_cast<int>(p.K), V = static_cast<int>(p.V);
    const int dcodes = static_cast<int>(p.dtypes);
    const int g_code = dcodes & 15, b_code = (dcodes >> 4) & 15, idx_code = (dcodes >> 16) & 15;
    const bool l2norm = p.flags & FLAG_L2NORM, gate_in_kernel = p.flags & FLAG_GATE_IN_KERNEL;
    const bool beta_sigmoid = p.flags & FLAG_BETA_SIGMOID, neg_eigval = p.flags & FLAG_NEG_EIGVAL;
    const bool state_vec = p.flags & FLAG_STATE_VEC, qk_vec = p.flags & FLAG_QK_VEC,
               v_vec = p.flags & FLAG_V_VEC, o_vec = p.flags & FLAG_O_VEC;
    const bool pool = p.slot_mode == 1;
    const int row_limit = VFIRST ? V : K, col_limit = VFIRST ? K : V;
    const long long head_elems = static_cast<long long>(K) * V;
    const In* const qp = static_cast<const In*>(p.q);
    const In* const kp = static_cast<const In*>(p.k);
    const In* const vp = static_cast<const In*>(p.v);
    Out* const o = static_cast<Out*>(p.o);

    // the raw (unvalidated) state slot of an item's sequence: slot_idx[n] for a pool, else n
    auto slot_raw = [&](long long item) -> long long {
        const long long n = item / p.vtiles / HV;
        return pool ? load_index(p.slot_idx, n, idx_code) : n;
    };
    // an item's state tile; a slot outside [0, num_slots) (padding or an error) is never read
    auto load_tile = [&](AccT (&dst)[BR][AC][VW], long long item, long long slot) {
        const int v0 = static_cast<int>(item % p.vtiles) * WV;
        const int hv = static_cast<int>((item / p.vtiles) % HV);
        const int row0 = VFIRST ? v0 : 0, col0 = VFIRST ? 0 : v0;
        const bool ok = p.state_in != nullptr && slot >= 0 && slot < p.num_slots;
        const AccT* base = ok ? static_cast<const AccT*>(p.state_in) + (slot * HV + hv) * head_elems : nullptr;
#pragma unroll
        for (int bb = 0; bb < BR; ++bb) {
            const int r = row0 + lr + LR * bb;
#pragma unroll
            for (int a = 0; a < AC; ++a) {
                const int c = col0 + VW * (lc + LC * a);
                if (base != nullptr && r < row_limit) {
                    load_vec<AccT, VW, CS>(dst[bb][a], base + r * col_limit, c, col_limit, state_vec);
                } else {
#pragma unroll
                    for (int j = 0; j < VW; ++j) dst[bb][a][j] = AccT(0);
                }
            }
        }
    };

    AccT nx[BR][AC][VW];
    long long slot = slot_raw(w);
    load_tile(nx, w, slot);
    long long slot_next = w + stride < total ? slot_raw(w + stride) : -1;

    for (; w < total; w += stride) {
        const int vt = static_cast<int>(w % p.vtiles);
        const long long nh = w / p.vtiles;
        const int hv = static_cast<int>(nh % HV);
        const long long n = nh / HV;
        const int hq = hv / (HV / static_cast<int>(p.H));
        const int v0 = vt * WV;
        const int row0 = VFIRST ? v0 : 0, col0 = VFIRST ? 0 : v0;
        const int o_row = hv * V;
        auto v_of = [&](int m) -> int {
            return VFIRST ? v0 + lr + LR * m : v0 + VW * (lc + LC * (m / VW)) + m % VW;
        };

        // token range (as recurrent_kernel): a bad offset is reported and the item skipped
        long long b = n, t_begin = 0, t_end = p.T;
        bool skip = false;
        if (p.cu_seqlens != nullptr) {
            const int cu_code = (dcodes >> 24) & 15;
            b = 0;
            t_begin = load_index(p.cu_seqlens, n, cu_code);
            t_end = load_index(p.cu_seqlens, n + 1, cu_code);
            if (t_begin < 0 || t_end > p.T || t_end < t_begin || (n == 0 && t_begin != 0) ||
                (n == p.N - 1 && t_end != p.T)) {
                report(p, ERR_CU_SEQLENS);
                skip = true;
            }
        }
        if (!skip && pool && slot >= p.num_slots) report(p, ERR_SLOT_INDICES);
        const bool padding = pool && (slot < 0 || slot >= p.num_slots);

        // this item's raw inputs, issued before waiting for its state tile
        In qr[NQK], kr[NQK], vr[NV];
        unsigned long long gr = 0, br = 0;
        const bool work = !skip && !padding && t_begin < t_end;
        if (work) {
            const long long t = t_begin;
            const In* qrow = qp + b * p.q_sb + t * p.q_st + hq * p.q_sh;
            const In* krow = kp + b * p.k_sb + t * p.k_st + hq * p.k_sh;
            const In* vrow = vp + b * p.v_sb + t * p.v_st + hv * p.v_sh;
            if constexpr (VFIRST) {
#pragma unroll
                for (int a = 0; a < AC; ++a) {
                    const int kk = VW * (lc + LC * a);
                    In tq[VW], tk[VW];
                    load_vec<In, VW>(tq, qrow, kk, K, qk_vec);
                    load_vec<In, VW>(tk, krow, kk, K, qk_vec);
#pragma unroll
                    for (int j = 0; j < VW; ++j) {
                        qr[a * VW + j] = tq[j];
                        kr[a * VW + j] = tk[j];
                    }
                }
#pragma unroll
                for (int m = 0; m < NV; ++m) vr[m] = v_of(m) < V ? vrow[v_of(m)] : In(0);
            } else {
#pragma unroll
                for (int bb = 0; bb < BR; ++bb) {
                    const int kk = lr + LR * bb;
                    qr[bb] = kk < K ? qrow[kk] : In(0);
                    kr[bb] = kk < K ? krow[kk] : In(0);
                }
#pragma unroll
                for (int a = 0; a < AC; ++a) {
                    In tv[VW];
                    load_vec<In, VW>(tv, vrow, v0 + VW * (lc + LC * a), V, v_vec);
#pragma unroll
                    for (int j = 0; j < VW; ++j) vr[a * VW + j] = tv[j];
                }
            }
            gr = load_raw(p.g, b * p.g_sb + t * p.g_st + hv * p.g_sh, g_code);
            br = load_raw(p.beta, b * p.b_sb + t * p.b_st + hv * p.b_sh, b_code);
        }

        // take the prefetched tile, then start the next item's tile and the slot after it
        AccT s[BR][AC][VW];
#pragma unroll
        for (int bb = 0; bb < BR; ++bb)
#pragma unroll
            for (int a = 0; a < AC; ++a)
#pragma unroll
                for (int j = 0; j < VW; ++j) s[bb][a][j] = nx[bb][a][j];
        const long long write_slot = slot;
        if (w + stride < total) {
            slot = slot_next;
            load_tile(nx, w + stride, slot);
            slot_next = w + 2 * stride < total ? slot_raw(w + 2 * stride) : -1;
        }

        if (padding && !skip) {
            // padded request: zero output rows, no state touched
            for (long long t = t_begin; t < t_end; ++t) {
                Out* orow = o + (b * p.T + t) * HV * V + o_row;
                if (VFIRST ? lc == 0 : lr == 0) {
#pragma unroll
                    for (int m = 0; m < NV; ++m)
                        if (v_of(m) < V) orow[v_of(m)] = from_acc<ODT, AccT>(AccT(0));
                }
            }
        }
        if (skip || padding) continue;

        if (work) {
            AccT neg_A = AccT(0), dt_bias = AccT(0);
            if (gate_in_kernel) {
                neg_A = -exp_(raw_to<AccT>(load_raw(p.A_log, hv, (dcodes >> 8) & 15), (dcodes >> 8) & 15));
                if (p.dt_bias != nullptr)
                    dt_bias = raw_to<AccT>(load_raw(p.dt_bias, hv, (dcodes >> 12) & 15), (dcodes >> 12) & 15);
            }
            AccT q[NQK], k[NQK], vv[NV];
#pragma unroll
            for (int i = 0; i < NQK; ++i) {
                q[i] = to_acc<DT, AccT>(qr[i]);
                k[i] = to_acc<DT, AccT>(kr[i]);
            }
#pragma unroll
            for (int m = 0; m < NV; ++m) vv[m] = to_acc<DT, AccT>(vr[m]);
            AccT g = raw_to<AccT>(gr, g_code), beta = raw_to<AccT>(br, b_code);
            if (gate_in_kernel) {
                const AccT x = g + dt_bias;
                const AccT softplus = x > AccT(20) ? x : log1p_(exp_(x));
                g = neg_A * softplus;
            }
            if (beta_sigmoid) {
                const AccT e = exp_(-fabs(beta));
                beta = beta >= AccT(0) ? AccT(1) / (AccT(1) + e) : e / (AccT(1) + e);
                if (neg_eigval) beta *= AccT(2);
            }
            const AccT alpha = exp_(g);
            AccT qq = 0, kk2 = 0, qk = 0;
#pragma unroll
            for (int i = 0; i < NQK; ++i) {
                qq += q[i] * q[i];
                kk2 += k[i] * k[i];
                qk += q[i] * k[i];
            }
            qk = xor_sum<KFIRST_BIT, KLAST_BIT>(qk);
            AccT rq = AccT(1), rk = AccT(1);
            if (l2norm) {
                qq = xor_sum<KFIRST_BIT, KLAST_BIT>(qq);
                kk2 = xor_sum<KFIRST_BIT, KLAST_BIT>(kk2);
                rq = rsqrt_(qq + static_cast<AccT>(1e-6));
                rk = rsqrt_(kk2 + static_cast<AccT>(1e-6));
            }
#pragma unroll
            for (int i = 0; i < NQK; ++i) k[i] *= rk;
            AccT pk[NV], pq[NV];
#pragma unroll
            for (int m = 0; m < NV; ++m) pk[m] = pq[m] = AccT(0);
#pragma unroll
            for (int bb = 0; bb < BR; ++bb)
#pragma unroll
                for (int a = 0; a < AC; ++a)
#pragma unroll
                    for (int j = 0; j < VW; ++j) {
                        const int m = VFIRST ? bb : a * VW + j;
                        const int i = VFIRST ? a * VW + j : bb;
                        pk[m] += k[i] * s[bb][a][j];
                        pq[m] += q[i] * s[bb][a][j];
                    }
            const AccT scale = static_cast<AccT>(p.scale);
            const AccT o_state = scale * rq * alpha;
            const AccT o_delta = scale * rq * rk * qk;
            AccT u[NV], out[NV];
#pragma unroll
            for (int m = 0; m < NV; ++m) {
                const AccT ks = xor_sum<KFIRST_BIT, KLAST_BIT>(pk[m]);
                const AccT qs = xor_sum<KFIRST_BIT, KLAST_BIT>(pq[m]);
                u[m] = beta * (vv[m] - alpha * ks);
                out[m] = o_state * qs + o_delta * u[m];
            }
#pragma unroll
            for (int bb = 0; bb < BR; ++bb)
#pragma unroll
                for (int a = 0; a < AC; ++a)
#pragma unroll
                    for (int j = 0; j < VW; ++j) {
                        const int m = VFIRST ? bb : a * VW + j;
                        const int i = VFIRST ? a * VW + j : bb;
                        s[bb][a][j] = alpha * s[bb][a][j] + k[i] * u[m];
                    }
            Out* orow = o + (b * p.T + t_begin) * HV * V + o_row;
            if constexpr (VFIRST) {
                if (lc == 0) {
#pragma unroll
                    for (int m = 0; m < NV; ++m)
                        if (v_of(m) < V) orow[v_of(m)] = from_acc<ODT, AccT>(out[m]);
                }
            } else if (lr == 0) {
#pragma unroll
                for (int a = 0; a < AC; ++a) {
                    Out wv[VW];
#pragma unroll
                    for (int j = 0; j < VW; ++j) wv[j] = from_acc<ODT, AccT>(out[a * VW + j]);
                    store_vec<Out, VW>(orow, wv, v0 + VW * (lc + LC * a), V, o_vec);
                }
            }
        }
        // the (possibly unchanged, for a sequence with no token) state goes back, like recurrent_kernel
        if (p.state_out != nullptr) {
            AccT* base = static_cast<AccT*>(p.state_out) + (write_slot * HV + hv) * head_elems;
#pragma unroll
            for (int bb = 0; bb < BR; ++bb) {
                const int r = row0 + lr + LR * bb;
                if (r < row_limit) {
#pragma unroll
                    for (int a = 0; a < AC; ++a)
                        store_vec<AccT, VW, CS>(base + r * col_limit, s[bb][a], col0 + VW * (lc + LC * a), col_limit,
                                                state_vec);
                }
            }
        }
    }
}

}  // namespace gdn

#ifndef __CUDACC_RTC__
#define GDN_INSTANTIATE_PF(DT, ACC, VF, LC, AC, BR, CS, MINB) \
    template __global__ void gdn::decode_persistent_kernel<gdn::DT, ACC, VF, LC, AC, BR, CS, MINB>(const gdn::Params);
GDN_INSTANTIATE_PF(BF16, float, false, 2, 1, 8, true, 3)   // "narrow-cs-pf"
GDN_INSTANTIATE_PF(BF16, float, false, 4, 1, 16, true, 2)  // "wide-cs-pf"
GDN_INSTANTIATE_PF(F32, float, false, 2, 1, 8, true, 3)
GDN_INSTANTIATE_PF(BF16, float, true, 8, 4, 2, true, 3)
#undef GDN_INSTANTIATE_PF
#endif
