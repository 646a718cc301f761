#include "core/dtype.h"

#include <array>
#include <cmath>
#include <limits>

namespace deepinfer {

int dtype_bits(DType t) {
    switch (t) {
        case DType::kF32: case DType::kI32: return 32;
        case DType::kF16: case DType::kBF16: case DType::kI16: return 16;
        case DType::kF8E4M3: case DType::kE8M0: case DType::kI8: case DType::kU8: case DType::kBool: return 8;
        case DType::kFP4E2M1: return 4;
        case DType::kI64: return 64;
    }
    return 0;
}

const char* dtype_name(DType t) {
    switch (t) {
        case DType::kF32: return "F32";
        case DType::kF16: return "F16";
        case DType::kBF16: return "BF16";
        case DType::kF8E4M3: return "F8_E4M3";
        case DType::kE8M0: return "F8_E8M0";
        case DType::kFP4E2M1: return "FP4_E2M1";
        case DType::kI8: return "I8";
        case DType::kU8: return "U8";
        case DType::kI16: return "I16";
        case DType::kI32: return "I32";
        case DType::kI64: return "I64";
        case DType::kBool: return "BOOL";
    }
    return "?";
}

bool parse_safetensors_dtype(std::string_view name, DType* out) {
    struct Entry { std::string_view name; DType type; };
    static constexpr Entry kTable[] = {
        {"F32", DType::kF32},        {"F16", DType::kF16},         {"BF16", DType::kBF16},
        {"F8_E4M3", DType::kF8E4M3}, {"F8_E8M0", DType::kE8M0},    {"I8", DType::kI8},
        {"U8", DType::kU8},          {"I16", DType::kI16},         {"I32", DType::kI32},
        {"I64", DType::kI64},        {"BOOL", DType::kBool},
    };
    for (const Entry& e : kTable) {
        if (e.name == name) {
            *out = e.type;
            return true;
        }
    }
    return false;
}

float f16_to_f32(uint16_t v) {
    uint32_t sign = (v >> 15) & 1u, exp = (v >> 10) & 0x1fu, mant = v & 0x3ffu;
    float mag;
    if (exp == 0) mag = std::ldexp(static_cast<float>(mant), -24);
    else if (exp == 31) mag = mant ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
    else mag = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
    return sign ? -mag : mag;
}

namespace {

constexpr float pow2(int e) {
    float r = 1.0f;
    for (; e > 0; --e) r *= 2.0f;
    for (; e < 0; ++e) r *= 0.5f;
    return r;
}

constexpr float decode_f8e4m3(unsigned v) {
    unsigned sign = v >> 7, exp = (v >> 3) & 0xfu, mant = v & 0x7u;
    if (exp == 15 && mant == 7) return __builtin_nanf("");
    float mag = exp == 0 ? static_cast<float>(mant) * pow2(-9)  // subnormal: m/8 * 2^-6
                         : static_cast<float>(mant | 8u) * pow2(static_cast<int>(exp) - 10);
    return sign ? -mag : mag;
}

struct F8Table {
    float v[256];
    constexpr F8Table() : v() {
        for (unsigned i = 0; i < 256; ++i) v[i] = decode_f8e4m3(i);
    }
};

constexpr F8Table kF8Table{};

}  // namespace

const float kF8E4M3ToF32[256] = {
#define DI_F8(i) kF8Table.v[i]
#define DI_F8_8(i) DI_F8(i), DI_F8(i + 1), DI_F8(i + 2), DI_F8(i + 3), DI_F8(i + 4), DI_F8(i + 5), DI_F8(i + 6), DI_F8(i + 7)
#define DI_F8_64(i) DI_F8_8(i), DI_F8_8(i + 8), DI_F8_8(i + 16), DI_F8_8(i + 24), DI_F8_8(i + 32), DI_F8_8(i + 40), DI_F8_8(i + 48), DI_F8_8(i + 56)
    DI_F8_64(0), DI_F8_64(64), DI_F8_64(128), DI_F8_64(192)
#undef DI_F8_64
#undef DI_F8_8
#undef DI_F8
};

const float kFP4E2M1ToF32[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                                 -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

float e8m0_to_f32(uint8_t v) {
    if (v == 0xff) return std::numeric_limits<float>::quiet_NaN();
    return std::ldexp(1.0f, static_cast<int>(v) - 127);
}

uint8_t f32_to_f8e4m3(float f) {
    // Exhaustive nearest search over the 126 finite non-negative codes; ties go to the even code.
    if (std::isnan(f)) return 0x7f;
    uint8_t sign = std::signbit(f) ? 0x80 : 0;
    float a = std::fabs(f);
    int best = 0;
    float best_err = std::numeric_limits<float>::infinity();
    for (int c = 0; c < 0x7f; ++c) {
        float err = std::fabs(kF8E4M3ToF32[c] - a);
        if (err < best_err || (err == best_err && (c & 1) == 0)) {
            best_err = err;
            best = c;
        }
    }
    return static_cast<uint8_t>(sign | best);
}

uint8_t f32_to_fp4e2m1(float f) {
    uint8_t sign = std::signbit(f) ? 8 : 0;
    float a = std::fabs(f);
    int best = 0;
    float best_err = std::numeric_limits<float>::infinity();
    for (int c = 0; c < 8; ++c) {
        float err = std::fabs(kFP4E2M1ToF32[c] - a);
        if (err < best_err || (err == best_err && (c & 1) == 0)) {
            best_err = err;
            best = c;
        }
    }
    return static_cast<uint8_t>(sign | best);
}

}  // namespace deepinfer
