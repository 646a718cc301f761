// Which kernel takes a product, where the choice rests on a shape measured on the GPU. Plain C++ (no CUDA headers),
// so that the tests can read it.
#pragma once

#include <cstdint>

namespace deepinfer::cuda {

// BF16 weights of at least this many rows (the head: 129280 x 4096) go to cuBLAS in the default mode from 2
// activation rows: read in place, with no dequantization, cuBLAS streams them at the HBM's rate while the
// tensor-core GEMV does not (H200, gemv_bench, the head: 246 / 251 / 265 us at 8 / 16 / 32 rows against 363 / 381 /
// 797; the 256 x 4096 router gate stays on the GEMV, 7-10 us against cuBLAS's 17).
constexpr int64_t kCublasBf16MinFeatures = 16384;

}  // namespace deepinfer::cuda
