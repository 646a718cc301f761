// Block-wide prefix sums shared by the kernels that sort rows by expert on the device (moe.cu, experts_wgmma.cu).
#pragma once

#include <cuda_runtime.h>

namespace deepinfer::cuda {

// Exclusive prefix sums of one int2 per thread over a block of kThreads threads (a multiple of 32, at most 1024);
// returns the totals. Every thread of the block must call it; two calls need a __syncthreads() between them
// (the second would rewrite the warp sums that slow threads of the first may still read).
template <int kThreads>
__device__ __forceinline__ int2 block_exclusive_scan(int2& v) {
    static_assert(kThreads % 32 == 0 && kThreads <= 1024, "whole warps, at most 32");
    constexpr int kWarps = kThreads / 32;
    __shared__ int2 warp_sums[kWarps];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int2 inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int ax = __shfl_up_sync(0xffffffffu, inc.x, o), ay = __shfl_up_sync(0xffffffffu, inc.y, o);
        if (lane >= o) inc.x += ax, inc.y += ay;
    }
    if (lane == 31) warp_sums[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        int2 s = lane < kWarps ? warp_sums[lane] : make_int2(0, 0);
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int ax = __shfl_up_sync(0xffffffffu, s.x, o), ay = __shfl_up_sync(0xffffffffu, s.y, o);
            if (lane >= o) s.x += ax, s.y += ay;
        }
        if (lane < kWarps) warp_sums[lane] = s;  // inclusive over warps
    }
    __syncthreads();
    const int2 before = warp > 0 ? warp_sums[warp - 1] : make_int2(0, 0);
    v = make_int2(before.x + inc.x - v.x, before.y + inc.y - v.y);
    return warp_sums[kWarps - 1];
}

}  // namespace deepinfer::cuda
