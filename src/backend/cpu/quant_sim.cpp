// Quantize-dequantize steps of DeepSeek-V4.1's quantization-aware training, reproduced bit for bit:
// the scale arithmetic is fp32 exactly as the reference kernels do it (multiply by the fp32 reciprocal of
// the format maximum, power-of-two ceiling from the IEEE exponent bits), codes round to nearest even.
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_backend.h"

namespace deepinfer {

namespace {

constexpr float kFp8Max = 448.0f;
constexpr float kFp4Max = 6.0f;

// 2^ceil(log2(r)) for a positive normal r, from its bits.
float pow2_ceil(float r) {
    uint32_t bits;
    std::memcpy(&bits, &r, 4);
    const int32_t exp = static_cast<int32_t>((bits >> 23) & 0xff) - 127;
    const int32_t e = exp + ((bits & 0x7fffff) != 0 ? 1 : 0);
    const uint32_t out_bits = static_cast<uint32_t>(e + 127) << 23;
    float out;
    std::memcpy(&out, &out_bits, 4);
    return out;
}

// Nearest e4m3fn value (ties to even), saturating at +-448.
float round_e4m3(float x) {
    const float a = std::fabs(x);
    if (!(a < kFp8Max)) return std::copysign(std::isnan(a) ? a : kFp8Max, x);
    float step;
    if (a < 0.015625f) {
        step = 0.001953125f;  // subnormals: multiples of 2^-9
    } else {
        int e;
        std::frexp(a, &e);               // a = m * 2^e, m in [0.5, 1)
        step = std::ldexp(1.0f, e - 4);  // 3 mantissa bits below the leading one
    }
    return std::copysign(std::nearbyint(a / step) * step, x);
}

// Nearest e2m1 value of |v| <= 6 (ties to the even code), keeping the sign.
float round_e2m1(float v) {
    static const float kGrid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const float mag = std::fabs(v);
    int idx = (mag > 0.25f) + (mag >= 0.75f) + (mag > 1.25f) + (mag >= 1.75f) + (mag > 2.5f) + (mag >= 3.5f) +
              (mag > 5.0f);
    const float q = kGrid[idx];
    return v < 0 ? -q : (v > 0 ? q : 0.0f * v);
}

void quantize_block(float* x, int n, QuantSim kind) {
    float amax = 0;
    for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
    switch (kind) {
        case QuantSim::kFp8Ue8m0: {
            const float s = pow2_ceil(std::max(amax, 1e-4f) * (1.0f / kFp8Max));
            for (int i = 0; i < n; ++i) x[i] = round_e4m3(std::min(std::max(x[i] / s, -kFp8Max), kFp8Max)) * s;
            return;
        }
        case QuantSim::kFp4E4m3: {
            const float s = round_e4m3(std::max(amax, 6.0f * 0.001953125f) / kFp4Max);
            for (int i = 0; i < n; ++i) x[i] = round_e2m1(std::min(std::max(x[i] / s, -kFp4Max), kFp4Max)) * s;
            return;
        }
        case QuantSim::kFp4Ue8m0: {
            const float s = pow2_ceil(std::max(amax, 6.0f * std::ldexp(1.0f, -126)) * (1.0f / kFp4Max));
            for (int i = 0; i < n; ++i) x[i] = round_e2m1(std::min(std::max(x[i] / s, -kFp4Max), kFp4Max)) * s;
            return;
        }
    }
}

}  // namespace

void CpuBackend::fake_quantize(TensorView x, QuantSim kind, int block) {
    const int64_t n = x.numel();
    DI_ICHECK(block > 0 && x.dim(-1) % block == 0, "fake_quantize: last dim ", x.dim(-1), " is not a multiple of ",
              block);
    float* data = x.f32();
    pool_.parallel_for(n / block, 256, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) quantize_block(data + i * block, block, kind);
    });
}

}  // namespace deepinfer
