// Perplexity of a causal LM over a token stream, the way tools/train/train_tiny_v4.py's reference computes
// it: windows of `context` ids from fresh context, each predicting the id after each of its positions, so
// every id but the first is predicted exactly once.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace deepinfer {

class CausalLM;
class ThreadPool;
class Tokenizer;

struct PerplexityResult {
    std::vector<double> window_nll;      // sum of -log p(next id) per window, natural log
    std::vector<int64_t> window_tokens;  // ids predicted per window
    double nll_sum() const;
    int64_t tokens() const;
    double perplexity() const;  // exp(nll_sum / tokens)
};

// The stream a text is scored as: [bos] + encode(text) (no other special tokens). Throws Error when the
// tokenizer names no BOS token.
std::vector<int32_t> perplexity_ids(const Tokenizer& tokenizer, std::string_view text);

// ids: the stream, usually perplexity_ids(text). max_windows 0: all. Windows go through the model
// `batch_windows` at a time (each its own sequence); log-softmax in double, over the pool's threads when one
// is given (the result does not depend on it).
PerplexityResult evaluate_perplexity(CausalLM& model, std::span<const int32_t> ids, int64_t context,
                                     int64_t max_windows = 0, int64_t batch_windows = 8, ThreadPool* pool = nullptr);

}  // namespace deepinfer
