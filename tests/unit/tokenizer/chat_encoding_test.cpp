// DeepSeek-V4 chat encoding against the official encoder's cases (tests/data/tokenizer/dsv4_chat_cases.json,
// copied from shared/fixtures/dsv4_chat/cases.json), plus bad-input checks.
#include "tokenizer/chat_encoding.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "deepinfer/error.h"
#include "tokenizer_test_util.h"

namespace deepinfer {
namespace {

using Json = nlohmann::ordered_json;

Json load_cases() { return Json::parse(read_file(test::tok_data("dsv4_chat_cases.json"))); }

TEST(ChatEncoding, OfficialEncodeCases) {
    Json cases = load_cases();
    ASSERT_GE(cases["encode"].size(), 60u);
    for (size_t i = 0; i < cases["encode"].size(); ++i) {
        const Json& c = cases["encode"][i];
        ChatEncodeOptions opts;
        opts.thinking_mode = parse_thinking_mode(c["thinking_mode"].get<std::string>());
        opts.drop_thinking = c["drop_thinking"].get<bool>();
        if (!c["reasoning_effort"].is_null()) opts.reasoning_effort = c["reasoning_effort"].get<std::string>();
        EXPECT_EQ(encode_messages(c["messages"], opts), c["prompt"].get<std::string>())
            << "case " << i << " (" << c["name"].get<std::string>() << ", " << c["thinking_mode"] << ", drop "
            << c["drop_thinking"] << ", effort " << c["reasoning_effort"] << ")";
    }
}

TEST(ChatEncoding, OfficialParseCases) {
    Json cases = load_cases();
    ASSERT_GE(cases["parse"].size(), 7u);
    int errors = 0;
    for (size_t i = 0; i < cases["parse"].size(); ++i) {
        const Json& c = cases["parse"][i];
        ThinkingMode mode = parse_thinking_mode(c["thinking_mode"].get<std::string>());
        const std::string text = c["text"].get<std::string>();
        if (c.contains("error")) {
            ++errors;
            EXPECT_THROW(parse_completion(text, mode), Error) << "case " << i;
            continue;
        }
        nlohmann::json got = nlohmann::json::parse(parse_completion(text, mode).dump());
        nlohmann::json want = nlohmann::json::parse(c["message"].dump());
        EXPECT_EQ(got, want) << "case " << i;
    }
    EXPECT_GE(errors, 3);
}

TEST(ChatEncoding, ParseRoundTripsEncodedToolCalls) {
    Json msgs = Json::parse(R"([{"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "reasoning_content": "think", "tool_calls": [
          {"id": "a", "type": "function", "function": {"name": "get", "arguments": "{\"city\": \"Paris\", \"n\": [1, 2.5, null]}"}}]}])");
    ChatEncodeOptions opts;
    opts.thinking_mode = ThinkingMode::kThinking;
    opts.drop_thinking = false;
    std::string prompt = encode_messages(msgs, opts);
    size_t start = prompt.find("<｜Assistant｜><think>");
    ASSERT_NE(start, std::string::npos);
    std::string completion = prompt.substr(start + std::string("<｜Assistant｜><think>").size());
    Json parsed = parse_completion(completion, ThinkingMode::kThinking);
    EXPECT_EQ(parsed["reasoning_content"], "think");
    ASSERT_EQ(parsed["tool_calls"].size(), 1u);
    EXPECT_EQ(parsed["tool_calls"][0]["function"]["name"], "get");
    EXPECT_EQ(parsed["tool_calls"][0]["function"]["arguments"], "{\"city\": \"Paris\", \"n\": [1, 2.5, null]}");
}

TEST(ChatEncoding, ContextIsNotRepeated) {
    // With `context`, only the new messages are rendered, and they render exactly as the tail of the whole
    // conversation (tool results sorted by the call order of an assistant turn inside the context).
    Json all = Json::parse(R"([{"role": "system", "content": "S"}, {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "t2", "type": "function", "function": {"name": "g", "arguments": "{\"x\": 1}"}}]},
        {"role": "tool", "tool_call_id": "t2", "content": "R2"}, {"role": "tool", "tool_call_id": "t1", "content": "R1"},
        {"role": "assistant", "content": "done"}, {"role": "user", "content": "Q2"}])");
    for (ThinkingMode mode : {ThinkingMode::kChat, ThinkingMode::kThinking}) {
        ChatEncodeOptions opts;
        opts.thinking_mode = mode;
        std::string whole = encode_messages(all, opts);
        EXPECT_LT(whole.find("R1"), whole.find("R2"));  // sorted by call order
        Json context = Json::array(), messages = Json::array();
        for (size_t i = 0; i < all.size(); ++i) (i < 3 ? context : messages).push_back(all[i]);
        std::string tail = encode_messages(messages, opts, &context);
        ASSERT_FALSE(tail.empty());
        EXPECT_EQ(tail.find("<｜begin▁of▁sentence｜>"), std::string::npos);
        ASSERT_GE(whole.size(), tail.size());
        EXPECT_EQ(whole.substr(whole.size() - tail.size()), tail);
        EXPECT_LT(tail.find("R1"), tail.find("R2"));
    }
}

TEST(ChatEncoding, PythonJsonDumps) {
    EXPECT_EQ(python_json_dumps(Json::parse(R"({"b": 1, "a": [true, null, 1.5, 100.0, 1e-7, 1e16, -0.0]})")),
              R"({"b": 1, "a": [true, null, 1.5, 100.0, 1e-07, 1e+16, -0.0]})");
    EXPECT_EQ(python_json_dumps(Json("\u00e9\n\"\\\x01")), "\"\u00e9\\n\\\"\\\\\\u0001\"");
    EXPECT_EQ(python_json_dumps(Json(0.1)), "0.1");
    EXPECT_EQ(python_json_dumps(Json(123456789012345678.0)), "1.2345678901234568e+17");
    EXPECT_EQ(python_json_dumps(Json(0.0001)), "0.0001");
}

TEST(ChatEncoding, BadInputsGiveClearErrors) {
    ChatEncodeOptions opts;
    auto expect_error = [&](const char* messages, const char* fragment) {
        try {
            encode_messages(Json::parse(messages), opts);
            ADD_FAILURE() << "no error for " << messages;
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
        }
    };
    expect_error(R"([{"role": "wizard", "content": "x"}])", "unknown message role 'wizard'");
    expect_error(R"([{"content": "x"}])", "role");
    expect_error(R"({"role": "user"})", "array");
    expect_error(R"([{"role": "user", "content": "x", "task": "fly"}])", "invalid task");
    expect_error(R"([{"role": "developer", "content": ""}])", "developer");
    expect_error(R"([{"role": "user", "content": 5}])", "must be a string");
    expect_error(R"([{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]}])",
                 "function.arguments");
    opts.reasoning_effort = "extreme";
    expect_error(R"([{"role": "user", "content": "x"}])", "reasoning effort");
    EXPECT_THROW(parse_thinking_mode("deep"), Error);
    EXPECT_THROW(parse_completion("a\xff<｜end▁of▁sentence｜>", ThinkingMode::kChat), Error);
    EXPECT_THROW(parse_completion("x</think>y<｜end▁of▁sentence｜>tail", ThinkingMode::kThinking), Error);
    EXPECT_THROW(
        parse_completion("ok\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n<｜DSML｜parameter name=\"a\" "
                         "string=\"true\">1</｜DSML｜parameter>\n<｜DSML｜parameter name=\"a\" string=\"true\">2"
                         "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>",
                         ThinkingMode::kChat),
        Error);  // duplicate parameter
}

}  // namespace
}  // namespace deepinfer
