// Element types of tensors in checkpoints and in memory, and scalar conversions to fp32.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace deepinfer {

enum class DType : uint8_t {
    kF32,
    kF16,
    kBF16,
    kF8E4M3,   // float8 e4m3fn: no infinities, 0x7f/0xff are NaN
    kE8M0,     // unsigned power-of-two scale: 2^(e - 127), 0xff is NaN
    kFP4E2M1,  // packed: two e2m1 codes per byte, low nibble = even element
    kI8,
    kU8,
    kI16,
    kI32,
    kI64,
    kBool,
};

// Size in bits of one element (4 for packed FP4).
int dtype_bits(DType t);
const char* dtype_name(DType t);

// Parses a safetensors dtype string ("F32", "BF16", "F8_E4M3", "F8_E8M0", "I8", ...).
// Returns false for an unknown string.
bool parse_safetensors_dtype(std::string_view name, DType* out);

inline float bf16_to_f32(uint16_t v) {
    uint32_t bits = static_cast<uint32_t>(v) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

// Round-to-nearest-even, NaN preserved (as torch does).
inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
    uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<uint16_t>((bits + rounding) >> 16);
}

// Rounds an fp32 value to the nearest bf16 value (returned as fp32).
inline float round_to_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float f16_to_f32(uint16_t v);

extern const float kF8E4M3ToF32[256];
extern const float kFP4E2M1ToF32[16];

inline float f8e4m3_to_f32(uint8_t v) { return kF8E4M3ToF32[v]; }
inline float fp4e2m1_to_f32(uint8_t code) { return kFP4E2M1ToF32[code & 0xf]; }
float e8m0_to_f32(uint8_t v);

// Encoders used by tests and the random-weight loader (round-to-nearest-even, saturating).
uint8_t f32_to_f8e4m3(float f);
uint8_t f32_to_fp4e2m1(float f);

}  // namespace deepinfer
