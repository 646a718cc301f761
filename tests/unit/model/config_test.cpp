// config.json in DeepSeek's release keys and in transformers' keys yields the same model.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/deepseek_v4/config.h"
#include "support/checkpoint_edit.h"
#include "support/npy_compare.h"

namespace deepinfer::dsv4 {
namespace {

using testing_support::data_path;
using testing_support::read_text;

DeepseekV4Config parse_file(const std::string& rel) {
    return parse_deepseek_v4_config(read_text(data_path(rel)), rel);
}

void expect_same_rope(const RopeSpec& a, const RopeSpec& b) {
    EXPECT_EQ(a.theta, b.theta);
    EXPECT_EQ(a.dim, b.dim);
    EXPECT_EQ(a.yarn, b.yarn);
    EXPECT_EQ(a.factor, b.factor);
    EXPECT_EQ(a.original_max_positions, b.original_max_positions);
    EXPECT_EQ(a.beta_fast, b.beta_fast);
    EXPECT_EQ(a.beta_slow, b.beta_slow);
    EXPECT_EQ(a.attention_factor, b.attention_factor);
}

TEST(V4Config, ReleaseAndTransformersFormsAgree) {
    const DeepseekV4Config hf = parse_file("v4/v4_tiny_a/config.json");
    const DeepseekV4Config rel = parse_file("v4/v4_tiny_a/config.legacy.json");
    EXPECT_EQ(hf.describe(), rel.describe());
    EXPECT_EQ(hf.attn, rel.attn);
    EXPECT_EQ(hf.compress_ratio, rel.compress_ratio);
    EXPECT_EQ(hf.route, rel.route);
    expect_same_rope(hf.main_rope, rel.main_rope);
    expect_same_rope(hf.compress_rope, rel.compress_rope);
    EXPECT_EQ(hf.window, rel.window);
    EXPECT_EQ(hf.index_topk, rel.index_topk);
    EXPECT_EQ(hf.hc_mult, rel.hc_mult);
    EXPECT_EQ(hf.eos_token_ids, rel.eos_token_ids);
    EXPECT_EQ(hf.swiglu_limit, rel.swiglu_limit);
    EXPECT_EQ(hf.routed_scaling, rel.routed_scaling);
}

TEST(V4Config, ReleaseFormDetails) {
    const DeepseekV4Config c = parse_file("v4/v4_tiny_fp8/config.json");
    EXPECT_EQ(c.attn, (std::vector<AttnKind>{AttnKind::kSliding, AttnKind::kCsa, AttnKind::kHca}));
    EXPECT_EQ(c.compress_ratio, (std::vector<int>{0, 4, 128}));  // the MTP entry is ignored
    EXPECT_EQ(c.route, (std::vector<RouteKind>{RouteKind::kHash, RouteKind::kScore, RouteKind::kScore}));
    EXPECT_EQ(c.main_rope.dim, 16);
    EXPECT_FALSE(c.main_rope.yarn);
    EXPECT_TRUE(c.compress_rope.yarn);
    EXPECT_EQ(c.compress_rope.factor, 16);
    EXPECT_EQ(c.compress_rope.attention_factor, 1.0);
    EXPECT_EQ(c.fp8_block_rows, 128);
    EXPECT_EQ(c.expert_dtype, "fp4");
    EXPECT_EQ(c.num_mtp_layers, 1);
}

// RoPE tables equal the reference's (meta.json records transformers' inv_freq buffers).
TEST(V4Config, RopeTablesMatchTransformers) {
    for (const char* name : {"v4_tiny_a", "v4_tiny_b_bf16", "v4_tiny_c", "v4_tiny_fp8"}) {
        const std::string dir = std::string("v4/") + name;
        const DeepseekV4Config c = parse_file(dir + "/config.json");
        const nlohmann::json meta = nlohmann::json::parse(read_text(data_path(dir + "/meta.json")));
        for (const auto& [key, spec] : {std::pair<std::string, RopeSpec>{"main", c.main_rope}, {"compress", c.compress_rope}}) {
            const std::vector<float> ref = meta["rope_inv_freq"][key].get<std::vector<float>>();
            const std::vector<float> ours = rope_inv_freq(spec);
            ASSERT_EQ(ours.size(), ref.size()) << name << " " << key;
            for (size_t i = 0; i < ref.size(); ++i)
                EXPECT_NEAR(ours[i], ref[i], 1e-6 * std::fabs(ref[i])) << name << " " << key << " " << i;
        }
    }
}

DeepseekV4Config parse_with(const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = nlohmann::json::parse(read_text(data_path("v4/v4_tiny_a/config.json")));
    edit(j);
    return parse_deepseek_v4_config(j.dump(), "edited config.json");
}

std::string parse_error(const std::function<void(nlohmann::json&)>& edit) {
    try {
        parse_with(edit);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

TEST(V4Config, BadValuesAreClearErrors) {
    EXPECT_NE(parse_error([](auto& j) { j["layer_types"][1] = "full_attention"; }).find("unknown layer type"),
              std::string::npos);
    EXPECT_NE(parse_error([](auto& j) { j["layer_types"].erase(0); }).find("at least num_hidden_layers"),
              std::string::npos);
    EXPECT_NE(parse_error([](auto& j) { j["num_key_value_heads"] = 2; }).find("num_key_value_heads must be 1"),
              std::string::npos);
    EXPECT_NE(parse_error([](auto& j) { j["rope_parameters"]["compress"]["rope_type"] = "longrope"; })
                  .find("unsupported rope_type \"longrope\""),
              std::string::npos);
    EXPECT_NE(parse_error([](auto& j) { j["o_groups"] = 3; }).find("multiple of o_groups"), std::string::npos);
    EXPECT_NE(parse_error([](auto& j) { j["hidden_size"] = "big"; }).find("\"hidden_size\" must be an integer"),
              std::string::npos);
    EXPECT_NE(parse_error([](auto& j) { j["mlp_layer_types"][0] = "dense"; }).find("unknown mlp layer type"),
              std::string::npos);
}

TEST(V4Config, TransformersDefaultsApply) {
    // Without a schedule: two HCA layers then CSA/HCA alternating; 3 hash layers.
    const DeepseekV4Config c = parse_with([](auto& j) {
        j.erase("layer_types");
        j.erase("mlp_layer_types");
    });
    EXPECT_EQ(c.attn, (std::vector<AttnKind>{AttnKind::kHca, AttnKind::kHca, AttnKind::kHca, AttnKind::kCsa}));
    EXPECT_EQ(c.route, (std::vector<RouteKind>{RouteKind::kHash, RouteKind::kHash, RouteKind::kHash, RouteKind::kScore}));
    // A nested rope sub-dict without partial_rotary_factor rotates the whole head, as in transformers.
    const DeepseekV4Config full = parse_with([](auto& j) { j["rope_parameters"]["main"].erase("partial_rotary_factor"); });
    EXPECT_EQ(full.main_rope.dim, full.head_dim);
}

}  // namespace
}  // namespace deepinfer::dsv4
