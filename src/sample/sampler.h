// Token selection from one row of logits: greedy (exact argmax, lowest id wins ties) or sampling with
// temperature, min-p, top-k and top-p, drawing from Philox keyed by the request's seed and token index.
#pragma once

#include <cstdint>
#include <span>

namespace deepinfer {

struct SamplingOptions {
    float temperature = 0.0f;  // 0: greedy
    int top_k = 0;             // 0: all tokens
    float top_p = 1.0f;        // nucleus mass in (0, 1]
    float min_p = 0.0f;        // drop tokens whose probability is below min_p times the largest, [0, 1]
    uint64_t seed = 0;
};

// Validates the options (throws Error with the offending field).
void check_sampling_options(const SamplingOptions& o);

// Index of the largest logit, the lowest id on ties. Throws Error when every logit is -inf (all masked) or NaN.
int32_t argmax(std::span<const float> logits);

// token_index: the request-local index of the token being chosen (0 for the first generated token). The draw
// is philox_uniform(seed, 0, token_index), so a token depends only on (logits, options, token_index).
// Filters apply in this order: temperature, min_p, top_k, top_p (candidates ranked by logit, ties to the lower
// id); the draw then walks the remaining candidates in id order. Linear time: no full sort of the vocabulary.
// Masked tokens (-inf) are never chosen; a row with every token masked is an Error.
int32_t sample_token(std::span<const float> logits, const SamplingOptions& o, uint64_t token_index);

}  // namespace deepinfer
