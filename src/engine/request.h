// Engine-internal request state and the step batch handed to the compute side.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "deepinfer/outputs.h"
#include "deepinfer/sampling_params.h"
#include "grammar/grammar.h"
#include "model/model.h"
#include "sample/logits_processors.h"
#include "sample/sampler.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::engine {

enum class RequestStatus { kWaiting, kRunning, kFinished };

// Token selection state of one request. While a step that samples for the request is running, only the compute
// side touches it (the matcher and history advance with every token it draws).
struct SamplerState {
    SamplingOptions options;
    PenaltyParams penalties;
    TokenHistory history;
    std::vector<int32_t> end_ids;  // EOS (unless ignore_eos) and stop ids: masked before min_tokens
    int64_t min_tokens = 0;
    int logprobs = -1;  // top-n; -1: none
    std::unique_ptr<grammar::GrammarMatcher> matcher;
    std::vector<uint32_t> mask;  // grammar mask scratch
    int64_t num_sampled = 0;     // the request-local index of the next token (the Philox counter)
};

struct Request {
    uint64_t id = 0;
    SamplingParams params;
    std::string prompt_text;
    std::vector<int32_t> tokens;  // prompt, then generated tokens as they become known
    int64_t num_prompt = 0;
    int64_t max_output = 0;         // generated-token limit: max_tokens and the context limit
    std::vector<int32_t> stop_ids;  // generated ids that end the request
    std::vector<int> eos_ids;

    // Scheduling.
    RequestStatus status = RequestStatus::kWaiting;
    int64_t num_computed = 0;  // tokens in the state or in a step in flight
    int64_t num_pending = 0;   // tokens being sampled by a step in flight
    bool in_flight = false;    // a step in flight reads this request (its sequence, its sampler)
    bool has_state = false;    // holds KV blocks
    std::unique_ptr<ModelSequence> seq;
    int64_t pages_bound = 0;  // KV pages attached to seq's memory

    SamplerState sampler;

    // Output side (main thread).
    std::unique_ptr<StreamingDetokenizer> detok;
    size_t ids_detokenized = 0;   // generated ids pushed into detok
    bool skip_last_text = false;  // it ended on a stop token, whose text is not part of the output
    bool detok_flushed = false;
    std::string text;
    size_t stop_checked = 0;   // text bytes already searched for stop strings
    size_t text_reported = 0;  // text bytes already given to the caller
    size_t ids_reported = 0;
    std::vector<LogprobEntry> logprobs;
    double cumulative_logprob = 0;
    std::string finish_reason, stop_str, error;
    int32_t stop_token_id = -1;
    bool finished_reported = false;
    RequestMetrics metrics;

    int64_t num_output() const { return static_cast<int64_t>(tokens.size()) - num_prompt; }
    bool finished() const { return status == RequestStatus::kFinished; }
    // Tokens the state must reach: known tokens plus pending samples, but never the final token of a request
    // (nobody needs its logits).
    int64_t target_tokens() const {
        return std::min<int64_t>(static_cast<int64_t>(tokens.size()) + num_pending, num_prompt + max_output - 1);
    }
};

// One sequence's part of a step.
struct StepItem {
    Request* req = nullptr;        // the engine thread's view; the compute side uses only the fields below
    ModelSequence* seq = nullptr;  // set at launch (kept alive until the step ends, even if the request is not)
    SamplerState* sampler = nullptr;
    int64_t start = 0, count = 0;  // tokens [start, start + count) of req->tokens
    bool samples = false;          // the last row's logits choose the next token
    std::vector<int32_t> tokens;   // filled when the step is launched
};

struct SampleResult {
    int32_t token = -1;
    std::optional<TokenLogprobs> logprobs;
    bool grammar_terminated = false;
    std::string error;  // this request failed to sample (e.g. its grammar allows no token)
};

struct StepBatch {
    std::vector<StepItem> items;
    std::vector<SampleResult> results;  // per item
    std::string error;                  // the whole step failed
    double compute_start = 0, compute_end = 0;
    int64_t num_tokens = 0;
};

}  // namespace deepinfer::engine
