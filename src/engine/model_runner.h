// The compute side of a step: one forward over every scheduled sequence, then token selection for the
// sequences that reached the end of their known tokens (penalties, masks, sampler, logprobs). A step whose
// selections need nothing but the sampler's options (greedy or temperature, top-k, top-p, min-p) selects on the
// backend and downloads only the ids.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/request.h"

namespace deepinfer {
class Backend;
}

namespace deepinfer::engine {

class ModelRunner {
public:
    ModelRunner(CausalLM& model, Backend& backend) : model_(model), backend_(backend) {}

    // Fills batch.results (one per item) or batch.error, and the compute times. Touches only the batch's
    // sequences and the sampler state of its sampling requests.
    void execute(StepBatch& batch);

private:
    // Nothing that needs the logits on the host: no penalties, grammar, min_tokens mask or logprobs.
    static bool selects_on_backend(const SamplerState& s);
    void select_on_backend(std::span<const SequenceInput> inputs, const std::vector<size_t>& sampling,
                                  StepBatch& batch);
    void sample_row(float* row, const StepItem& item, SampleResult& out);

    CausalLM& model_;
    Backend& backend_;
};

}  // namespace deepinfer::engine
