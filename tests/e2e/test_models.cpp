#include "test_models.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <random>

#include "core/dtype.h"
#include "support/checkpoint_edit.h"
#include "support/npy_compare.h"

namespace deepinfer::testing_support {

namespace {

constexpr int64_t kWideVocab = 129280;

std::string g_dir;

void remove_dir() {
    std::string ignored;
    if (!g_dir.empty()) run_command("rm -rf '" + g_dir + "'", &ignored);
}

// [kWideVocab, D] bf16 rows: row i < 256 is the fixture's row, others a perturbed copy of a random one.
RawTensor widen(const RawTensor& t, uint64_t seed) {
    DI_CHECK((t.dtype == "F32" || t.dtype == "BF16") && t.shape.size() == 2, "expected an F32 or BF16 matrix");
    const int64_t v = t.shape[0], d = t.shape[1];
    std::vector<float> src(static_cast<size_t>(v * d));
    for (size_t i = 0; i < src.size(); ++i)
        src[i] = t.dtype == "F32" ? reinterpret_cast<const float*>(t.bytes.data())[i]
                                  : bf16_to_f32(reinterpret_cast<const uint16_t*>(t.bytes.data())[i]);
    RawTensor out{"BF16", {kWideVocab, d}, std::vector<uint8_t>(static_cast<size_t>(kWideVocab * d) * 2)};
    auto* dst = reinterpret_cast<uint16_t*>(out.bytes.data());
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> noise(0.0f, 0.05f);
    for (int64_t i = 0; i < kWideVocab; ++i) {
        const int64_t from = i < v ? i : static_cast<int64_t>(rng() % v);
        const float sign = i < v || rng() % 2 ? 1.0f : -1.0f;
        for (int64_t k = 0; k < d; ++k) {
            const float x = src[from * d + k];
            dst[i * d + k] = f32_to_bf16(i < v ? x : sign * x * (1.0f + noise(rng)));
        }
    }
    return out;
}

}  // namespace

const std::string& wide_vocab_model_dir() {
    if (!g_dir.empty()) return g_dir;
    const std::string dir = copy_fixture(data_path("v4/v4_tiny_c"), "wide_vocab_" + std::to_string(getpid()));
    std::map<std::string, RawTensor> tensors = read_safetensors(dir + "/model.safetensors");
    tensors["model.embed_tokens.weight"] = widen(tensors.at("model.embed_tokens.weight"), 1);
    tensors["head.weight"] = widen(tensors.at("head.weight"), 2);
    write_safetensors(dir + "/model.safetensors", tensors);
    std::string config = read_text(dir + "/config.json");
    const std::string key = "\"vocab_size\": 256";
    const size_t at = config.find(key);
    DI_CHECK(at != std::string::npos, "fixture config has no vocab_size 256");
    config.replace(at, key.size(), "\"vocab_size\": " + std::to_string(kWideVocab));
    write_text(dir + "/config.json", config);
    for (const char* f : {"tokenizer.json.gz", "tokenizer_config.json"})
        write_text(dir + "/" + f, read_text(data_path(std::string("tokenizer/deepseek_v4/") + f)));
    g_dir = dir;
    std::atexit(remove_dir);
    return g_dir;
}

}  // namespace deepinfer::testing_support
