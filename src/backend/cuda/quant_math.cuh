// The FP8 rounding of the QAT recipes (backend/cpu/quant_sim.cpp), element for element: shared by fake_quantize
// (pointwise.cu) and the FP8 GEMM's activation quantizer (gemm_fp8.cu), which must agree bit for bit.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/weight_chunks.cuh"

namespace deepinfer::cuda {

// The smallest power of two >= r (r > 0 and finite).
__device__ __forceinline__ float pow2_ceil(float r) {
    const uint32_t bits = __float_as_uint(r);
    const int e = static_cast<int>((bits >> 23) & 0xff) - 127 + ((bits & 0x7fffff) != 0 ? 1 : 0);
    return __uint_as_float(static_cast<uint32_t>(e + 127) << 23);
}

// 1 / s exactly, for s a power of two (normal) or +inf (0).
__device__ __forceinline__ float pow2_reciprocal(float s) {
    const uint32_t e = __float_as_uint(s) >> 23;  // the biased exponent (s > 0)
    return e >= 255 ? 0.0f : e == 254 ? __uint_as_float(0x00400000u) : __uint_as_float((254u - e) << 23);
}

// 2^e as a float, for e in [-149, 127] (normal from -126, subnormal below): x * pow2_int(e) is ldexpf(x, e) exactly
// (one IEEE multiplication by a power of two rounds once, as ldexpf does; overflow gives inf, NaN stays NaN), without
// ldexpf's call and range checks.
__device__ __forceinline__ float pow2_int(int e) {
    return e >= -126 ? __uint_as_float(static_cast<uint32_t>(e + 127) << 23) : __uint_as_float(1u << (e + 149));
}

// x rounded to the nearest e4m3 value (ties to even), saturating at +-448; NaN stays NaN.
__device__ __forceinline__ float round_e4m3(float x) {
    const float a = fabsf(x);
    if (!(a < 448.0f)) return copysignf(isnan(a) ? a : 448.0f, x);
    float step;
    if (a < 0.015625f) {
        step = 0.001953125f;
    } else {
        int e;
        frexpf(a, &e);
        step = ldexpf(1.0f, e - 4);
    }
    return copysignf(rintf(a / step) * step, x);
}

// The power-of-two scale of a block of FP8 activations whose largest magnitude is amax (DeepSeek's act_quant with
// ue8m0 scales): values / scale lie within +-448.
__device__ __forceinline__ float fp8_block_scale(float amax) { return pow2_ceil(fmaxf(amax, 1e-4f) * (1.0f / 448.0f)); }
// The e4m3 code that stands for v in a block of scale s: v / s (exact: s is a power of two) clamped to +-448 (NaN to
// -448, as the CPU recipe's clamp leaves it), rounded to nearest even by the hardware conversion, which round_e4m3
// does in software (the same value for every clamped input: the CUDA fake_quantize test compares them bit for bit).
// (v / s is v times 1 / s, exact for a power of two: a multiplication, where a division costs ~10 instructions.)
__device__ __forceinline__ uint32_t fp8_code(float v, float s) {
    return __nv_cvt_float_to_fp8(fminf(fmaxf(v * pow2_reciprocal(s), -448.0f), 448.0f), __NV_SATFINITE, __NV_E4M3);
}
// The value of an e4m3 code (exact through f16).
__device__ __forceinline__ float fp8_code_float(uint32_t code) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3)));
}

// One warp's FP8 quantization of a 128-column block, 4 of its columns a lane (every lane of the warp calls it, `four`
// the lane's 4 consecutive values, 16-byte aligned): the block's scale, its largest magnitude found by shuffles (fmaxf
// in any order gives fake_quantize's serial maximum, NaN ignored alike), and the lane's 4 e4m3 codes, value i in
// byte i.
struct Fp8Quad {
    uint32_t codes;
    float scale;
};
__device__ __forceinline__ Fp8Quad fp8_quantize_quad(const float* __restrict__ four) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(four));
    const float s = fp8_block_scale(warp_max(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)))));
    return {fp8_code(v.x, s) | fp8_code(v.y, s) << 8 | fp8_code(v.z, s) << 16 | fp8_code(v.w, s) << 24, s};
}

// The e4m3 codes of lo (low byte) and hi, each rounded to nearest (ties to even), saturating at +-448.
__device__ __forceinline__ uint32_t e4m3x2_rn(float lo, float hi) {
    uint16_t r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}

// Four activations already divided by their block's power-of-two scale (|y| within e4m3's range) as two e4m3 terms:
// hi = e4m3(y), lo = e4m3(16 (y - hi)), both rounded to nearest, y[i]'s codes in byte i. hi + lo / 16 is y exactly for
// a bf16 y whose hi is normal (4 of its 8 significant bits in hi, the rest in lo); the callers' scales say for which
// elements (gemv_fp8_mma.cu, experts_fp8_decode.cu).
struct E4m3Split {
    uint32_t hi, lo;
};
__device__ __forceinline__ E4m3Split split_e4m3_quad(const float (&y)[4]) {
    E4m3Split s{0, 0};
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
        const uint32_t h = e4m3x2_rn(y[e], y[e + 1]);
        const float2 hf = chunks::e4m3x2_to_float2(h);
        s.hi |= h << (8 * e);
        s.lo |= e4m3x2_rn(16.0f * (y[e] - hf.x), 16.0f * (y[e + 1] - hf.y)) << (8 * e);
    }
    return s;
}

}  // namespace deepinfer::cuda
