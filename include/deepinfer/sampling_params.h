// Per-request generation settings, vLLM-compatible where the concepts match.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace deepinfer {

struct SamplingParams {
    float temperature = 1.0f;                // >= 0; 0 is greedy (exact argmax, lowest id on ties)
    float top_p = 1.0f;                      // (0, 1]
    int32_t top_k = 0;                       // 0 (or -1): every token
    float min_p = 0.0f;                      // [0, 1]: drop tokens below min_p times the most likely one's probability
    float repetition_penalty = 1.0f;         // > 0, 1 disables: tokens of the prompt and the output
    float presence_penalty = 0.0f;           // [-2, 2]: tokens of the output
    float frequency_penalty = 0.0f;          // [-2, 2]: per occurrence in the output
    std::optional<int64_t> max_tokens = 16;  // >= 1; nullopt: up to the context limit
    int64_t min_tokens = 0;                  // EOS and stop tokens/strings are ignored before this many tokens
    std::vector<std::string> stop;           // stop strings (need a tokenizer); the text ends before the match
    std::vector<int32_t> stop_token_ids;
    bool ignore_eos = false;
    bool include_stop_str_in_output = false;
    bool skip_special_tokens = true;   // in the output text
    std::optional<int32_t> logprobs;   // top-n log-probabilities per generated token, 0..20 (0: the chosen token only)
    std::optional<uint64_t> seq_seed;  // sampling seed of this request; none: derived from the engine's seed
    // Structured output (needs a tokenizer), JSON text: {"type": "regex" | "json_schema" | "json_object" |
    // "ebnf" | "choice", "value": ..., "strict": bool}. Empty: unconstrained.
    std::string so_args;

    // Throws deepinfer::Error naming the first bad field. Checks that need the model (token ids, context
    // length, the grammar) happen when the engine takes the request.
    void validate() const;

    // From a JSON object with the field names above ("stop" may be a string or a list of strings, "seed" is
    // accepted for seq_seed, "so_args" an object or its text). Unknown keys and wrong types throw Error.
    static SamplingParams from_json(std::string_view json);
};

}  // namespace deepinfer
