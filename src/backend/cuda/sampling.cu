// Token selection on the device: greedy argmax per row, so a greedy decode step downloads [R] ids instead of
// [R, vocab] logits.
#include "backend/cuda/kernels.h"

namespace deepinfer::cuda {

namespace {

// A row of 129,280 logits walked by 256 threads one float at a time took 78 us (one load in flight per thread);
// 1024 threads with four float4 loads in flight read it in a few microseconds.
constexpr int kArgmaxThreads = 1024;

// The better of two (value, index) candidates: larger value, then lower index; index -1 is "none".
__device__ __forceinline__ void keep_better(float& v, int64_t& i, float ov, int64_t oi) {
    if (oi >= 0 && (i < 0 || ov > v || (ov == v && oi < i))) {
        v = ov;
        i = oi;
    }
}

// One block per row of logits [rows, vocab]; NaN entries are skipped.
__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_rows_kernel(int32_t* __restrict__ ids, const float* __restrict__ logits, int64_t vocab) {
    const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
    float v = 0.0f;
    int64_t idx = -1;
    if (vocab % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0) {
        const float4* row4 = reinterpret_cast<const float4*>(row);
        const int64_t n4 = vocab / 4;
        for (int64_t j0 = threadIdx.x; j0 < n4; j0 += 4 * kArgmaxThreads) {
            float4 x[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int64_t j = j0 + u * kArgmaxThreads;
                x[u] = j < n4 ? __ldg(row4 + j) : make_float4(NAN, NAN, NAN, NAN);
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int64_t i = 4 * (j0 + u * kArgmaxThreads);
                if (!isnan(x[u].x)) keep_better(v, idx, x[u].x, i);
                if (!isnan(x[u].y)) keep_better(v, idx, x[u].y, i + 1);
                if (!isnan(x[u].z)) keep_better(v, idx, x[u].z, i + 2);
                if (!isnan(x[u].w)) keep_better(v, idx, x[u].w, i + 3);
            }
        }
    } else {
        for (int64_t i = threadIdx.x; i < vocab; i += kArgmaxThreads) {
            const float x = row[i];
            if (!isnan(x)) keep_better(v, idx, x, i);
        }
    }
    for (int off = 16; off > 0; off /= 2) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, off);
        const int64_t oi = __shfl_xor_sync(0xffffffffu, idx, off);
        keep_better(v, idx, ov, oi);
    }
    __shared__ float sv[kArgmaxThreads / 32];
    __shared__ int64_t si[kArgmaxThreads / 32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        sv[warp] = v;
        si[warp] = idx;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < kArgmaxThreads / 32; ++w) keep_better(v, idx, sv[w], si[w]);
        const bool ok = !isnan(row[0]) && idx >= 0 && v > -INFINITY;
        ids[blockIdx.x] = ok ? static_cast<int32_t>(idx) : -1;
    }
}

}  // namespace

void launch_argmax_rows(int32_t* ids, const float* logits, int64_t rows, int64_t vocab, cudaStream_t stream) {
    if (rows == 0) return;
    argmax_rows_kernel<<<static_cast<unsigned>(rows), kArgmaxThreads, 0, stream>>>(ids, logits, vocab);
    DI_CUDA_LAUNCH_CHECK();
}

}  // namespace deepinfer::cuda
