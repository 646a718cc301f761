// Every golden case made by Hugging Face tokenizers 0.23 (tools/golden/make_tokenizer_golden.py): encode
// id for id (with and without special tokens), decode (with and without special tokens), and streaming
// detokenization equal to decode.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tokenizer_test_util.h"

namespace deepinfer {
namespace {

using nlohmann::json;

std::string show(const std::vector<int32_t>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) {
        if (i) s += ",";
        s += std::to_string(v[i]);
    }
    return s + "]";
}

std::string dump(const std::string& s) { return json(s).dump(-1, ' ', false, json::error_handler_t::replace); }

void check_cases(const std::string& name, const json& cases) {
    const Tokenizer& tok = test::cached_tokenizer(name);
    const std::string config_path = test::tok_data(name + "/tokenizer_config.json");
    const json config = file_exists(config_path) ? json::parse(read_file(config_path)) : json::object();
    ASSERT_GE(cases.size(), 400u) << name;
    int failures = 0;
    for (size_t i = 0; i < cases.size() && failures < 50; ++i) {
        const json& c = cases[i];
        const std::string text = c["text"].get<std::string>();
        const auto want = c["ids"].get<std::vector<int32_t>>();
        auto got = tok.encode(text);
        if (got != want) {
            ++failures;
            ADD_FAILURE() << name << " case " << i << " text " << dump(text) << "\n  want " << show(want) << "\n  got  "
                          << show(got);
            continue;
        }
        if (c.contains("ids_special")) {
            // Hugging Face tokenizers applies the tokenizer.json post-processor; like transformers, a
            // tokenizer_config.json that sets add_bos_token / add_eos_token takes precedence over it.
            auto want_special = c["ids_special"].get<std::vector<int32_t>>();
            if (config.contains("add_bos_token") || config.contains("add_eos_token")) {
                want_special = want;
                if (config.value("add_bos_token", false)) want_special.insert(want_special.begin(), *tok.bos_id());
                if (config.value("add_eos_token", false)) want_special.push_back(*tok.eos_id());
            }
            EXPECT_EQ(show(tok.encode(text, true)), show(want_special)) << name << " case " << i;
        }
        if (c.contains("decode_error")) continue;
        const std::string want_dec = c.contains("decoded") ? c["decoded"].get<std::string>() : text;
        const std::string want_skip = c.contains("decoded_skip") ? c["decoded_skip"].get<std::string>() : want_dec;
        std::string dec = tok.decode(got);
        if (dec != want_dec) {
            ++failures;
            ADD_FAILURE() << name << " case " << i << " decode\n  want " << dump(want_dec) << "\n  got  " << dump(dec);
            continue;
        }
        EXPECT_EQ(dump(tok.decode(got, true)), dump(want_skip)) << name << " case " << i;
        StreamingDetokenizer stream(tok);
        std::string streamed;
        for (int32_t id : got) streamed += stream.push(id);
        streamed += stream.finish();
        EXPECT_EQ(dump(streamed), dump(dec)) << name << " case " << i << " streaming";
    }
    EXPECT_EQ(failures, 0) << name;
}

json load_golden(const std::string& file) { return json::parse(read_file(test::tok_data(file))); }

class TokenizerGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerGolden, MatchesHuggingFace) {
    json g = load_golden("golden_" + GetParam() + ".json.gz");
    ASSERT_EQ(g["tokenizer"], GetParam());
    ASSERT_GE(g["cases"].size(), 1000u);
    check_cases(GetParam(), g["cases"]);
}

INSTANTIATE_TEST_SUITE_P(Families, TokenizerGolden,
                         ::testing::Values("deepseek_v4", "llama2", "llama3", "qwen3", "gpt4o"));

TEST(TokenizerGolden, Variants) {
    json g = load_golden("golden_variants.json.gz");
    auto specs = json::parse(read_file(test::tok_data("variants.json")))["variants"];
    ASSERT_EQ(g["variants"].size(), specs.size()) << "every variant must have golden cases";
    for (const json& v : g["variants"]) {
        SCOPED_TRACE(v["tokenizer"].get<std::string>());
        check_cases(v["tokenizer"].get<std::string>(), v["cases"]);
    }
}

}  // namespace
}  // namespace deepinfer
