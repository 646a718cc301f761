// Event timing shared by the CUDA micro-benchmarks.
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/cuda_common.cuh"

namespace deepinfer::bench {

// Mean microseconds per call of call(i), i = 0 .. iters - 1, between two events on the default stream (the
// caller warms up first).
template <typename Call>
double mean_call_us(int iters, Call&& call) {
    cudaEvent_t start, stop;
    DI_CUDA_CHECK(cudaEventCreate(&start));
    DI_CUDA_CHECK(cudaEventCreate(&stop));
    DI_CUDA_CHECK(cudaEventRecord(start));
    for (int i = 0; i < iters; ++i) call(i);
    DI_CUDA_CHECK(cudaEventRecord(stop));
    DI_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    DI_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    DI_CUDA_CHECK(cudaEventDestroy(start));
    DI_CUDA_CHECK(cudaEventDestroy(stop));
    return 1000.0 * ms / iters;
}

}  // namespace deepinfer::bench
