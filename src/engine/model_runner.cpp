#include "engine/model_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <span>
#include <string>

#include "backend/backend.h"
#include "core/thread_pool.h"

namespace deepinfer::engine {

namespace {
double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
}  // namespace

void ModelRunner::execute(StepBatch& batch) {
    batch.compute_start = now();
    batch.results.assign(batch.items.size(), SampleResult{});
    try {
        std::vector<SequenceInput> inputs;
        std::vector<size_t> sampling;  // items whose last row has logits, in row order
        inputs.reserve(batch.items.size());
        for (size_t i = 0; i < batch.items.size(); ++i) {
            const StepItem& it = batch.items[i];
            const auto n = static_cast<int64_t>(it.tokens.size());
            inputs.push_back({it.seq, std::span<const int32_t>(it.tokens), it.samples ? n - 1 : n});
            if (it.samples) sampling.push_back(i);
        }
        const int64_t vocab = model_.info().vocab_size;
        if (!sampling.empty() && std::all_of(sampling.begin(), sampling.end(), [&](size_t i) {
                return selects_on_backend(*batch.items[i].sampler);
            })) {
            select_on_backend(inputs, sampling, batch);
            batch.compute_end = now();
            return;
        }
        Tensor logits = model_.forward(inputs);  // [sampling rows, vocab] f32
        // Rows are independent: each touches only its own request's sampler state.
        backend_.pool().parallel_for(static_cast<int64_t>(sampling.size()), 1, [&](int64_t b, int64_t e) {
            for (int64_t r = b; r < e; ++r) {
                const size_t i = sampling[r];
                sample_row(logits.f32() + r * vocab, batch.items[i], batch.results[i]);
            }
        });
    } catch (const std::exception& e) {
        batch.error = e.what();
    }
    batch.compute_end = now();
}

bool ModelRunner::selects_on_backend(const SamplerState& s) {
    return !s.penalties.active() && s.num_sampled >= s.min_tokens && !s.matcher && s.logprobs < 0;
}

// Every sampling row needs only its options: greedy rows take the argmax, the others sample_rows() (the same
// rules and Philox draws as the host sampler), where the logits are; only [R] ids come back. A row the backend
// cannot decide (-1: NaN or fully masked logits) takes the host path, which reports the error.
void ModelRunner::select_on_backend(std::span<const SequenceInput> inputs, const std::vector<size_t>& sampling,
                                    StepBatch& batch) {
    Tensor logits = model_.forward_on_backend(inputs);  // [sampling rows, vocab] f32, backend memory
    const auto rows = static_cast<int64_t>(sampling.size());
    std::vector<Backend::SampleRow> options;
    options.reserve(sampling.size());
    for (size_t i : sampling) {
        const SamplerState& s = *batch.items[i].sampler;
        options.push_back({s.options.temperature, s.options.top_k, s.options.top_p, s.options.min_p, s.options.seed,
                           static_cast<uint64_t>(s.num_sampled)});
    }
    Tensor ids_d = backend_.alloc(DType::kI32, Shape{rows});
    if (std::all_of(options.begin(), options.end(), [](const Backend::SampleRow& o) { return o.temperature == 0; }))
        backend_.argmax_rows(ids_d, logits);
    else
        backend_.sample_rows(ids_d, logits, options);
    std::vector<int32_t> ids(static_cast<size_t>(rows));
    backend_.download(ids.data(), ids_d);
    const int64_t vocab = model_.info().vocab_size;
    for (int64_t r = 0; r < rows; ++r) {
        const StepItem& item = batch.items[sampling[r]];
        SampleResult& out = batch.results[sampling[r]];
        if (ids[r] >= vocab) {
            out.error = "the device's token selection returned token " + std::to_string(ids[r]) +
                        " outside the vocabulary of " + std::to_string(vocab);
            continue;
        }
        if (ids[r] < 0) {
            std::vector<float> row(static_cast<size_t>(vocab));
            backend_.download(row.data(), logits.view().slice_rows(r, r + 1));
            sample_row(row.data(), item, out);
            continue;
        }
        SamplerState& s = *item.sampler;
        s.history.add_output(ids[r]);
        ++s.num_sampled;
        out.token = ids[r];
    }
}

void ModelRunner::sample_row(float* row, const StepItem& item, SampleResult& out) {
    SamplerState& s = *item.sampler;
    const auto vocab = static_cast<size_t>(model_.info().vocab_size);
    std::span<float> logits(row, vocab);
    try {
        std::vector<float> raw;
        if (s.logprobs >= 0) raw.assign(logits.begin(), logits.end());
        if (s.penalties.active()) apply_penalties(logits, s.penalties, s.history);
        if (s.num_sampled < s.min_tokens) mask_tokens(logits, s.end_ids);
        if (s.matcher) {
            s.matcher->fill_mask(s.mask.data());
            apply_token_bitmask(logits, s.mask);
        }
        if (s.matcher || s.num_sampled < s.min_tokens) {
            const bool any = std::any_of(logits.begin(), logits.end(), [](float l) { return l > -INFINITY; });
            DI_CHECK(any, "no token can be generated: ", s.matcher ? "the structured-output grammar" : "",
                     s.matcher && s.num_sampled < s.min_tokens ? " and " : "",
                     s.num_sampled < s.min_tokens ? "min_tokens (which masks EOS and stop tokens)" : "",
                     " exclude every token");
        }
        const int32_t token = sample_token(logits, s.options, static_cast<uint64_t>(s.num_sampled));
        if (s.matcher) {
            DI_CHECK(s.matcher->accept(token), "the grammar rejected token ", token, " that its mask allowed");
            out.grammar_terminated = s.matcher->is_terminated();
        }
        s.history.add_output(token);
        ++s.num_sampled;
        if (s.logprobs >= 0) out.logprobs = compute_logprobs(raw, token, s.logprobs);
        out.token = token;
    } catch (const std::exception& e) {
        out.error = e.what();
    }
}

}  // namespace deepinfer::engine
