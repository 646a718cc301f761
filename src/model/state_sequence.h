// A ModelSequence over an architecture's SequenceState, either owning contiguous memory or bound to memory
// a KV manager provides. The architecture supplies its config and state types, bind_state(),
// truncate_state(), copy_progress() and kMaxRollback (as the dsv4 and dsv41 namespaces do).
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "model/model.h"

namespace deepinfer {

class Backend;

template <typename Config, typename State, auto Bind, auto Truncate, auto CopyProgress, int MaxRollback>
class StateSequence final : public ModelSequence {
public:
    // Owns contiguous memory in `backend` for up to max_tokens tokens.
    StateSequence(const Config& config, const StateSpec& spec, int64_t max_tokens, Backend& backend)
        : memory_(allocate_sequence_memory(spec, max_tokens, backend, &buffers_)), state_(Bind(config, spec, memory_)) {
        state_.token_limit = max_tokens;
    }
    // Over memory a KV manager provides (and grows).
    StateSequence(const Config& config, const StateSpec& spec, SequenceMemory memory)
        : memory_(std::move(memory)), state_(Bind(config, spec, memory_)) {}
    // The state views memory_, so the sequence never moves.
    StateSequence(const StateSequence&) = delete;
    StateSequence& operator=(const StateSequence&) = delete;

    // A sequence owning room for max_tokens tokens that starts as a copy of src's state, as if it had been
    // fed src's tokens. src must be a sequence of the same model.
    static std::unique_ptr<StateSequence> fork(ModelSequence& src, const Config& config, const StateSpec& spec,
                                               int64_t max_tokens, Backend& backend) {
        auto* from = dynamic_cast<StateSequence*>(&src);
        DI_CHECK(from, "fork_sequence: the source does not belong to this model");
        auto seq = std::make_unique<StateSequence>(config, spec, max_tokens, backend);
        DI_CHECK(from->num_tokens() <= seq->capacity(), "cannot copy a state of ", from->num_tokens(),
                 " tokens into a sequence with room for ", seq->capacity());
        copy_sequence_memory(backend, spec, from->memory_, seq->memory_, from->num_tokens());
        CopyProgress(seq->state_, from->state_);
        return seq;
    }

    int64_t num_tokens() const override { return state_.num_tokens; }
    int64_t capacity() const override { return state_.capacity(); }
    SequenceMemory& memory() override { return memory_; }
    void truncate(int64_t new_len) override { Truncate(state_, new_len); }
    int max_rollback() const override { return MaxRollback; }
    size_t state_bytes() const override {
        size_t n = 0;
        for (const TensorView& v : memory_.rings) n += v.nbytes();
        for (const PagedRows& p : memory_.pages) n += p.blocks.size() * p.rows_per_block * p.row_elems * 4;
        return n;
    }
    State& state() { return state_; }

private:
    std::vector<Tensor> buffers_;  // the owned memory (empty over a KV manager's); memory_ views it
    SequenceMemory memory_;
    State state_;  // views memory_
};

}  // namespace deepinfer
