// The decode GEMV on Hopper wgmma for FP8 weights (gemv_wgmma.cu), for callers without the CUDA headers (the GPU
// tests): the same products as launch_gemv_wgmma_jobs / launch_gemv_tc_jobs (kernels.h) over device LinearWeights,
// described as the backend describes them. cudaStream_t is `CUstream_st*`.
#pragma once

#include <cstdint>
#include <vector>

#include "core/weight.h"

struct CUstream_st;

namespace deepinfer::cuda {

// Whether the current device is the one the wgmma GEMV is built for (compute capability 9.0).
bool gemv_wgmma_device();
// gemv_wgmma_applies / gemv_fp8_mma_applies (kernels.h) on the backend's description of w.
bool gemv_wgmma_applies(int64_t rows, const LinearWeight& w);
bool gemv_fp8_mma_applies(int64_t rows, const LinearWeight& w);

// One product: out [rows, ldc] f32 = x [rows, lda] f32 times rows w_row0 .. w_row0 + n_out - 1 of *w, transposed.
struct GemvProduct {
    float* out;
    int64_t ldc;
    const float* x;
    int64_t lda;
    const LinearWeight* w;
    int64_t w_row0, n_out;
};
enum class DecodeGemv { kTc, kWgmma, kFp8Mma };
// The products in shared launches on the chosen kernel (each must apply: gemv_tc_applies, gemv_wgmma_applies or
// gemv_fp8_mma_applies), then
// waits for `stream` (nullptr: the legacy default stream).
void run_decode_gemv_sync(DecodeGemv kernel, const std::vector<GemvProduct>& products, int64_t rows,
                          CUstream_st* stream = nullptr);

}  // namespace deepinfer::cuda
