// Recurrent gated delta rule (prefill + decode) for CuPy's NVRTC and for nvcc (sm_90).
//
// Per sequence n and value head h, with state S [K, V]:
//     S = exp(g_t) * S;  u = beta_t * (v_t - S^T k_t);  S = S + k_t u^T;  o_t = scale * S^T q_t
// Every column of S evolves on its own: the only coupling is the dot products over K. So a
// warp owns ALL of K for a tile of V columns and the whole recurrence is warp-local: no shared
// memory and no __syncthreads. A CTA is just W independent warps (W chosen by the launcher so
// that batch 1 still spreads over >= 128 CTAs).
//
// Lane layout: 16-byte vectors run along the contiguous axis of the state (V when k-first
// [K, V], K when v-first [V, K]) so loads and stores are 16-byte vectorized and coalesced.
// A lane is (lc, lr), lane = lc + LC * lr, LC * LR = 32, and owns
//     rows   r = row0 + lr + LR * b,       b < BR      (k when k-first, v when v-first)
//     cols   c = col0 + VW * (lc + LC * a) + j, a < AC, j < VW   (v or k)
// in registers (BR * AC * VW values). Sums over K are a per-lane sum plus a butterfly over
// the lanes that differ in k: lr bits when k-first, lc bits when v-first.
//
// o_t is formed from the decayed state before the rank-1 update,
//     o_t = scale * (exp(g) q^T S + (q . k) u),
// which is algebraically q^T S_new and needs one butterfly per token instead of two.
//
// Templates: DT (q/k/v element type: 0 f32, 1 f16, 2 bf16 stored as raw 16-bit, 3 f64),
// AccT (compute and state type: float, or double for the GPU oracle), VFIRST (state layout),
// the lane tiling (LC, AC, BR), and CS (streaming cache hints on the state's 16-byte loads and
// stores). The kernel's options (l2norm, FLA's use_gate_in_kernel / use_beta_sigmoid_in_kernel /
// allow_neg_eigval, vector widths) are runtime flags. Metadata (cu_seqlens, slot tables, accepted
// counts) is validated by the warps that use it: bad values are reported in Params::err and never
// used as an address. Gates, slot tables and scalars are runtime-typed, so the launcher instantiates (via
// name_expressions) only what it uses. Decode variants (see RECURRENT_NOTES.md): "wide" is
// (LC 4, BR 16) k-first / (LC 8, AC 4, BR 4) v-first, 64 floats per lane; "-cs" sets CS; "rows-cs"
// is (LC 32, AC 1, BR 4) v-first, 16 floats per lane under MINB 6, and wide-cs k-first. (The
// "narrow" tilings and the persistent kernel measured slower and live in experimental/.)

namespace gdn {

enum DType : int { F32 = 0, F16 = 1, BF16 = 2, F64 = 3, I32 = 4, I64 = 5 };

// Launch parameters, passed by value as one struct. Every field is 8 bytes so the host can
// pack it with struct.pack without padding rules.
struct Params {
    const void* q;         // [B, T, H, K] DT (last dim contiguous, other strides in elements below)
    const void* k;         // [B, T, H, K] DT
    const void* v;         // [B, T, HV, V] DT
    const void* g;         // [B, T, HV] log decay, or the raw gate input when FLAG_GATE_IN_KERNEL
    const void* beta;      // [B, T, HV] beta, or logits when FLAG_BETA_SIGMOID
    const void* A_log;     // [HV] (FLAG_GATE_IN_KERNEL only)
    const void* dt_bias;   // [HV] or null (FLAG_GATE_IN_KERNEL only; null means 0)
    const void* state_in;  // AccT [slots, HV, K, V] (or [.., V, K]); null means zeros
    void* state_out;       // AccT, same layout; null means no state is written
    void* o;               // out dtype [B, T, HV, V], contiguous
    const void* cu_seqlens;       // [N + 1] (int32/int64) or null (then N == B, T tokens each)
    const void* slot_idx;         // slot table (int32/int64), see slot_mode
    const void* num_accepted;     // [N] (int32/int64), spec decoding only
    int* err;              // [ERR_WORDS] error words (mapped host memory): bad metadata sets one to 1
    long long q_sb, q_st, q_sh;
    long long k_sb, k_st, k_sh;
    long long v_sb, v_st, v_sh;
    long long g_sb, g_st, g_sh;
    long long b_sb, b_st, b_sh;
    long long B, T, N, H, HV, K, V;
    long long num_slots;   // valid slot range [0, num_slots) for slot tables
    long long idx_stride;  // row stride of a 2-D slot table (spec decoding)
    long long idx_cols;    // columns of a 2-D slot table (spec decoding)
    long long slot_mode;   // 0: slot n; 1: slot_idx[n] read+write; 2: spec decoding
    long long dtypes;      // 4-bit codes: g | beta << 4 | A_log << 8 | dt_bias << 12 | idx << 16 | acc << 20
                           //              | cu_seqlens << 24
    long long flags;       // FLAG_* bits
    long long vtiles;      // V tiles (warps) per head
    long long total_warps; // N * HV * vtiles
    double scale;
};

// MODE template argument: decode (no prefetch: fewer registers, more warps in flight), prefill
// (next token's inputs prefetched into registers), speculative decoding (per-token state slots).
constexpr int MODE_DECODE = 0;
constexpr int MODE_PREFILL = 1;
constexpr int MODE_SPEC = 2;

constexpr long long FLAG_L2NORM = 1;
constexpr long long FLAG_GATE_IN_KERNEL = 2;  // g = -exp(A_log) * softplus(g + dt_bias)
constexpr long long FLAG_STATE_VEC = 4;  // state rows 16-byte aligned: vector loads/stores allowed
constexpr long long FLAG_QK_VEC = 8;     // q/k rows aligned for VW-element vectors
constexpr long long FLAG_V_VEC = 16;     // v rows aligned for VW-element vectors
constexpr long long FLAG_O_VEC = 32;     // o rows aligned for VW-element vectors
constexpr long long FLAG_BETA_SIGMOID = 64;  // beta = sigmoid(beta)
constexpr long long FLAG_NEG_EIGVAL = 128;   // beta = 2 * sigmoid(beta) (with FLAG_BETA_SIGMOID)

// Error words (Params::err), one per metadata argument; the launcher names the argument. A warp
// that sees bad metadata skips all of its memory traffic (no read or write through the bad value)
// and stores 1 into the word: a plain store of a constant, so concurrent writers cannot conflict.
constexpr int ERR_CU_SEQLENS = 0;     // offsets not 0 = c_0 <= c_1 <= ... <= c_N = T (spec: length > S)
constexpr int ERR_SLOT_INDICES = 1;   // pool slot >= number of slots
constexpr int ERR_STATE_INDICES = 2;  // spec decoding: ssm_state_indices entry >= number of slots
constexpr int ERR_ACCEPTED = 3;       // spec decoding: num_accepted_tokens outside [1, S]
constexpr int ERR_WORDS = 4;  // the launcher's buffer size (tensors.ERROR_WORDS)
static_assert(ERR_ACCEPTED < ERR_WORDS, "error words");

__device__ __forceinline__ void report(const Params& p, int word) {
    if ((threadIdx.x & 31) == 0) *static_cast<volatile int*>(p.err + word) = 1;
}

template <int DT> struct Storage;
template <> struct Storage<F32> { using type = float; };
template <> struct Storage<F16> { using type = unsigned short; };
template <> struct Storage<BF16> { using type = unsigned short; };
template <> struct Storage<F64> { using type = double; };

// Half and bfloat16 conversions by hand (bit exact, round to nearest even) so that NVRTC does not
// parse cuda_fp16.h / cuda_bf16.h for every instantiation.
__device__ __forceinline__ float half_to_float(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ unsigned short float_to_half(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float bf16_to_float(unsigned short b) { return __uint_as_float(((unsigned)b) << 16); }
__device__ __forceinline__ unsigned short float_to_bf16(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

template <int DT, typename AccT>
__device__ __forceinline__ AccT to_acc(typename Storage<DT>::type x) {
    if constexpr (DT == F16) return static_cast<AccT>(half_to_float(x));
    else if constexpr (DT == BF16) return static_cast<AccT>(bf16_to_float(x));
    else return static_cast<AccT>(x);
}

// Only float -> {f32, f16, bf16} and double -> f64 occur (the oracle writes float64).
template <int DT, typename AccT>
__device__ __forceinline__ typename Storage<DT>::type from_acc(AccT x) {
    if constexpr (DT == F16) return float_to_half(static_cast<float>(x));
    else if constexpr (DT == BF16) return float_to_bf16(static_cast<float>(x));
    else return static_cast<typename Storage<DT>::type>(x);
}

__device__ __forceinline__ float exp_(float x) { return expf(x); }
__device__ __forceinline__ double exp_(double x) { return exp(x); }
__device__ __forceinline__ float log1p_(float x) { return log1pf(x); }
__device__ __forceinline__ double log1p_(double x) { return log1p(x); }
__device__ __forceinline__ float rsqrt_(float x) { return 1.0f / sqrtf(x); }
__device__ __forceinline__ double rsqrt_(double x) { return 1.0 / sqrt(x); }

// Runtime-typed scalar loads (gates). The raw bits are loaded early and converted late so a
// prefetch does not stall on the conversion.
__device__ __forceinline__ unsigned long long load_raw(const void* base, long long i, int code) {
    if (code == F64 || code == I64) return static_cast<const unsigned long long*>(base)[i];
    if (code == F32 || code == I32) return static_cast<const unsigned*>(base)[i];
    return static_cast<const unsigned short*>(base)[i];
}
template <typename AccT>
__device__ __forceinline__ AccT raw_to(unsigned long long bits, int code) {
    if (code == F64) return static_cast<AccT>(__longlong_as_double(static_cast<long long>(bits)));
    if (code == F32) return static_cast<AccT>(__uint_as_float(static_cast<unsigned>(bits)));
    if (code == F16) return static_cast<AccT>(half_to_float(static_cast<unsigned short>(bits)));
    return static_cast<AccT>(bf16_to_float(static_cast<unsigned short>(bits)));
}
__device__ __forceinline__ long long load_index(const void* base, long long i, int code) {
    if (code == I64) return static_cast<const long long*>(base)[i];
    return static_cast<const int*>(base)[i];
}

template <typename T, int N> struct alignas(sizeof(T) * N) Vec { T x[N]; };

// Streaming (evict-first, "likely accessed once") 16-byte state accesses: ld/st.global.cs. The
// state is read once and written once per launch, so it should not push q/k/v or other kernels'
// data out of L1/L2. Only the state (float or double) uses them.
__device__ __forceinline__ void ld_stream(Vec<float, 4>& w, const float* p) {
    asm("ld.global.cs.v4.f32 {%0, %1, %2, %3}, [%4];"
        : "=f"(w.x[0]), "=f"(w.x[1]), "=f"(w.x[2]), "=f"(w.x[3]) : "l"(p));
}
__device__ __forceinline__ void ld_stream(Vec<double, 2>& w, const double* p) {
    asm("ld.global.cs.v2.f64 {%0, %1}, [%2];" : "=d"(w.x[0]), "=d"(w.x[1]) : "l"(p));
}
__device__ __forceinline__ void st_stream(float* p, const Vec<float, 4>& w) {
    asm volatile("st.global.cs.v4.f32 [%0], {%1, %2, %3, %4};"
                 :: "l"(p), "f"(w.x[0]), "f"(w.x[1]), "f"(w.x[2]), "f"(w.x[3]) : "memory");
}
__device__ __forceinline__ void st_stream(double* p, const Vec<double, 2>& w) {
    asm volatile("st.global.cs.v2.f64 [%0], {%1, %2};" :: "l"(p), "d"(w.x[0]), "d"(w.x[1]) : "memory");
}

// Elements [i, i + N) of a row with `limit` valid elements, zero beyond it. `vec` promises the
// row start is aligned to the vector and limit % N == 0, so a partial vector never occurs.
// CS: streaming vector accesses (state only).
template <typename T, int N, bool CS = false>
__device__ __forceinline__ void load_vec(T (&dst)[N], const T* row, int i, int limit, bool vec) {
    if (vec && i + N <= limit) {
        Vec<T, N> w;
        if constexpr (CS) ld_stream(w, row + i);
        else w = *reinterpret_cast<const Vec<T, N>*>(row + i);
#pragma unroll
        for (int j = 0; j < N; ++j) dst[j] = w.x[j];
    } else {
#pragma unroll
        for (int j = 0; j < N; ++j) dst[j] = (i + j < limit) ? row[i + j] : T(0);
    }
}
template <typename T, int N, bool CS = false>
__device__ __forceinline__ void store_vec(T* row, const T (&src)[N], int i, int limit, bool vec) {
    if (vec && i + N <= limit) {
        Vec<T, N> w;
#pragma unroll
        for (int j = 0; j < N; ++j) w.x[j] = src[j];
        if constexpr (CS) st_stream(row + i, w);
        else *reinterpret_cast<Vec<T, N>*>(row + i) = w;
    } else {
#pragma unroll
        for (int j = 0; j < N; ++j)
            if (i + j < limit) row[i + j] = src[j];
    }
}

// Butterfly sum over lanes whose index differs in bits [FIRST, LAST). Partners add the same two
// numbers (commutative), so every lane ends with a bitwise identical total.
template <int FIRST, int LAST, typename AccT>
__device__ __forceinline__ AccT xor_sum(AccT x) {
#pragma unroll
    for (int off = FIRST; off < LAST; off <<= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

// MINB: 0 leaves ptxas its own register choice (the original kernel); > 0 asks for MINB CTAs of 128
// threads per SM, i.e. at most 65536 / (128 * MINB) registers (4: 128 registers, 16 warps / SM).
template <int DT, typename AccT, bool VFIRST, int LC, int AC, int BR, int MODE, bool CS, int MINB>
__global__ void __launch_bounds__(128, MINB) recurrent_kernel(const Params p) {
    using In = typename Storage<DT>::type;
    constexpr int ODT = sizeof(AccT) == 8 ? F64 : DT;
    using Out = typename Storage<ODT>::type;
    constexpr int VW = 16 / sizeof(AccT);  // state elements per 16-byte vector
    constexpr int LR = 32 / LC;
    constexpr int NQK = VFIRST ? AC * VW : BR;  // q/k entries per lane
    constexpr int NV = VFIRST ? BR : AC * VW;   // value columns per lane
    constexpr int WV = VFIRST ? LR * BR : VW * LC * AC;  // value columns per warp
    // The state element s[bb][a][j] a lane holds: its value column (of its NV) and key row (of NQK).
    constexpr auto held_v = [](int bb, int a, int j) { return VFIRST ? bb : a * VW + j; };
    constexpr auto held_k = [](int bb, int a, int j) { return VFIRST ? a * VW + j : bb; };
    // lanes that hold different k: lr bits (k-first) or lc bits (v-first)
    constexpr int KFIRST_BIT = VFIRST ? 1 : LC;
    constexpr int KLAST_BIT = VFIRST ? LC : 32;
    static_assert(LC * LR == 32, "LC must divide 32");
    static_assert(MODE == MODE_DECODE || MODE == MODE_PREFILL || MODE == MODE_SPEC, "unknown MODE");

    const long long warp = static_cast<long long>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (warp >= p.total_warps) return;  // whole warp exits together
    const int lane = threadIdx.x & 31;
    const int lc = lane % LC, lr = lane / LC;
    const int vt = static_cast<int>(warp % p.vtiles);
    const long long nh = warp / p.vtiles;
    const int HV = static_cast<int>(p.HV), K = static_cast<int>(p.K), V = static_cast<int>(p.V);
    const int hv = static_cast<int>(nh % HV);
    const long long n = nh / HV;
    const int hq = hv / (HV / static_cast<int>(p.H));
    const int v0 = vt * WV;
    const int dcodes = static_cast<int>(p.dtypes);
    const int g_code = dcodes & 15, b_code = (dcodes >> 4) & 15, idx_code = (dcodes >> 16) & 15,
              acc_code = (dcodes >> 20) & 15;
    const bool l2norm = p.flags & FLAG_L2NORM, gate_in_kernel = p.flags & FLAG_GATE_IN_KERNEL;
    const bool beta_sigmoid = p.flags & FLAG_BETA_SIGMOID, neg_eigval = p.flags & FLAG_NEG_EIGVAL;
    const bool state_vec = p.flags & FLAG_STATE_VEC, qk_vec = p.flags & FLAG_QK_VEC,
               v_vec = p.flags & FLAG_V_VEC, o_vec = p.flags & FLAG_O_VEC;

    // ---- token range: flat rows b * T + t for t in [t_begin, t_end). Bad offsets are detected
    // here, by every warp of the sequences they touch, and nothing is read or written through them.
    long long b, t_begin, t_end;
    if (p.cu_seqlens != nullptr) {
        b = 0;
        const int cu_code = (dcodes >> 24) & 15;
        t_begin = load_index(p.cu_seqlens, n, cu_code);
        t_end = load_index(p.cu_seqlens, n + 1, cu_code);
        bool bad = t_begin < 0 || t_end > p.T || t_end < t_begin || (n == 0 && t_begin != 0) ||
                   (n == p.N - 1 && t_end != p.T);
        if constexpr (MODE == MODE_SPEC) bad = bad || t_end - t_begin > p.idx_cols;  // one slot per token
        if (bad) {
            report(p, ERR_CU_SEQLENS);
            return;
        }
    } else {
        b = n;
        t_begin = 0;
        t_end = p.T;
    }

    // ---- state slots: a negative slot is padding (vLLM's PAD_SLOT_ID); one past the pool is an
    // error, handled like padding (zero output, no state touched) once reported.
    long long read_slot = n, write_slot = n;
    if constexpr (MODE != MODE_SPEC) {
        if (p.slot_mode == 1) {
            read_slot = write_slot = load_index(p.slot_idx, n, idx_code);
            if (read_slot >= p.num_slots) report(p, ERR_SLOT_INDICES);
        }
    } else {
        const long long acc = load_index(p.num_accepted, n, acc_code);
        if (acc >= 1 && acc <= p.idx_cols) {
            read_slot = load_index(p.slot_idx, n * p.idx_stride + acc - 1, idx_code);
            if (read_slot >= p.num_slots) report(p, ERR_STATE_INDICES);
        } else {
            report(p, ERR_ACCEPTED);
            read_slot = -1;
        }
        write_slot = -1;  // per-token writes below
    }
    const bool padding = (MODE == MODE_SPEC || p.slot_mode != 0) && (read_slot < 0 || read_slot >= p.num_slots);

    // the row/column geometry of this lane's state slice
    const int row0 = VFIRST ? v0 : 0, col0 = VFIRST ? 0 : v0;
    const int row_limit = VFIRST ? V : K, col_limit = VFIRST ? K : V;
    const long long head_elems = static_cast<long long>(K) * V;
    const int o_row = static_cast<int>(hv) * V;  // offset of this head inside an output token row

    // owned value columns m < NV (output / u index) and owned k entries i < NQK
    auto v_of = [&](int m) -> int {
        return VFIRST ? v0 + lr + LR * m : v0 + VW * (lc + LC * (m / VW)) + m % VW;
    };

    Out* const o = static_cast<Out*>(p.o);
    if (padding) {
        // padded request: zero output rows, no state touched
        for (long long t = t_begin; t < t_end; ++t) {
            Out* orow = o + (b * p.T + t) * HV * V + o_row;
            if (VFIRST ? lc == 0 : lr == 0) {
#pragma unroll
                for (int m = 0; m < NV; ++m)
                    if (v_of(m) < V) orow[v_of(m)] = from_acc<ODT, AccT>(AccT(0));
            }
        }
        return;
    }

    // ---- load the state slice
    AccT s[BR][AC][VW];
    {
        const AccT* base = p.state_in == nullptr
                               ? nullptr
                               : static_cast<const AccT*>(p.state_in) + (read_slot * HV + hv) * head_elems;
#pragma unroll
        for (int bb = 0; bb < BR; ++bb) {
            const int r = row0 + lr + LR * bb;
#pragma unroll
            for (int a = 0; a < AC; ++a) {
                const int c = col0 + VW * (lc + LC * a);
                if (base != nullptr && r < row_limit) {
                    load_vec<AccT, VW, CS>(s[bb][a], base + r * col_limit, c, col_limit, state_vec);
                } else {
#pragma unroll
                    for (int j = 0; j < VW; ++j) s[bb][a][j] = AccT(0);
                }
            }
        }
    }

    // per-head constants of the in-kernel gate: g = -exp(A_log) * softplus(g + dt_bias)
    AccT neg_A = AccT(0), dt_bias = AccT(0);
    if (gate_in_kernel) {
        neg_A = -exp_(raw_to<AccT>(load_raw(p.A_log, hv, (dcodes >> 8) & 15), (dcodes >> 8) & 15));
        if (p.dt_bias != nullptr)
            dt_bias = raw_to<AccT>(load_raw(p.dt_bias, hv, (dcodes >> 12) & 15), (dcodes >> 12) & 15);
    }

    const In* const qp = static_cast<const In*>(p.q);
    const In* const kp = static_cast<const In*>(p.k);
    const In* const vp = static_cast<const In*>(p.v);

    // ---- raw per-token inputs, prefetched one token ahead
    In qr[NQK], kr[NQK], vr[NV];
    unsigned long long gr = 0, br = 0;
    auto fetch = [&](long long t) {
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
    };

    auto store_state = [&](long long slot) {
        AccT* base = static_cast<AccT*>(p.state_out) + (slot * HV + hv) * head_elems;
#pragma unroll
        for (int bb = 0; bb < BR; ++bb) {
            const int r = row0 + lr + LR * bb;
            if (r < row_limit) {
#pragma unroll
                for (int a = 0; a < AC; ++a)
                    store_vec<AccT, VW, CS>(base + r * col_limit, s[bb][a],
                                        col0 + VW * (lc + LC * a), col_limit, state_vec);
            }
        }
    };

    const AccT scale = static_cast<AccT>(p.scale);
    const AccT eps = static_cast<AccT>(1e-6);
    if (MODE == MODE_PREFILL && t_begin < t_end) fetch(t_begin);
    for (long long t = t_begin; t < t_end; ++t) {
        if constexpr (MODE != MODE_PREFILL) fetch(t);
        AccT q[NQK], k[NQK], vv[NV];
#pragma unroll
        for (int i = 0; i < NQK; ++i) {
            q[i] = to_acc<DT, AccT>(qr[i]);
            k[i] = to_acc<DT, AccT>(kr[i]);
        }
#pragma unroll
        for (int m = 0; m < NV; ++m) vv[m] = to_acc<DT, AccT>(vr[m]);
        AccT g = raw_to<AccT>(gr, g_code), beta = raw_to<AccT>(br, b_code);
        if constexpr (MODE == MODE_PREFILL) {
            if (t + 1 < t_end) fetch(t + 1);
        }

        if (gate_in_kernel) {
            const AccT x = g + dt_bias;  // g holds the raw gate input
            const AccT softplus = x > AccT(20) ? x : log1p_(exp_(x));  // FLA's / torch's threshold 20
            g = neg_A * softplus;
        }
        if (beta_sigmoid) {
            const AccT e = exp_(-fabs(beta));  // sigmoid without overflow for large |logit|
            beta = beta >= AccT(0) ? AccT(1) / (AccT(1) + e) : e / (AccT(1) + e);
            if (neg_eigval) beta *= AccT(2);  // beta in [0, 2): negative eigenvalues of I - beta k k^T
        }
        const AccT alpha = exp_(g);

        // q.k and the squared norms over K
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
            rq = rsqrt_(qq + eps);
            rk = rsqrt_(kk2 + eps);
        }
#pragma unroll
        for (int i = 0; i < NQK; ++i) k[i] *= rk;  // normalized k feeds the rank-1 update

        // per owned column: k^T S and q^T S of the undecayed state
        AccT pk[NV], pq[NV];
#pragma unroll
        for (int m = 0; m < NV; ++m) pk[m] = pq[m] = AccT(0);
#pragma unroll
        for (int bb = 0; bb < BR; ++bb)
#pragma unroll
            for (int a = 0; a < AC; ++a)
#pragma unroll
                for (int j = 0; j < VW; ++j) {
                    const int m = held_v(bb, a, j), i = held_k(bb, a, j);
                    pk[m] += k[i] * s[bb][a][j];
                    pq[m] += q[i] * s[bb][a][j];
                }
        const AccT o_state = scale * rq * alpha;  // weight of q^T S in o
        const AccT o_delta = scale * rq * rk * qk;  // weight of u in o: scale * (q_hat . k_hat)
        AccT u[NV], out[NV];
#pragma unroll
        for (int m = 0; m < NV; ++m) {
            const AccT ks = xor_sum<KFIRST_BIT, KLAST_BIT>(pk[m]);
            const AccT qs = xor_sum<KFIRST_BIT, KLAST_BIT>(pq[m]);
            u[m] = beta * (vv[m] - alpha * ks);
            out[m] = o_state * qs + o_delta * u[m];
        }

        // S = alpha * S + k u^T
#pragma unroll
        for (int bb = 0; bb < BR; ++bb)
#pragma unroll
            for (int a = 0; a < AC; ++a)
#pragma unroll
                for (int j = 0; j < VW; ++j) {
                    s[bb][a][j] = alpha * s[bb][a][j] + k[held_k(bb, a, j)] * u[held_v(bb, a, j)];
                }

        Out* orow = o + (b * p.T + t) * HV * V + o_row;
        if constexpr (VFIRST) {
            if (lc == 0) {
#pragma unroll
                for (int m = 0; m < NV; ++m)
                    if (v_of(m) < V) orow[v_of(m)] = from_acc<ODT, AccT>(out[m]);
            }
        } else if (lr == 0) {
#pragma unroll
            for (int a = 0; a < AC; ++a) {
                Out w[VW];
#pragma unroll
                for (int j = 0; j < VW; ++j) w[j] = from_acc<ODT, AccT>(out[a * VW + j]);
                store_vec<Out, VW>(orow, w, v0 + VW * (lc + LC * a), V, o_vec);
            }
        }

        if constexpr (MODE == MODE_SPEC) {
            // speculative decoding: the state after this request's j-th token goes to slot_idx[n, j]
            const long long j = t - t_begin;
            // (j < idx_cols: longer requests were rejected above)
            const long long slot = load_index(p.slot_idx, n * p.idx_stride + j, idx_code);
            if (slot >= p.num_slots) report(p, ERR_STATE_INDICES);
            else if (slot >= 0) store_state(slot);
        }
    }
    if (MODE != MODE_SPEC && p.state_out != nullptr) store_state(write_slot);
}

}  // namespace gdn

#if !defined(__CUDACC_RTC__) && !defined(GDN_NO_INSTANTIATE)
// Offline builds (nvcc -c, used by CI and for `-Xptxas -v`) instantiate the K = V = 128 shapes
// the launcher picks; at run time NVRTC instantiates through name_expressions instead (and
// tests/test_kernel_layout.py's host program defines GDN_NO_INSTANTIATE: it needs only Params).
#define GDN_INSTANTIATE(DT, ACC, VF, LC, AC, BR, MODE, CS, MINB) \
    template __global__ void gdn::recurrent_kernel<gdn::DT, ACC, VF, LC, AC, BR, gdn::MODE, CS, MINB>(const gdn::Params);
GDN_INSTANTIATE(F32, float, false, 4, 1, 16, MODE_DECODE, false, 0)
GDN_INSTANTIATE(BF16, float, false, 4, 1, 16, MODE_DECODE, false, 0)  // decode "wide"
GDN_INSTANTIATE(BF16, float, false, 4, 1, 16, MODE_DECODE, true, 0)   // "wide-cs"
GDN_INSTANTIATE(BF16, float, true, 8, 4, 4, MODE_DECODE, false, 0)
GDN_INSTANTIATE(BF16, float, true, 8, 4, 4, MODE_DECODE, true, 0)
GDN_INSTANTIATE(BF16, float, true, 32, 1, 4, MODE_DECODE, true, 6)    // "rows-cs", v-first
GDN_INSTANTIATE(BF16, float, false, 4, 1, 16, MODE_PREFILL, false, 0)
GDN_INSTANTIATE(BF16, float, false, 4, 1, 16, MODE_SPEC, false, 0)
GDN_INSTANTIATE(F32, double, false, 2, 1, 8, MODE_PREFILL, false, 0)
GDN_INSTANTIATE(BF16, double, true, 8, 8, 2, MODE_PREFILL, false, 0)
#undef GDN_INSTANTIATE
#endif
