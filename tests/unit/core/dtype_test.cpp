#include <gtest/gtest.h>

#include <cmath>

#include "core/dtype.h"

namespace deepinfer {
namespace {

TEST(DType, Bf16RoundTripAndRounding) {
    EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
    EXPECT_EQ(bf16_to_f32(f32_to_bf16(-3.5f)), -3.5f);
    // 1 + 2^-8 lies halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to even (1).
    EXPECT_EQ(round_to_bf16(1.0f + std::ldexp(1.0f, -8)), 1.0f);
    EXPECT_EQ(round_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));
    EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, F8E4M3KnownCodes) {
    EXPECT_EQ(f8e4m3_to_f32(0x00), 0.0f);
    EXPECT_EQ(f8e4m3_to_f32(0x38), 1.0f);          // exp 7, mant 0
    EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);        // largest finite
    EXPECT_EQ(f8e4m3_to_f32(0xfe), -448.0f);
    EXPECT_EQ(f8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
    EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0x7f)));
    for (int c = 0; c < 256; ++c) {
        if ((c & 0x7f) == 0x7f) continue;
        float v = f8e4m3_to_f32(static_cast<uint8_t>(c));
        EXPECT_EQ(f8e4m3_to_f32(f32_to_f8e4m3(v)), v) << c;
    }
    EXPECT_EQ(f32_to_f8e4m3(1000.0f), 0x7e);  // saturates
}

TEST(DType, E8M0AndFp4) {
    EXPECT_EQ(e8m0_to_f32(127), 1.0f);
    EXPECT_EQ(e8m0_to_f32(130), 8.0f);
    EXPECT_EQ(e8m0_to_f32(120), std::ldexp(1.0f, -7));
    EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
    EXPECT_EQ(fp4e2m1_to_f32(0x7), 6.0f);
    EXPECT_EQ(fp4e2m1_to_f32(0xb), -1.5f);
    EXPECT_EQ(fp4e2m1_to_f32(f32_to_fp4e2m1(2.6f)), 3.0f);
    EXPECT_EQ(fp4e2m1_to_f32(f32_to_fp4e2m1(-0.3f)), -0.5f);
}

TEST(DType, ParseSafetensorsNames) {
    DType t;
    ASSERT_TRUE(parse_safetensors_dtype("F8_E8M0", &t));
    EXPECT_EQ(t, DType::kE8M0);
    ASSERT_TRUE(parse_safetensors_dtype("BF16", &t));
    EXPECT_EQ(t, DType::kBF16);
    EXPECT_FALSE(parse_safetensors_dtype("F9", &t));
}

}  // namespace
}  // namespace deepinfer
