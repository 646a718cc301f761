// Logits processors applied to one row before token selection, in the engine's order: penalties, then
// masks (structured-output grammar, min_tokens), then the sampler (sampler.h). All work in place on a row of
// f32 logits [vocab].
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace deepinfer {

// vLLM / OpenAI semantics: repetition_penalty divides positive (multiplies negative) logits of every token
// seen in the prompt or the output; presence_penalty subtracts once per token seen in the output,
// frequency_penalty once per occurrence in the output.
struct PenaltyParams {
    float repetition = 1.0f;  // > 0; 1 disables
    float presence = 0.0f;    // [-2, 2]
    float frequency = 0.0f;   // [-2, 2]
    bool active() const { return repetition != 1.0f || presence != 0.0f || frequency != 0.0f; }
};

// The tokens a request has seen, for the penalties.
class TokenHistory {
public:
    void set_prompt(std::span<const int32_t> prompt);
    void add_output(int32_t token) { ++output_counts_[token]; }
    const std::vector<int32_t>& prompt_tokens() const { return prompt_; }  // sorted, unique
    const std::unordered_map<int32_t, int32_t>& output_counts() const { return output_counts_; }

private:
    std::vector<int32_t> prompt_;
    std::unordered_map<int32_t, int32_t> output_counts_;
};

void apply_penalties(std::span<float> logits, const PenaltyParams& p, const TokenHistory& history);

// Token bitmask: bit (id % 32) of word (id / 32) set = allowed. Sets the logits of disallowed tokens to -inf;
// ids beyond the mask's bits are disallowed too.
void apply_token_bitmask(std::span<float> logits, std::span<const uint32_t> mask);

// Sets the logits of the given ids to -inf (e.g. EOS and stop ids before min_tokens); ids outside are ignored.
void mask_tokens(std::span<float> logits, std::span<const int32_t> ids);

// Log-probabilities of one row (log-softmax of the logits as given).
struct TokenLogprobs {
    int32_t token = 0;  // the chosen token
    float logprob = 0;
    int32_t rank = 0;                            // 1 + the number of tokens with a strictly larger logit
    std::vector<std::pair<int32_t, float>> top;  // the top_n tokens by logit (ties to the lower id)
};

TokenLogprobs compute_logprobs(std::span<const float> logits, int32_t token, int top_n);

}  // namespace deepinfer
