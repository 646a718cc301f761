#include "sample/logits_processors.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "deepinfer/error.h"

namespace deepinfer {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
}

void TokenHistory::set_prompt(std::span<const int32_t> prompt) {
    prompt_.assign(prompt.begin(), prompt.end());
    std::sort(prompt_.begin(), prompt_.end());
    prompt_.erase(std::unique(prompt_.begin(), prompt_.end()), prompt_.end());
}

void apply_penalties(std::span<float> logits, const PenaltyParams& p, const TokenHistory& history) {
    const auto v = static_cast<int64_t>(logits.size());
    auto in_range = [&](int32_t t) { return t >= 0 && t < v; };
    if (p.repetition != 1.0f) {
        auto penalise = [&](int32_t t) {
            float& l = logits[t];
            l = l > 0 ? l / p.repetition : l * p.repetition;
        };
        // Each seen token once, whether it was in the prompt, the output or both.
        for (int32_t t : history.prompt_tokens())
            if (in_range(t)) penalise(t);
        for (const auto& [t, count] : history.output_counts())
            if (in_range(t) && !std::binary_search(history.prompt_tokens().begin(), history.prompt_tokens().end(), t))
                penalise(t);
    }
    if (p.presence != 0.0f || p.frequency != 0.0f)
        for (const auto& [t, count] : history.output_counts())
            if (in_range(t)) logits[t] -= p.presence + p.frequency * static_cast<float>(count);
}

void apply_token_bitmask(std::span<float> logits, std::span<const uint32_t> mask) {
    for (size_t i = 0; i < logits.size(); ++i) {
        const size_t w = i / 32;
        if (w >= mask.size() || !((mask[w] >> (i % 32)) & 1u)) logits[i] = kNegInf;
    }
}

void mask_tokens(std::span<float> logits, std::span<const int32_t> ids) {
    for (int32_t t : ids)
        if (t >= 0 && static_cast<size_t>(t) < logits.size()) logits[t] = kNegInf;
}

TokenLogprobs compute_logprobs(std::span<const float> logits, int32_t token, int top_n) {
    DI_CHECK(!logits.empty() && token >= 0 && static_cast<size_t>(token) < logits.size(), "logprobs: token ", token,
             " outside the row");
    float mx = kNegInf;
    for (float l : logits) mx = l > mx ? l : mx;
    double sum = 0;
    for (float l : logits) sum += std::exp(l - mx);  // float exp, double sum
    const double lse = mx + std::log(sum);
    TokenLogprobs out;
    out.token = token;
    out.logprob = static_cast<float>(logits[token] - lse);
    out.rank = 1;
    for (float l : logits)
        if (l > logits[token]) ++out.rank;
    const size_t n = std::min<size_t>(static_cast<size_t>(std::max(top_n, 0)), logits.size());
    if (n > 0) {
        std::vector<int32_t> ids(logits.size());
        std::iota(ids.begin(), ids.end(), 0);
        std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
            return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
        });
        for (size_t i = 0; i < n; ++i) out.top.emplace_back(ids[i], static_cast<float>(logits[ids[i]] - lse));
    }
    return out;
}

}  // namespace deepinfer
