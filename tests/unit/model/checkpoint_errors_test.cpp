// Broken checkpoints are rejected with one clear error naming the file/tensor and the expectation,
// through the library (deepinfer::Error) and through the CLI (exit code != 0, one-line message).
#include <gtest/gtest.h>

#include <memory>

#include "backend/backend.h"
#include "model/model.h"
#include "support/checkpoint_edit.h"
#include "support/npy_compare.h"

namespace deepinfer {
namespace {

using namespace testing_support;

const std::string kFixture = data_path("v4/v4_tiny_a");

// Loads `dir` and returns the error message ("" if it loaded).
std::string load_error(const std::string& dir) {
    auto backend = create_backend("cpu", 1);
    try {
        load_model(dir, *backend);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

void expect_cli_rejects(const std::string& dir, const std::string& expected_fragment) {
    std::string out;
    const int rc = run_command(std::string(DI_CLI_PATH) + " logits --model '" + dir + "' --ids-npy '" + kFixture +
                                   "/ids.npy' --out '" + ::testing::TempDir() + "/never.npy'",
                               &out);
    EXPECT_NE(rc, 0) << out;
    EXPECT_LT(rc, 128) << "crashed: " << out;
    EXPECT_NE(out.find(expected_fragment), std::string::npos) << out;
    EXPECT_NE(out.find("error:"), std::string::npos) << out;
}

void edit_tensors(const std::string& dir, const std::function<void(std::map<std::string, RawTensor>&)>& edit) {
    const std::string path = dir + "/model.safetensors";
    auto tensors = read_safetensors(path);
    edit(tensors);
    write_safetensors(path, tensors);
}

TEST(CheckpointErrors, TheUntouchedCopyLoads) { EXPECT_EQ(load_error(copy_fixture(kFixture, "ok")), ""); }

TEST(CheckpointErrors, MissingTensor) {
    const std::string dir = copy_fixture(kFixture, "missing");
    edit_tensors(dir, [](auto& t) { ASSERT_EQ(t.erase("model.layers.1.attn.wq_b.weight"), 1u); });
    const std::string err = load_error(dir);
    EXPECT_NE(err.find("missing tensor 'layers.1.attn.wq_b.weight'"), std::string::npos) << err;
    expect_cli_rejects(dir, "layers.1.attn.wq_b.weight");
}

TEST(CheckpointErrors, WrongShape) {
    const std::string dir = copy_fixture(kFixture, "shape");
    edit_tensors(dir, [](auto& t) {
        RawTensor& w = t.at("model.layers.0.attn.wkv.weight");
        w.shape = {w.shape[1], w.shape[0] / 2};
        w.bytes.resize(w.bytes.size() / 2);
    });
    const std::string err = load_error(dir);
    EXPECT_NE(err.find("model.layers.0.attn.wkv.weight' has shape [32, 16], expected [32, 32]"), std::string::npos)
        << err;
    expect_cli_rejects(dir, "model.layers.0.attn.wkv.weight");
}

TEST(CheckpointErrors, WrongDtype) {
    const std::string dir = copy_fixture(kFixture, "dtype");
    edit_tensors(dir, [](auto& t) { t.at("model.layers.2.attn.wo_b.weight").dtype = "I32"; });
    const std::string err = load_error(dir);
    EXPECT_NE(err.find("wo_b.weight' has dtype I32"), std::string::npos) << err;
    expect_cli_rejects(dir, "wo_b.weight");
}

TEST(CheckpointErrors, Fp8WeightWithoutScale) {
    const std::string dir = copy_fixture(kFixture, "fp8_noscale");
    edit_tensors(dir, [](auto& t) {
        RawTensor& w = t.at("model.layers.0.attn.wq_a.weight");
        w.dtype = "F8_E4M3";
        w.bytes.resize(w.bytes.size() / 4);
    });
    const std::string err = load_error(dir);
    EXPECT_NE(err.find("is F8_E4M3 but neither 'layers.0.attn.wq_a.scale'"), std::string::npos) << err;
}

TEST(CheckpointErrors, TruncatedFile) {
    const std::string dir = copy_fixture(kFixture, "truncated");
    const std::string path = dir + "/model.safetensors";
    const std::string bytes = read_text(path);
    write_text(path, bytes.substr(0, bytes.size() - 1000));
    const std::string err = load_error(dir);
    EXPECT_NE(err.find("lies outside the file's data section"), std::string::npos) << err;
    EXPECT_NE(err.find("model.safetensors"), std::string::npos) << err;
    expect_cli_rejects(dir, "truncated file?");
}

TEST(CheckpointErrors, CorruptHeaderJson) {
    const std::string dir = copy_fixture(kFixture, "header");
    const std::string path = dir + "/model.safetensors";
    std::string bytes = read_text(path);
    bytes[8] = '[';  // the header is no longer a JSON object
    bytes[20] = '}';
    write_text(path, bytes);
    const std::string err = load_error(dir);
    EXPECT_NE(err.find("corrupt safetensors header"), std::string::npos) << err;
    expect_cli_rejects(dir, "corrupt safetensors header");
}

TEST(CheckpointErrors, HeaderLengthBeyondTheFile) {
    const std::string dir = copy_fixture(kFixture, "header_len");
    const std::string path = dir + "/model.safetensors";
    std::string bytes = read_text(path);
    bytes[6] = '\x01';  // header length ~ 2^48
    write_text(path, bytes);
    EXPECT_NE(load_error(dir).find("truncated or corrupt safetensors header"), std::string::npos);
}

TEST(CheckpointErrors, UnknownModelType) {
    const std::string dir = copy_fixture(kFixture, "model_type");
    std::string cfg = read_text(dir + "/config.json");
    cfg.replace(cfg.find("\"deepseek_v4\""), 13, "\"llama\"");
    write_text(dir + "/config.json", cfg);
    const std::string err = load_error(dir);
    EXPECT_NE(err.find("unsupported model_type \"llama\""), std::string::npos) << err;
    expect_cli_rejects(dir, "unsupported model_type");
}

TEST(CheckpointErrors, CorruptConfigJson) {
    const std::string dir = copy_fixture(kFixture, "config_json");
    write_text(dir + "/config.json", "{\"model_type\": \"deepseek_v4\", ");
    EXPECT_NE(load_error(dir).find("config.json: corrupt JSON"), std::string::npos);
}

TEST(CheckpointErrors, ConfigMissingKey) {
    const std::string dir = copy_fixture(kFixture, "config_key");
    std::string cfg = read_text(dir + "/config.json");
    cfg.replace(cfg.find("\"q_lora_rank\""), 13, "\"q_lora_rnak\"");
    write_text(dir + "/config.json", cfg);
    EXPECT_NE(load_error(dir).find("missing required key \"q_lora_rank\""), std::string::npos);
}

TEST(CheckpointErrors, MissingConfigAndMissingDirectory) {
    EXPECT_NE(load_error(::testing::TempDir() + "/no_such_model").find("does not exist"), std::string::npos);
    const std::string dir = copy_fixture(kFixture, "no_config");
    std::remove((dir + "/config.json").c_str());
    EXPECT_NE(load_error(dir).find("has no config.json"), std::string::npos);
}

TEST(CheckpointErrors, ShardIndexNamingAMissingTensor) {
    const std::string dir = copy_fixture(data_path("v4/v4_tiny_fp8"), "index");
    std::string index = read_text(dir + "/model.safetensors.index.json");
    index.replace(index.find("\"weight_map\": {") + 15, 0, "\n  \"layers.9.attn.wq_a.weight\": \"model-00001-of-00002.safetensors\",");
    write_text(dir + "/model.safetensors.index.json", index);
    EXPECT_NE(load_error(dir).find("lists tensor 'layers.9.attn.wq_a.weight'"), std::string::npos);
}

TEST(CheckpointErrors, TokenIdOutsideVocabularyIsRejectedBeforeAnyStateChanges) {
    auto backend = create_backend("cpu", 1);
    auto model = load_model(kFixture, *backend);
    auto seq = model->new_sequence(16);
    const std::vector<int32_t> bad = {3, 4, 100000};
    SequenceInput in{seq.get(), std::span<const int32_t>(bad), 0};
    EXPECT_THROW(model->forward(std::span<const SequenceInput>(&in, 1)), Error);
    EXPECT_EQ(seq->num_tokens(), 0);
    const std::vector<int32_t> too_many(17, 5);
    SequenceInput big{seq.get(), std::span<const int32_t>(too_many), 0};
    EXPECT_THROW(model->forward(std::span<const SequenceInput>(&big, 1)), Error);
    EXPECT_EQ(seq->num_tokens(), 0);
}

}  // namespace
}  // namespace deepinfer
