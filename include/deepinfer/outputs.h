// What generation returns: one RequestOutput per prompt, vLLM-shaped.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace deepinfer {

// Log-probabilities at one generated position (from the model's raw logits, before penalties and masks).
struct LogprobEntry {
    int32_t token_id = 0;  // the generated token
    float logprob = 0;
    int32_t rank = 0;                            // 1-based rank of the generated token
    std::vector<std::pair<int32_t, float>> top;  // the SamplingParams::logprobs most likely tokens
};

struct CompletionOutput {
    int index = 0;
    std::string text;                // empty without a tokenizer
    std::vector<int32_t> token_ids;  // generated ids (a matched stop token included)
    // "stop" (EOS, a stop token or string, or a completed grammar), "length" (max_tokens or the context limit),
    // "abort", "error"; empty while running.
    std::string finish_reason;
    std::string stop_str;                // the stop string that ended it, if any
    int32_t stop_token_id = -1;          // the stop token id (not EOS) that ended it, if any
    std::vector<LogprobEntry> logprobs;  // when requested
    double cumulative_logprob = 0;
    // Streaming: what the latest update added.
    std::string delta_text;
    std::vector<int32_t> delta_token_ids;
};

struct RequestMetrics {
    double arrival_time = 0;  // seconds on a steady clock
    double first_scheduled_time = 0;
    double first_token_time = 0;
    double last_token_time = 0;
    double finished_time = 0;
    int64_t num_prompt_tokens = 0;
    int64_t num_generated_tokens = 0;
    int64_t num_preemptions = 0;
    double time_to_first_token() const { return first_token_time > 0 ? first_token_time - arrival_time : 0; }
    // Mean time between generated tokens after the first.
    double time_per_output_token() const {
        return num_generated_tokens > 1 ? (last_token_time - first_token_time) / (num_generated_tokens - 1) : 0;
    }
};

struct RequestOutput {
    uint64_t request_id = 0;
    std::string prompt;  // the prompt text (for chat: the encoded conversation)
    std::vector<int32_t> prompt_token_ids;
    std::vector<CompletionOutput> outputs;  // one completion
    bool finished = false;
    std::string error;  // set when this request failed (finish_reason "error")
    RequestMetrics metrics;
};

}  // namespace deepinfer
