// Test-only (tests/test_cupy_chunk.py, GPU): checks on the device the two wgmma B-operand readings
// that chunk_wgmma.cu's state kernel relies on (K-major and MN-major shared-memory descriptors over
// 128-byte swizzled tiles). Built like chunk_wgmma.cu (sources.sm90a_module), which it includes.

#include "../../cupy_kernels/chunk_wgmma.cu"

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
