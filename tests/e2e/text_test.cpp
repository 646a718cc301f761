// The engine with a tokenizer (a fixture widened to DeepSeek-V4's vocabulary, test_models.h): text prompts,
// streaming text, stop strings, structured output over real multi-byte tokens, chat encoding.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <regex>

#include "deepinfer/llm.h"
#include "test_models.h"

namespace deepinfer {
namespace {

using testing_support::wide_vocab_model_dir;

EngineOptions options() {
    EngineOptions o;
    o.model = wide_vocab_model_dir();
    o.num_threads = 2;
    o.max_batch_tokens = 64;
    o.memory_budget = 64 << 20;
    return o;
}

SamplingParams greedy(int64_t n) {
    SamplingParams p;
    p.temperature = 0;
    p.max_tokens = n;
    p.ignore_eos = true;
    return p;
}

bool is_char_start(const std::string& s, size_t i) {
    return i >= s.size() || (static_cast<unsigned char>(s[i]) & 0xC0) != 0x80;
}

TEST(Text, PromptsStreamingAndStopStrings) {
    LLM llm(options());
    ASSERT_TRUE(llm.model_info().has_tokenizer);
    const Prompt prompt = Prompt::from_text("The quick brown fox jumps over the lazy dog.");
    const RequestOutput free_run = llm.generate({prompt}, greedy(48))[0];
    ASSERT_TRUE(free_run.error.empty()) << free_run.error;
    EXPECT_EQ(free_run.prompt, "The quick brown fox jumps over the lazy dog.");
    EXPECT_EQ(free_run.prompt_token_ids, llm.encode(free_run.prompt, /*add_special_tokens=*/true));
    EXPECT_EQ(free_run.prompt_token_ids.at(0), 0);  // BOS, as the tokenizer config asks
    const std::string text = free_run.outputs[0].text;
    EXPECT_EQ(text, llm.decode(free_run.outputs[0].token_ids, /*skip_special_tokens=*/true));
    ASSERT_GT(text.size(), 20u);

    // A stop string: two characters from the middle of that text, at their first occurrence.
    size_t p = text.size() / 2, e;
    while (!is_char_start(text, p)) ++p;
    e = p + 1;
    for (int chars = 0; chars < 2 && e < text.size(); ++e)
        if (is_char_start(text, e + 1)) ++chars;
    const std::string stop = text.substr(p, e - p);
    const size_t first = text.find(stop);
    SamplingParams s = greedy(48);
    s.stop = {"never appears \x01", stop};
    std::string streamed;
    std::vector<int32_t> streamed_ids;
    int updates = 0;
    const RequestOutput stopped = llm.generate({prompt}, s, [&](const RequestOutput& o) {
        streamed += o.outputs[0].delta_text;
        streamed_ids.insert(streamed_ids.end(), o.outputs[0].delta_token_ids.begin(),
                            o.outputs[0].delta_token_ids.end());
        ++updates;
    })[0];
    const CompletionOutput& c = stopped.outputs[0];
    EXPECT_EQ(c.finish_reason, "stop");
    EXPECT_EQ(c.stop_str, stop);
    EXPECT_EQ(c.text, text.substr(0, first));
    EXPECT_EQ(streamed, c.text);  // the stream never showed text past the stop string
    EXPECT_EQ(streamed_ids, c.token_ids);
    EXPECT_GE(updates, 2);
    s.include_stop_str_in_output = true;
    EXPECT_EQ(llm.generate({prompt}, s)[0].outputs[0].text, text.substr(0, first + stop.size()));
}

TEST(Text, StructuredOutput) {
    LLM llm(options());
    const Prompt prompt = Prompt::from_text("Answer:");
    SamplingParams p;
    p.temperature = 1.0f;
    p.max_tokens = 120;
    p.seq_seed = 3;
    std::vector<SamplingParams> params(4, p);
    params[0].so_args = R"({"type": "regex", "value": "[a-z]{2,6}-[0-9]{2}"})";
    params[1].so_args = R"({"type": "choice", "value": ["alpha", "beta", "gamma delta"]})";
    params[2].so_args = R"({"type": "json_schema", "value": {"type": "object", "properties": {
        "color": {"enum": ["red", "green", "blue"]}, "size": {"enum": ["S", "M", "L"]}},
        "required": ["color", "size"], "additionalProperties": false}})";
    params[3].so_args = R"({"type": "json_schema", "value": {"type": "object"}, "strict": true})";
    const std::vector<RequestOutput> outs = llm.generate({prompt, prompt, prompt, prompt}, params);
    for (const RequestOutput& o : outs) {
        ASSERT_TRUE(o.error.empty()) << o.error;
        EXPECT_EQ(o.outputs[0].finish_reason, "stop") << o.outputs[0].text;
        std::printf("structured: %s\n", o.outputs[0].text.c_str());
    }
    EXPECT_TRUE(std::regex_match(outs[0].outputs[0].text, std::regex("[a-z]{2,6}-[0-9]{2}")));
    const std::string choice = outs[1].outputs[0].text;
    EXPECT_TRUE(choice == "alpha" || choice == "beta" || choice == "gamma delta") << choice;
    const nlohmann::json j = nlohmann::json::parse(outs[2].outputs[0].text);
    EXPECT_TRUE(j.at("color") == "red" || j.at("color") == "green" || j.at("color") == "blue");
    EXPECT_TRUE(j.at("size") == "S" || j.at("size") == "M" || j.at("size") == "L");
    EXPECT_EQ(j.size(), 2u);
    EXPECT_EQ(nlohmann::json::parse(outs[3].outputs[0].text), nlohmann::json::object());
    // A schema the grammar compiler rejects fails that request alone.
    params[3].so_args = R"({"type": "json_schema", "value": {"type": "nonsense"}})";
    const std::vector<RequestOutput> again = llm.generate({prompt, prompt, prompt, prompt}, params);
    EXPECT_EQ(again[3].outputs[0].finish_reason, "error");
    EXPECT_FALSE(again[3].error.empty());
    for (int i = 0; i < 3; ++i) EXPECT_EQ(again[i].outputs[0].text, outs[i].outputs[0].text);
}

TEST(Text, AsyncOnOffIdenticalWithStopsPenaltiesAndGrammar) {
    std::vector<Prompt> prompts;
    std::vector<SamplingParams> params;
    const char* texts[] = {"Hello", "Once upon a time", "1, 2, 3,", "def main():", "Le chat", "東京は", "?", "Answer:"};
    for (int i = 0; i < 8; ++i) {
        prompts.push_back(Prompt::from_text(texts[i]));
        SamplingParams p;
        p.temperature = i % 3 == 0 ? 0.0f : 0.8f;
        p.top_p = 0.9f;
        p.seq_seed = 77 + i;
        p.max_tokens = 24 + 3 * i;
        p.stop = {"e", "\n"};
        p.min_tokens = i;
        p.repetition_penalty = i % 2 ? 1.3f : 1.0f;
        p.presence_penalty = i % 4 == 1 ? 0.5f : 0.0f;
        if (i % 2) p.logprobs = 2;
        if (i == 7) {
            p.so_args = R"({"type": "regex", "value": "[0-9]{4}"})";
            p.min_tokens = 0;  // the grammar ends after 4 tokens
        }
        params.push_back(p);
    }
    EngineOptions on = options(), off = options();
    on.async_scheduling = true;
    off.async_scheduling = false;
    on.batch_invariant = off.batch_invariant = true;
    LLM a(on), s(off);
    const auto x = a.generate(prompts, params), y = s.generate(prompts, params);
    int stopped = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        ASSERT_TRUE(x[i].error.empty()) << x[i].error;
        EXPECT_EQ(x[i].outputs[0].text, y[i].outputs[0].text) << i;
        EXPECT_EQ(x[i].outputs[0].token_ids, y[i].outputs[0].token_ids) << i;
        EXPECT_EQ(x[i].outputs[0].finish_reason, y[i].outputs[0].finish_reason) << i;
        stopped += !x[i].outputs[0].stop_str.empty();
    }
    EXPECT_GE(stopped, 2);
    EXPECT_GT(a.stats().steps_prepared_ahead, 0);
    EXPECT_EQ(s.stats().steps_prepared_ahead, 0);
}

TEST(Text, Chat) {
    LLM llm(options());
    const std::string messages = R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}])";
    ChatOptions thinking;
    thinking.thinking_mode = "thinking";
    const std::string chat_prompt = llm.apply_chat_template(messages);
    EXPECT_NE(chat_prompt, llm.apply_chat_template(messages, thinking));
    SamplingParams p = greedy(16);
    const std::vector<RequestOutput> outs = llm.chat({messages, "not json", "[]"}, p);
    ASSERT_TRUE(outs[0].error.empty()) << outs[0].error;
    EXPECT_EQ(outs[0].prompt, chat_prompt);
    EXPECT_EQ(outs[0].prompt_token_ids, llm.encode(chat_prompt));
    EXPECT_EQ(outs[0].outputs[0].token_ids.size(), 16u);
    EXPECT_EQ(outs[1].outputs[0].finish_reason, "error");
    EXPECT_NE(outs[1].error.find("JSON"), std::string::npos) << outs[1].error;
    EXPECT_EQ(outs[2].outputs[0].finish_reason, "error");
    // The same conversation as a Prompt in generate().
    const RequestOutput g = llm.generate({Prompt::from_messages(messages)}, p)[0];
    EXPECT_EQ(g.outputs[0].token_ids, outs[0].outputs[0].token_ids);
}

}  // namespace
}  // namespace deepinfer
