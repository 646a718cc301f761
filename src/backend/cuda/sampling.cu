// Token selection on the device: greedy argmax per row, so a greedy decode step downloads [R] ids instead of
// [R, vocab] logits.
#include "backend/cuda/kernels.h"

namespace deepinfer::cuda {

namespace {

constexpr int kArgmaxThreads = 256;

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
    for (int64_t i = threadIdx.x; i < vocab; i += kArgmaxThreads) {
        const float x = row[i];
        if (!isnan(x)) keep_better(v, idx, x, i);
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
