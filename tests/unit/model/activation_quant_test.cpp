// FP8 activations for the FP8 products (model/activation_quant.h): the switch, which products it takes, and the
// values it leaves, worked out by hand from the reference's act_quant (e4m3, scale 2^ceil(log2(amax / 448)) per block
// of 128 columns, amax at least 1e-4).
#include "model/activation_quant.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "deepinfer/error.h"
#include "support/scoped_env.h"

namespace deepinfer {
namespace {

using testing_support::ScopedEnv;

TEST(ActivationQuant, SwitchFromTheEnvironment) {
    {
        ScopedEnv env("DEEPINFER_FP8_ACTIVATIONS", nullptr);
        EXPECT_FALSE(ActivationQuant::from_env().on());
    }
    {
        ScopedEnv env("DEEPINFER_FP8_ACTIVATIONS", "0");
        EXPECT_FALSE(ActivationQuant::from_env().on());
    }
    {
        ScopedEnv env("DEEPINFER_FP8_ACTIVATIONS", "1");
        EXPECT_EQ(ActivationQuant::from_env().block, 128);
    }
    for (const char* bad : {"yes", "2", "128", " 1"}) {
        ScopedEnv env("DEEPINFER_FP8_ACTIVATIONS", bad);
        EXPECT_THROW(ActivationQuant::from_env(), Error) << bad;
    }
}

TEST(ActivationQuant, TakesFp8ProductsWhoseInputsFillWholeBlocks) {
    const ActivationQuant on{128}, off{};
    LinearWeight fp8;
    fp8.format = WeightFormat::kFp8Block;
    fp8.cols = 256;
    EXPECT_TRUE(on.quantizes(fp8));
    EXPECT_FALSE(off.quantizes(fp8));
    fp8.cols = 200;
    EXPECT_FALSE(on.quantizes(fp8));
    LinearWeight bf16;
    bf16.cols = 256;
    EXPECT_FALSE(on.quantizes(bf16));
    LinearWeight fp4;
    fp4.format = WeightFormat::kFp4Group;
    fp4.cols = 256;
    EXPECT_FALSE(on.quantizes(fp4));
}

// The routed experts quantize their inputs where both of their widths are whole blocks.
TEST(ActivationQuant, ExpertBlockWhereDAndIAreWholeBlocks) {
    const ActivationQuant on{128}, off{};
    EXPECT_EQ(on.expert_block(4096, 2048), 128);
    EXPECT_EQ(on.expert_block(4096, 192), 0);
    EXPECT_EQ(on.expert_block(200, 2048), 0);
    EXPECT_EQ(off.expert_block(4096, 2048), 0);
}

TEST(ActivationQuant, ValuesAsTheReferenceQuantizesThem) {
    auto be = create_backend("cpu", 1);
    // Two rows of two blocks. Row 0, block 0: amax 56 -> scale 56 x fp32(1 / 448) = 2^-3 (rounded exactly there);
    // block 1: amax 1e-6 < 1e-4 -> scale 2^ceil(log2(1e-4 / 448)) = 2^-22. Row 1: amax 449 -> scale 2; its second
    // block zeros (they stay zeros).
    std::vector<float> x(2 * 256, 0.0f), want(2 * 256, 0.0f);
    auto set = [&](int row, int col, float v, float q) { x[row * 256 + col] = v, want[row * 256 + col] = q; };
    set(0, 0, 56.0f, 56.0f);                         // 448 x 2^-3
    set(0, 1, 1.06f, 1.0f);                          // 8.48 x 2^-3: step 1 in [8, 16) -> 8
    set(0, 2, -3.3f, -3.25f);                        // -26.4: step 2 in [16, 32) -> -26
    set(0, 3, 0.001f, 0.0009765625f);                // 0.008: subnormal, step 2^-9 -> 4 x 2^-9
    set(0, 4, 1.0625f, 1.0f);                        // 8.5: a tie, to the even code 8
    set(0, 128, 1e-6f, 9.5367431640625e-07f);        // 4.19 x 2^-22: step 0.5 in [4, 8) -> 4 x 2^-22
    set(0, 129, -3e-7f, -2.98023223876953125e-07f);  // -1.26 x 2^-22: step 0.125 in [1, 2) -> -1.25 x 2^-22
    set(1, 0, 449.0f, 448.0f);                       // 224.5 x 2: step 16 in [128, 256) -> 224
    set(1, 1, 7.0f, 7.0f);                           // 3.5: exact
    set(1, 2, 7.3f, 7.5f);                           // 3.65: step 0.25 in [2, 4) -> 3.75
    Tensor t = be->alloc(DType::kF32, Shape{2, 256});
    be->upload(t, x.data());
    be->fake_quantize(t, QuantSim::kFp8Ue8m0, ActivationQuant{128}.block);
    std::vector<float> got(x.size());
    be->download(got.data(), t);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "row " << i / 256 << " col " << i % 256;
}

// An FP8 weight [n, k] with 128 x 128 E8M0 blocks and a BF16 one, random, on the host.
struct TwoWeights {
    std::vector<uint8_t> codes, scales;
    std::vector<uint16_t> bf16;
    LinearWeight fp8, dense;
    TwoWeights(int64_t n, int64_t k, std::mt19937& rng)
        : codes(n * k), scales(((n + 127) / 128) * (k / 128)), bf16(n * k) {
        std::normal_distribution<float> d(0.0f, 1.0f);
        for (uint8_t& c : codes) c = f32_to_f8e4m3(d(rng));
        for (uint8_t& s : scales) s = static_cast<uint8_t>(120 + rng() % 8);
        for (uint16_t& b : bf16) b = f32_to_bf16(d(rng));
        fp8.format = WeightFormat::kFp8Block;
        fp8.rows = dense.rows = n;
        fp8.cols = dense.cols = k;
        fp8.block_rows = fp8.block_cols = 128;
        fp8.data = TensorView(codes.data(), DType::kF8E4M3, Shape{n, k});
        fp8.scale = TensorView(scales.data(), DType::kE8M0, Shape{(n + 127) / 128, k / 128});
        dense.data = TensorView(bf16.data(), DType::kBF16, Shape{n, k});
    }
};

// Which products see the input quantized: of a shared input, the unquantized products see it as it was and the FP8
// ones (plain or grouped) quantized, compared with fake_quantize then the product; x itself is left as it was. Off,
// nothing is quantized.
TEST(ActivationQuant, OnlyTheFp8ProductsSeeTheInputQuantized) {
    auto be = create_backend("cpu", 1);
    std::mt19937 rng(7);
    std::normal_distribution<float> d(0.0f, 3.0f);
    const int64_t t = 3, n = 160, k = 256;
    TwoWeights w(n, k, rng);
    std::vector<float> xv(t * k);
    for (float& v : xv) v = d(rng);
    auto tensor = [&](const std::vector<float>& v, Shape s) {
        Tensor x = be->alloc(DType::kF32, s);
        std::memcpy(x.f32(), v.data(), v.size() * 4);
        return x;
    };
    Tensor x = tensor(xv, Shape{t, k}), xq = tensor(xv, Shape{t, k});
    be->fake_quantize(xq, QuantSim::kFp8Ue8m0, 128);
    Tensor a = be->alloc(DType::kF32, Shape{t, n}), b = be->alloc(DType::kF32, Shape{t, n});
    ActivationQuant{128}.linears(*be, x, {{a, &w.fp8}, {b, &w.dense}});
    Tensor want_a = be->alloc(DType::kF32, Shape{t, n}), want_b = be->alloc(DType::kF32, Shape{t, n});
    be->linear(want_a, xq, w.fp8);
    be->linear(want_b, tensor(xv, Shape{t, k}), w.dense);
    EXPECT_EQ(std::memcmp(x.f32(), xv.data(), t * k * 4), 0) << "x is left as it was";
    EXPECT_EQ(std::memcmp(a.f32(), want_a.f32(), t * n * 4), 0) << "the FP8 product takes x quantized";
    EXPECT_EQ(std::memcmp(b.f32(), want_b.f32(), t * n * 4), 0) << "the BF16 product takes x as it was";

    // Grouped (two groups of 128 columns, each group's rows 80 of the 160), and a single product.
    Tensor x2 = tensor(xv, Shape{t, k}), g = be->alloc(DType::kF32, Shape{t, n}),
           want_g = be->alloc(DType::kF32, Shape{t, n});
    LinearWeight half = w.fp8;
    half.cols = 128;
    half.data = TensorView(w.codes.data(), DType::kF8E4M3, Shape{n, 128});
    half.scale = TensorView(w.scales.data(), DType::kE8M0, Shape{(n + 127) / 128, 1});
    ActivationQuant{128}.grouped_linear(*be, g, x2, half, 2);
    be->grouped_linear(want_g, xq, half, 2);
    EXPECT_EQ(std::memcmp(x2.f32(), xv.data(), t * k * 4), 0);
    EXPECT_EQ(std::memcmp(g.f32(), want_g.f32(), t * n * 4), 0);
    Tensor x3 = tensor(xv, Shape{t, k}), one = be->alloc(DType::kF32, Shape{t, n});
    ActivationQuant{128}.linear(*be, one, x3, w.fp8);
    EXPECT_EQ(std::memcmp(one.f32(), want_a.f32(), t * n * 4), 0);
    // Off: nothing is quantized.
    Tensor x4 = tensor(xv, Shape{t, k});
    ActivationQuant{}.linear(*be, one, x4, w.fp8);
    EXPECT_EQ(std::memcmp(x4.f32(), xv.data(), t * k * 4), 0);
}

}  // namespace
}  // namespace deepinfer
