// Greedy decoding through a model's incremental state, as the golden tests compare it with a reference:
// the prompt in one forward, then one token per step, each the argmax of the previous logits.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/model.h"
#include "sample/sampler.h"

namespace deepinfer::testing_support {

struct GreedyDecode {
    std::vector<int32_t> ids;   // [steps]
    std::vector<float> logits;  // [steps, vocab]: the row each id was picked from
};

inline GreedyDecode greedy_decode(CausalLM& model, std::span<const int32_t> prompt, size_t steps) {
    const int64_t vocab = model.info().vocab_size;
    auto seq = model.new_sequence(static_cast<int64_t>(prompt.size() + steps));
    SequenceInput in{seq.get(), prompt, static_cast<int64_t>(prompt.size()) - 1};
    Tensor logits = model.forward(std::span<const SequenceInput>(&in, 1));
    GreedyDecode out;
    for (size_t i = 0; i < steps; ++i) {
        out.logits.insert(out.logits.end(), logits.f32(), logits.f32() + vocab);
        out.ids.push_back(argmax(std::span<const float>(logits.f32(), vocab)));
        SequenceInput step{seq.get(), std::span<const int32_t>(&out.ids.back(), 1), 0};
        logits = model.forward(std::span<const SequenceInput>(&step, 1));
    }
    return out;
}

// The logits [steps, vocab] of decoding `continuation` through the incremental state: row i is the
// distribution the model gives for continuation[i], after the prompt and continuation[0 .. i).
inline std::vector<float> teacher_forced_logits(CausalLM& model, std::span<const int32_t> prompt,
                                                std::span<const int32_t> continuation) {
    const int64_t vocab = model.info().vocab_size;
    auto seq = model.new_sequence(static_cast<int64_t>(prompt.size() + continuation.size()));
    SequenceInput in{seq.get(), prompt, static_cast<int64_t>(prompt.size()) - 1};
    Tensor logits = model.forward(std::span<const SequenceInput>(&in, 1));
    std::vector<float> out;
    for (size_t i = 0; i < continuation.size(); ++i) {
        out.insert(out.end(), logits.f32(), logits.f32() + vocab);
        if (i + 1 == continuation.size()) break;
        SequenceInput step{seq.get(), continuation.subspan(i, 1), 0};
        logits = model.forward(std::span<const SequenceInput>(&step, 1));
    }
    return out;
}

}  // namespace deepinfer::testing_support
