// --load-format random: weights in the release formats, deterministic per seed, finite logits.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/backend.h"
#include "core/weight.h"
#include "model/model.h"
#include "model/random_weights.h"
#include "support/npy_compare.h"

namespace deepinfer {
namespace {

using namespace testing_support;

TEST(RandomWeights, ReleaseFormatsFollowDeepSeekCheckpoints) {
    EXPECT_EQ(release_format("layers.3.ffn.experts.17.w2"), ReleaseFormat::kFp4Group);
    EXPECT_EQ(release_format("layers.3.ffn.shared_experts.w1"), ReleaseFormat::kFp8Block);
    EXPECT_EQ(release_format("layers.0.attn.wq_b"), ReleaseFormat::kFp8Block);
    EXPECT_EQ(release_format("layers.2.attn.indexer.wq_b"), ReleaseFormat::kFp8Block);
    EXPECT_EQ(release_format("layers.2.attn.indexer.weights_proj"), ReleaseFormat::kBF16);
    EXPECT_EQ(release_format("layers.2.attn.compressor.wkv"), ReleaseFormat::kBF16);
    EXPECT_EQ(release_format("layers.2.ffn.gate"), ReleaseFormat::kBF16);
    EXPECT_EQ(release_format("embed"), ReleaseFormat::kBF16);
    EXPECT_EQ(release_format("head"), ReleaseFormat::kBF16);
}

// The dequantized values of each format have a standard deviation near 1/sqrt(in_features).
TEST(RandomWeights, MatricesHaveTheIntendedScale) {
    const int64_t rows = 256, cols = 1024;
    for (ReleaseFormat f : {ReleaseFormat::kBF16, ReleaseFormat::kFp8Block, ReleaseFormat::kFp4Group}) {
        std::vector<NamedTensor> parts = random_matrix("w", rows, cols, f, 128, 128, 7);
        LinearWeight w;
        w.rows = rows;
        w.cols = cols;
        w.data = parts[0].tensor.view();
        if (f == ReleaseFormat::kFp8Block) {
            ASSERT_EQ(parts.size(), 2u);
            EXPECT_EQ(parts[0].tensor.dtype(), DType::kF8E4M3);
            EXPECT_EQ(parts[1].tensor.shape(), Shape({2, 8}));
            w.format = WeightFormat::kFp8Block;
            w.block_rows = w.block_cols = 128;
            w.scale = parts[1].tensor.view();
        } else if (f == ReleaseFormat::kFp4Group) {
            ASSERT_EQ(parts.size(), 2u);
            EXPECT_EQ(parts[0].tensor.shape(), Shape({rows, cols / 2}));
            EXPECT_EQ(parts[1].tensor.shape(), Shape({rows, cols / 32}));
            w.format = WeightFormat::kFp4Group;
            w.block_cols = 32;
            w.scale = parts[1].tensor.view();
            w.data = TensorView(parts[0].tensor.view().data(), DType::kFP4E2M1, Shape{rows, cols});
        } else {
            EXPECT_EQ(parts[0].tensor.dtype(), DType::kBF16);
        }
        std::vector<float> row(cols);
        double sum2 = 0;
        for (int64_t r = 0; r < rows; ++r) {
            dequantize_rows(w, r, r + 1, row.data());
            for (float v : row) {
                ASSERT_TRUE(std::isfinite(v));
                sum2 += static_cast<double>(v) * v;
            }
        }
        const double stddev = std::sqrt(sum2 / (rows * cols));
        // Power-of-two scales put FP8/FP4 within a factor sqrt(2) of the target.
        EXPECT_GT(stddev, 0.7 / std::sqrt(cols)) << static_cast<int>(f);
        EXPECT_LT(stddev, 1.45 / std::sqrt(cols)) << static_cast<int>(f);
    }
}

TEST(RandomWeights, HashTablesHoldDistinctExpertsInRange) {
    Tensor t = random_index_table(500, 6, 16, 3);
    for (int64_t r = 0; r < 500; ++r) {
        const int32_t* p = t.as<int32_t>() + r * 6;
        for (int j = 0; j < 6; ++j) {
            EXPECT_GE(p[j], 0);
            EXPECT_LT(p[j], 16);
            for (int i = 0; i < j; ++i) EXPECT_NE(p[i], p[j]);
        }
    }
}

std::vector<float> last_logits(CausalLM& model, const std::vector<int32_t>& ids) {
    auto seq = model.new_sequence(static_cast<int64_t>(ids.size()));
    SequenceInput in{seq.get(), ids, static_cast<int64_t>(ids.size()) - 1};
    Tensor t = model.forward(std::span<const SequenceInput>(&in, 1));
    return std::vector<float>(t.f32(), t.f32() + t.numel());
}

// A config alone is enough; the same seed gives the same model, another seed another one.
TEST(RandomWeights, ModelFromConfigIsDeterministicPerSeed) {
    auto backend = create_backend("cpu", 2);
    const std::string dir = data_path("v4/v4_tiny_c");
    std::vector<int32_t> ids(60);
    for (int i = 0; i < 60; ++i) ids[i] = (i * 37) % 256;
    LoadOptions opts;
    opts.format = "random";
    opts.seed = 11;
    auto a = load_model(dir, *backend, opts), b = load_model(dir, *backend, opts);
    opts.seed = 12;
    auto c = load_model(dir, *backend, opts);
    const std::vector<float> la = last_logits(*a, ids), lb = last_logits(*b, ids), lc = last_logits(*c, ids);
    EXPECT_EQ(la, lb);
    EXPECT_NE(la, lc);
    double sum2 = 0;
    for (float v : la) {
        ASSERT_TRUE(std::isfinite(v));
        sum2 += static_cast<double>(v) * v;
    }
    const double rms = std::sqrt(sum2 / la.size());
    EXPECT_GT(rms, 0.1);
    EXPECT_LT(rms, 10.0);
    // The stored bytes of the synthetic tensors are counted like a checkpoint's.
    EXPECT_NE(a->info().weight_bytes, 0u);
    LoadOptions bad;
    bad.format = "dummy";
    EXPECT_THROW(load_model(dir, *backend, bad), Error);
}

}  // namespace
}  // namespace deepinfer
