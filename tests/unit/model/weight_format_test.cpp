// Stored weight formats: dequantization and the CPU linear op on every format, against a naive product.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/backend.h"
#include "core/weight.h"
#include "model/model.h"
#include "support/checkpoint_edit.h"
#include "support/npy_compare.h"

namespace deepinfer {
namespace {

using namespace testing_support;

TEST(WeightFormat, Fp8BlockScalesIncludingPartialBlocks) {
    // 3 x 5 weight with 2 x 2 blocks: scale grid [2, 3].
    std::vector<uint8_t> codes(15);
    for (int i = 0; i < 15; ++i) codes[i] = f32_to_f8e4m3(static_cast<float>(i) * 0.25f - 1.0f);
    std::vector<uint8_t> e8m0 = {127, 128, 126, 129, 125, 130};  // 1, 2, 0.5, 4, 0.25, 8
    LinearWeight w;
    w.format = WeightFormat::kFp8Block;
    w.rows = 3;
    w.cols = 5;
    w.block_rows = w.block_cols = 2;
    w.data = TensorView(codes.data(), DType::kF8E4M3, Shape{3, 5});
    w.scale = TensorView(e8m0.data(), DType::kE8M0, Shape{2, 3});
    std::vector<float> out(15);
    dequantize_rows(w, 0, 3, out.data());
    const float scale[2][3] = {{1, 2, 0.5f}, {4, 0.25f, 8}};
    for (int r = 0; r < 3; ++r)
        for (int c = 0; c < 5; ++c)
            EXPECT_EQ(out[r * 5 + c], f8e4m3_to_f32(codes[r * 5 + c]) * scale[r / 2][c / 2]) << r << "," << c;
    // The same with fp32 scales (transformers' weight_scale_inv), and a row range.
    std::vector<float> f32_scales = {1, 2, 0.5f, 4, 0.25f, 8};
    w.scale = TensorView(f32_scales.data(), DType::kF32, Shape{2, 3});
    std::vector<float> rows(10);
    dequantize_rows(w, 1, 3, rows.data());
    for (int i = 0; i < 10; ++i) EXPECT_EQ(rows[i], out[5 + i]);
}

TEST(WeightFormat, Fp4PackedLowNibbleFirst) {
    // One row of 64 inputs in two groups of 32.
    std::vector<uint8_t> packed(32);
    for (int i = 0; i < 32; ++i) packed[i] = static_cast<uint8_t>((i % 16) | (((i + 3) % 16) << 4));
    std::vector<uint8_t> scales = {128, 125};  // 2, 0.25
    LinearWeight w;
    w.format = WeightFormat::kFp4Group;
    w.rows = 1;
    w.cols = 64;
    w.block_cols = 32;
    w.data = TensorView(packed.data(), DType::kFP4E2M1, Shape{1, 64});
    w.scale = TensorView(scales.data(), DType::kE8M0, Shape{1, 2});
    std::vector<float> out(64);
    dequantize_rows(w, 0, 1, out.data());
    for (int c = 0; c < 64; ++c) {
        const uint8_t byte = packed[c / 2];
        const uint8_t code = c % 2 == 0 ? byte & 0xf : byte >> 4;
        EXPECT_EQ(out[c], fp4e2m1_to_f32(code) * (c < 32 ? 2.0f : 0.25f)) << c;
    }
}

// The CPU linear op over each format equals a naive double-precision product with the dequantized weight.
TEST(WeightFormat, LinearOverEveryFormat) {
    auto backend = create_backend("cpu", 2);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    const int64_t n = 37, k = 96, t = 5;
    std::vector<float> dense(n * k), x(t * k);
    for (float& v : dense) v = normal(rng);
    for (float& v : x) v = normal(rng);
    std::vector<uint16_t> bf16(n * k);
    std::vector<uint8_t> fp8(n * k), fp8_scale(1 * 1, 126), fp4(n * k / 2), fp4_scale(n * k / 32);
    for (int64_t i = 0; i < n * k; ++i) {
        bf16[i] = f32_to_bf16(dense[i]);
        fp8[i] = f32_to_f8e4m3(dense[i] * 2);
    }
    for (int64_t i = 0; i < n * k / 2; ++i) fp4[i] = static_cast<uint8_t>(rng() & 0xff);
    for (uint8_t& s : fp4_scale) s = static_cast<uint8_t>(124 + rng() % 6);

    std::vector<LinearWeight> weights(4);
    weights[0].data = TensorView(dense.data(), DType::kF32, Shape{n, k});
    weights[1].data = TensorView(bf16.data(), DType::kBF16, Shape{n, k});
    weights[2].format = WeightFormat::kFp8Block;
    weights[2].data = TensorView(fp8.data(), DType::kF8E4M3, Shape{n, k});
    weights[2].scale = TensorView(fp8_scale.data(), DType::kE8M0, Shape{1, 1});
    weights[2].block_rows = weights[2].block_cols = 128;
    weights[3].format = WeightFormat::kFp4Group;
    weights[3].data = TensorView(fp4.data(), DType::kFP4E2M1, Shape{n, k});
    weights[3].scale = TensorView(fp4_scale.data(), DType::kE8M0, Shape{n, k / 32});
    weights[3].block_cols = 32;
    for (LinearWeight& w : weights) {
        w.rows = n;
        w.cols = k;
        std::vector<float> wf(n * k);
        dequantize_rows(w, 0, n, wf.data());
        Tensor out = Tensor::f32(Shape{t, n});
        backend->linear(out, TensorView(x.data(), DType::kF32, Shape{t, k}), w);
        std::vector<float> ref(t * n);
        for (int64_t r = 0; r < t; ++r)
            for (int64_t o = 0; o < n; ++o) {
                double acc = 0;
                for (int64_t i = 0; i < k; ++i) acc += static_cast<double>(x[r * k + i]) * wf[o * k + i];
                ref[r * n + o] = static_cast<float>(acc);
            }
        EXPECT_LE(rel_error(out.f32(), ref.data(), ref.size()), 1e-5) << static_cast<int>(w.format);
    }
}

// transformers' FP8 quantizer names block scales `weight_scale_inv` (fp32, multiplied despite the name):
// the release checkpoint rewritten that way gives bitwise-identical logits.
TEST(WeightFormat, WeightScaleInvSpellingGivesIdenticalLogits) {
    const std::string src = data_path("v4/v4_tiny_fp8");
    const std::string dir = copy_fixture(src, "scale_inv");
    for (const char* shard : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
        auto tensors = read_safetensors(dir + "/" + shard);
        std::map<std::string, RawTensor> renamed;
        for (auto& [name, t] : tensors) {
            const bool fp8_scale = name.size() > 6 && name.compare(name.size() - 6, 6, ".scale") == 0 &&
                                   tensors.count(name.substr(0, name.size() - 6) + ".weight") &&
                                   tensors.at(name.substr(0, name.size() - 6) + ".weight").dtype == "F8_E4M3";
            if (!fp8_scale) {
                renamed[name] = t;
                continue;
            }
            RawTensor f32{"F32", t.shape, {}};
            for (uint8_t e : t.bytes) {
                const float v = e8m0_to_f32(e);
                const auto* p = reinterpret_cast<const uint8_t*>(&v);
                f32.bytes.insert(f32.bytes.end(), p, p + 4);
            }
            renamed[name.substr(0, name.size() - 6) + ".weight_scale_inv"] = f32;
        }
        write_safetensors(dir + "/" + shard, renamed);
    }
    std::remove((dir + "/model.safetensors.index.json").c_str());  // shards are found without the index too
    auto backend = create_backend("cpu", 2);
    const std::vector<int32_t> ids = load_i32(src + "/ids.npy");
    std::vector<std::vector<float>> logits;
    for (const std::string& d : {src, dir}) {
        auto model = load_model(d, *backend);
        auto seq = model->new_sequence(static_cast<int64_t>(ids.size()));
        SequenceInput in{seq.get(), std::span<const int32_t>(ids), 0};
        Tensor t = model->forward(std::span<const SequenceInput>(&in, 1));
        logits.emplace_back(t.f32(), t.f32() + t.numel());
    }
    EXPECT_EQ(logits[0], logits[1]);
}

}  // namespace
}  // namespace deepinfer
