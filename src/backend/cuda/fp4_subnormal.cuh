// FP4 (e2m1 codes with E8M0 scales per 32) decoded straight into bf16 tensor-core operands, without conversion
// instructions: the routed experts' kernels (experts_wgmma.cu on wgmma, experts_few_tokens.cu on mma.sync).
#pragma once

#include <cstdint>

#include "backend/cuda/bf16_mma.cuh"

namespace deepinfer::cuda {

// One expert's weights as the routed-expert kernels index them (routed_experts_wgmma_table's entries).
struct ExpertPtrs {
    const uint8_t* data[3];   // w1, w3, w2 FP4 bytes
    const uint8_t* scale[3];  // their E8M0 bytes
};

// The accumulators hold the products times 2^-kAccExp (see "FP4 -> bf16" in experts_wgmma.cu).
constexpr float kAccScale = 32.0f;  // 2^kAccExp
constexpr uint32_t kAccExp = 5;

// Multipliers of fp4_word_to_a's output for the E8M0 scale byte e (bf16 pairs): alpha = 2^e where e <= 127 (post =
// 1); else alpha = 2^127 and post = 2^(e - 127) (NaN for e = 255), which a warp applies only where one of its lanes
// holds such a scale. Named for the subnormal decode: bf16_mma.cuh's chunks::fp4_scale / Fp4Scale are another
// recipe (bias and FMA) with another fast range, for the mma.sync kernels.
struct SubnormalScale {
    uint32_t alpha, post;
};
__device__ __forceinline__ bool subnormal_fast_scale(uint32_t e) { return e <= 127u; }  // also of bytes ORed together
__device__ __forceinline__ uint32_t subnormal_alpha(uint32_t e) { return (e + 127u) * 0x00800080u; }
__device__ __forceinline__ SubnormalScale subnormal_scale(uint32_t e) {
    if (subnormal_fast_scale(e)) return {subnormal_alpha(e), 0x3f803f80u};
    return {0x7f007f00u, e == 255u ? 0x7fc07fc0u : e * 0x00800080u};
}
static_assert(kAccScale == float(1u << kAccExp) && 132 - 127 == kAccExp, "2^e v 2^-132 = 2^S v 2^-kAccExp");

// One 32-bit word of 8 e2m1 codes (low nibble first) -> the bf16 pairs o = (c0, c2), (c1, c3), (c4, c6), (c5, c7)
// of v_i 2^(e - 132), for alpha = 2^e (subnormal_scale). A pair is (the 2|v| byte, the sign byte, ...): bf16 subnormals
// 2|v| 2^-133, which the multiply makes exact normal (or subnormal) bf16 values; sign and zero carry through.
__device__ __forceinline__ void fp4_word_to_a(uint32_t u, uint32_t alpha, uint32_t (&o)[4]) {
    constexpr uint32_t kLo = 0x03020100u, kHi = 0x0c080604u;   // byte c: 2|v| of magnitude code c
    const uint32_t m = u & 0x77777777u;                        // the magnitudes (a selector nibble's bit 3 is clear)
    const uint32_t n0 = chunks::byte_perm(kLo, kHi, m);        // bytes: 2|v| of codes 0, 1, 2, 3
    const uint32_t n1 = chunks::byte_perm(kLo, kHi, m >> 16);  // codes 4, 5, 6, 7
    const uint32_t odd = u & 0x80808080u;                      // byte b: the sign of code 2 b + 1 at bit 7
    const uint32_t even = (u << 4) & 0x80808080u;              // byte b: the sign of code 2 b
    o[0] = chunks::mul_bf16x2(chunks::byte_perm(n0, even, 0x5240u), alpha);  // (c0, c2)
    o[1] = chunks::mul_bf16x2(chunks::byte_perm(n0, odd, 0x5341u), alpha);   // (c1, c3)
    o[2] = chunks::mul_bf16x2(chunks::byte_perm(n1, even, 0x7260u), alpha);  // (c4, c6)
    o[3] = chunks::mul_bf16x2(chunks::byte_perm(n1, odd, 0x7361u), alpha);   // (c5, c7)
}

}  // namespace deepinfer::cuda
