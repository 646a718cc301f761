#include "model/perplexity.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>

#include "core/thread_pool.h"
#include "deepinfer/error.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {

double PerplexityResult::nll_sum() const {
    double s = 0;
    for (double v : window_nll) s += v;
    return s;
}

int64_t PerplexityResult::tokens() const {
    int64_t n = 0;
    for (int64_t v : window_tokens) n += v;
    return n;
}

double PerplexityResult::perplexity() const {
    const int64_t n = tokens();
    return n > 0 ? std::exp(nll_sum() / static_cast<double>(n)) : 0.0;
}

std::vector<int32_t> perplexity_ids(const Tokenizer& tokenizer, std::string_view text) {
    const std::optional<int32_t> bos = tokenizer.bos_id();
    DI_CHECK(bos.has_value(), "perplexity: the tokenizer names no BOS token");
    std::vector<int32_t> ids{*bos};
    const std::vector<int32_t> body = tokenizer.encode(text);
    ids.insert(ids.end(), body.begin(), body.end());
    return ids;
}

PerplexityResult evaluate_perplexity(CausalLM& model, std::span<const int32_t> ids, int64_t context,
                                     int64_t max_windows, int64_t batch_windows, ThreadPool* pool) {
    DI_CHECK(context >= 1, "perplexity: the context must be at least 1 token");
    DI_CHECK(batch_windows >= 1, "perplexity: batch_windows must be at least 1");
    DI_CHECK(ids.size() >= 2, "perplexity: need at least 2 ids, got ", ids.size());
    const int64_t n = static_cast<int64_t>(ids.size());
    const int64_t V = model.info().vocab_size;
    // Window w: inputs ids[s, s + len), targets ids[s + 1, s + len + 1), s = w * context.
    std::vector<int64_t> starts;
    for (int64_t s = 0; s < n - 1; s += context) starts.push_back(s);
    if (max_windows > 0 && static_cast<int64_t>(starts.size()) > max_windows) starts.resize(max_windows);

    PerplexityResult result;
    for (size_t b = 0; b < starts.size(); b += batch_windows) {
        const size_t e = std::min(starts.size(), b + static_cast<size_t>(batch_windows));
        std::vector<std::unique_ptr<ModelSequence>> seqs;
        std::vector<SequenceInput> batch;
        for (size_t w = b; w < e; ++w) {
            const int64_t len = std::min(context, n - 1 - starts[w]);
            seqs.push_back(model.new_sequence(len));
            batch.push_back({seqs.back().get(), ids.subspan(starts[w], len), 0});
        }
        const Tensor logits = model.forward(batch);  // [sum of lengths, V]
        int64_t rows = 0;
        for (const SequenceInput& in : batch) rows += static_cast<int64_t>(in.tokens.size());
        DI_CHECK(logits.view().ndim() == 2 && logits.dim(0) == rows && logits.dim(1) == V, "perplexity: the model returned ",
                 logits.dim(0), " rows of logits for ", rows, " tokens");
        // -log p(target) per row; the row's target is the id after its input position.
        std::vector<int32_t> targets;
        for (size_t w = b; w < e; ++w)
            for (size_t t = 0; t < batch[w - b].tokens.size(); ++t) targets.push_back(ids[starts[w] + t + 1]);
        for (int32_t target : targets)
            DI_CHECK(target >= 0 && target < V, "perplexity: id ", target, " is outside the vocabulary of ", V);
        std::vector<double> row_nll(targets.size());
        auto score_rows = [&](int64_t r0, int64_t r1) {
            for (int64_t r = r0; r < r1; ++r) {
                const float* row = logits.f32() + r * V;
                double mx = row[0];
                for (int64_t v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(row[v]));
                double sum = 0;
                for (int64_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
                row_nll[r] = std::log(sum) + mx - static_cast<double>(row[targets[r]]);
            }
        };
        if (pool) {
            pool->parallel_for(rows, 16, score_rows);
        } else {
            score_rows(0, rows);
        }
        size_t r = 0;  // windows sum their rows in order, so the result does not depend on the threads
        for (size_t w = b; w < e; ++w) {
            const int64_t len = static_cast<int64_t>(batch[w - b].tokens.size());
            double nll = 0;
            for (int64_t t = 0; t < len; ++t) nll += row_nll[r++];
            result.window_nll.push_back(nll);
            result.window_tokens.push_back(len);
        }
    }
    return result;
}

}  // namespace deepinfer
