// SamplingParams validation and its JSON form (the HTTP server's input later).
#include "deepinfer/sampling_params.h"

#include <gtest/gtest.h>

#include <cmath>

#include "deepinfer/error.h"

namespace deepinfer {
namespace {

// Expects validate() to throw an Error whose message names `field`.
void expect_rejected(const SamplingParams& p, const std::string& field) {
    try {
        p.validate();
        ADD_FAILURE() << field << ": accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
    }
}

TEST(SamplingParams, DefaultsAreValidAndVllmLike) {
    const SamplingParams p;
    EXPECT_NO_THROW(p.validate());
    EXPECT_EQ(p.temperature, 1.0f);
    EXPECT_EQ(p.max_tokens, 16);
    EXPECT_FALSE(p.seq_seed);
    EXPECT_TRUE(p.skip_special_tokens);
}

TEST(SamplingParams, EveryFieldIsValidated) {
    auto with = [](auto change) {
        SamplingParams p;
        change(p);
        return p;
    };
    expect_rejected(with([](SamplingParams& p) { p.temperature = -0.1f; }), "temperature");
    expect_rejected(with([](SamplingParams& p) { p.temperature = NAN; }), "temperature");
    expect_rejected(with([](SamplingParams& p) { p.top_p = 0; }), "top_p");
    expect_rejected(with([](SamplingParams& p) { p.top_p = 1.01f; }), "top_p");
    expect_rejected(with([](SamplingParams& p) { p.top_k = -2; }), "top_k");
    expect_rejected(with([](SamplingParams& p) { p.min_p = 1.5f; }), "min_p");
    expect_rejected(with([](SamplingParams& p) { p.repetition_penalty = 0; }), "repetition_penalty");
    expect_rejected(with([](SamplingParams& p) { p.presence_penalty = 3; }), "presence_penalty");
    expect_rejected(with([](SamplingParams& p) { p.frequency_penalty = -2.5f; }), "frequency_penalty");
    expect_rejected(with([](SamplingParams& p) { p.max_tokens = 0; }), "max_tokens");
    expect_rejected(with([](SamplingParams& p) { p.min_tokens = -1; }), "min_tokens");
    expect_rejected(with([](SamplingParams& p) { p.min_tokens = 20; }), "min_tokens");
    expect_rejected(with([](SamplingParams& p) { p.stop = {"ok", ""}; }), "stop");
    expect_rejected(with([](SamplingParams& p) { p.stop_token_ids = {-4}; }), "stop_token_ids");
    expect_rejected(with([](SamplingParams& p) { p.logprobs = 21; }), "logprobs");
    expect_rejected(with([](SamplingParams& p) { p.so_args = "[1, 2"; }), "so_args");
    expect_rejected(with([](SamplingParams& p) { p.so_args = R"({"type": "yaml"})"; }), "yaml");
    SamplingParams ok;
    ok.top_k = -1;
    ok.max_tokens.reset();
    ok.min_tokens = 1000;
    ok.so_args = R"({"type": "regex", "value": "[a-z]+"})";
    EXPECT_NO_THROW(ok.validate());
}

TEST(SamplingParams, FromJson) {
    const SamplingParams p = SamplingParams::from_json(R"({"temperature": 0.5, "top_p": 0.9, "top_k": 20,
        "min_p": 0.1, "repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": -0.5,
        "max_tokens": null, "min_tokens": 2, "stop": "END", "stop_token_ids": [7, 9], "ignore_eos": true,
        "include_stop_str_in_output": true, "skip_special_tokens": false, "logprobs": 3, "seed": 42,
        "so_args": {"type": "choice", "value": ["a", "b"]}})");
    EXPECT_EQ(p.temperature, 0.5f);
    EXPECT_EQ(p.top_k, 20);
    EXPECT_FALSE(p.max_tokens);
    EXPECT_EQ(p.stop, std::vector<std::string>{"END"});
    EXPECT_EQ(p.stop_token_ids, (std::vector<int32_t>{7, 9}));
    EXPECT_TRUE(p.ignore_eos && p.include_stop_str_in_output && !p.skip_special_tokens);
    EXPECT_EQ(p.logprobs, 3);
    EXPECT_EQ(p.seq_seed, 42u);
    EXPECT_EQ(p.so_args, R"({"type":"choice","value":["a","b"]})");
    EXPECT_EQ(SamplingParams::from_json(R"({"stop": ["a", "b"]})").stop, (std::vector<std::string>{"a", "b"}));
    EXPECT_TRUE(SamplingParams::from_json(R"({"stop": null})").stop.empty());
    EXPECT_EQ(SamplingParams::from_json("{}").temperature, 1.0f);
}

TEST(SamplingParams, FromJsonRejectsUnknownKeysTypesAndStopKinds) {
    const std::vector<std::pair<std::string, std::string>> bad = {
        {R"({"stop": 5})", "stop must be a string or a list of strings"},
        {R"({"stop": {"text": "x"}})", "stop must be a string or a list of strings"},
        {R"({"stop": ["x", 1]})", "stop must be a string or a list of strings"},
        {R"({"temperature": "hot"})", "temperature must be a number"},
        {R"({"max_tokens": 1.5})", "max_tokens must be an integer"},
        {R"({"ignore_eos": 1})", "ignore_eos must be true or false"},
        {R"({"seq_seed": -1})", "seq_seed must be a non-negative integer"},
        {R"({"so_args": 3})", "so_args must be an object"},
        {R"({"temprature": 0.5})", "unknown sampling parameter"},
        {R"({"top_p": 2})", "top_p"},
        {R"([1, 2])", "must be a JSON object"},
        {R"({"top_p": )", "not valid JSON"},
    };
    for (const auto& [json, message] : bad) {
        try {
            SamplingParams::from_json(json);
            ADD_FAILURE() << json << ": accepted";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << json << ": " << e.what();
        }
    }
}

}  // namespace
}  // namespace deepinfer
