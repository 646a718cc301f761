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

// kCublasMinRows: fewest rows for which the default mode takes cuBLAS rather than launch_gemm_tc. Per weight
// element the cuBLAS path adds a dequantization pass of q + 2 bytes (read the stored weight: q = 1 FP8, 0.5 FP4,
// 2 F16, 4 F32; write bf16; 0 for BF16 read in place), while both paths do 2 T FLOP. At B = 4.2 TB/s, the tc
// kernel at ~200 TFLOP/s (measured) and cuBLAS at ~650 (of the 722-790 measured for bf16) it pays off once
// 2 T (1/200e12 - 1/650e12) > (q + 2) / B, i.e. T > ~100 rows for FP8 (~85 FP4, ~210 F32). Far below that both
// are bound by weight bytes, and cuBLAS moves q + 4 (dequantize, then read the copy) where tc moves q. 128: the
// power of two above the FP8/FP4 break-even; gemm_bench times both paths per shape to set it.
constexpr int64_t kCublasMinRows = 128;

}  // namespace deepinfer::cuda
