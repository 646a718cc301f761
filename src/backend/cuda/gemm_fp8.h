// FP8 x FP8 products on cuBLASLt's block-scaled GEMM (Hopper; CUDA 12.9 and later), for the many-row products whose
// activations the model quantizes (DEEPINFER_FP8_ACTIVATIONS, model/activation_quant.h): activations in e4m3 with a
// power-of-two fp32 scale per row and 128 columns, the weights' own e4m3 codes with their scale per 128 x 128 block,
// fp32 out. Nothing is dequantized: the bf16 path (gemm_cublas.cu) rounds the activations to bf16 and copies every
// weight to bf16 per call, and its GEMM runs at about two thirds of this one's rate (bench/gemm/fp8_gemm_probe).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>

namespace deepinfer::cuda {

struct WeightDesc;  // cuda_common.cuh (kept out: this header is also a host compiler's)

// Whether Fp8Gemm takes products with w: FP8 with 128 x 128 block scales (E8M0 or f32) in the checkpoint's
// [rows / 128, cols / 128] grid, rows a multiple of 128, cols of 512 (see the definition), the codes 16-byte aligned.
bool fp8_gemm_applies(const WeightDesc& w);

// The e4m3 codes xq [rows, cols] of x [rows, cols] f32 (cols a multiple of 128, both 16-byte aligned), quantized as
// launch_fake_quantize (kind 0, blocks of 128) quantizes it (the fake-quantized value is code x scale), and their
// scales sx [cols / 128, rows] f32: a product over the columns c0 .. c0 + K (c0 a multiple of 128) takes xq + c0 (row
// stride cols) and sx + (c0 / 128) rows as its activations and their scales.
void launch_quantize_fp8_rows(const float* x, uint8_t* xq, float* sx, int64_t rows, int64_t cols, cudaStream_t stream);

// A cuBLASLt handle and workspace bound to a stream (one per lane, as CublasGemm). Not thread-safe.
class Fp8Gemm {
public:
    explicit Fp8Gemm(cudaStream_t stream);
    ~Fp8Gemm();
    Fp8Gemm(const Fp8Gemm&) = delete;
    Fp8Gemm& operator=(const Fp8Gemm&) = delete;

    // out [rows, n_out] (row stride ldc) f32: out[t, n] = sum over 128-column blocks b of sx[b, t] sw[n / 128, b]
    // sum_k xq[t, k] w[w_row0 + n, k], with xq [rows, K] e4m3 (row stride ldx, 16-byte aligned), sx [K / 128, rows]
    // f32, W as fp8_gemm_applies() takes it, w_row0 and n_out multiples of 128. The tensor cores sum each 128-k block
    // at reduced precision before the scaled fp32 sum (a few 1e-4 of a row's largest output, measured at K 4096).
    // supports() must hold for the same arguments (it needs rows a multiple of 4).
    void run(float* out, int64_t ldc, const uint8_t* xq, int64_t ldx, const float* sx, int64_t rows,
             const WeightDesc& w, int64_t w_row0, int64_t n_out);
    // Whether cuBLASLt has an algorithm for that product (its shape and its operands' alignments; asked once each).
    bool supports(const float* out, int64_t ldc, const uint8_t* xq, int64_t ldx, int64_t rows, const WeightDesc& w,
                  int64_t w_row0, int64_t n_out);

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace deepinfer::cuda
