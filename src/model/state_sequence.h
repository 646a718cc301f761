// A ModelSequence over an architecture's SequenceState, either owning contiguous memory or bound to memory
// a KV manager provides. `Arch` supplies: SequenceState, OwnedSequenceState, bind_state(), truncate_state(),
// copy_progress() and kMaxRollback (as the dsv4 and dsv41 namespaces do).
#pragma once

#include <memory>
#include <utility>

#include "model/model.h"

namespace deepinfer {

class Backend;

template <typename Config, typename State, typename Owned, auto Bind, auto Truncate, auto CopyProgress,
          int MaxRollback>
class StateSequence final : public ModelSequence {
public:
    StateSequence(const Config& config, const StateSpec& spec, int64_t max_tokens, Backend& backend)
        : owned_(std::make_unique<Owned>(config, spec, max_tokens, backend)),
          memory_(&owned_->memory()),
          state_(&owned_->state()) {}
    StateSequence(const Config& config, const StateSpec& spec, SequenceMemory memory)
        : external_(std::move(memory)), memory_(&external_) {
        bound_ = Bind(config, spec, external_);
        state_ = &bound_;
    }
    StateSequence(const StateSequence&) = delete;
    StateSequence& operator=(const StateSequence&) = delete;

    int64_t num_tokens() const override { return state_->num_tokens; }
    int64_t capacity() const override { return state_->capacity(); }
    SequenceMemory& memory() override { return *memory_; }
    void truncate(int64_t new_len) override { Truncate(*state_, new_len); }
    int max_rollback() const override { return MaxRollback; }
    size_t state_bytes() const override {
        size_t n = 0;
        for (const TensorView& v : memory_->rings) n += v.nbytes();
        for (const PagedRows& p : memory_->pages) n += p.blocks.size() * p.rows_per_block * p.row_elems * 4;
        return n;
    }
    State& state() { return *state_; }

    // Makes this sequence hold src's state, as if it had been fed src's tokens (it must have the room).
    void copy_from(const StateSequence& src, Backend& backend, const StateSpec& spec) {
        DI_CHECK(src.num_tokens() <= capacity(), "cannot copy a state of ", src.num_tokens(),
                 " tokens into a sequence with room for ", capacity());
        copy_sequence_memory(backend, spec, *src.memory_, *memory_, src.num_tokens());
        CopyProgress(*state_, *src.state_);
    }

private:
    std::unique_ptr<Owned> owned_;
    SequenceMemory external_;
    SequenceMemory* memory_;
    State bound_;
    State* state_ = nullptr;
};

}  // namespace deepinfer
