// Token selection from one row of logits: greedy (exact argmax, lowest id wins ties) or sampling with
// temperature, top-k and top-p, drawing from Philox keyed by the request's seed and token index.
#pragma once

#include <cstdint>
#include <span>

namespace deepinfer {

struct SamplingOptions {
    float temperature = 0.0f;  // 0: greedy
    int top_k = 0;             // 0: all tokens
    float top_p = 1.0f;        // nucleus mass in (0, 1]
    uint64_t seed = 0;
};

// Validates the options (throws Error with the offending field).
void check_sampling_options(const SamplingOptions& o);

int32_t argmax(std::span<const float> logits);

// token_index: the request-local index of the token being chosen (0 for the first generated token).
int32_t sample_token(std::span<const float> logits, const SamplingOptions& o, uint64_t token_index);

}  // namespace deepinfer
