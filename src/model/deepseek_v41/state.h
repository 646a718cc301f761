// Per-sequence DeepSeek-V4.1 state over caller-provided memory (see deepseek_v4/state.h for the scheme):
// every layer's window ring; for kv-source layers the open compressor group's inputs (ratio 2), the
// compressed entries and the index keys (both paged); and the recent token ids Engram looks back on.
// The last kMaxRollback tokens can be dropped without recomputation.
#pragma once

#include <cstdint>
#include <climits>
#include <vector>

#include "core/tensor.h"
#include "model/deepseek_v41/config.h"
#include "model/model.h"

namespace deepinfer::dsv41 {

constexpr int kMaxRollback = 8;

struct LayerState {
    TensorView window;                      // ring [window + kMaxRollback, d] f32, rows by position
    TensorView compressor_inputs;           // kv sources of ratio > 1: ring [ratio + kMaxRollback, 2d]: kv | score
    const PagedRows* compressed = nullptr;  // kv sources: entries [d] (after RoPE and FP4 simulation)
    const PagedRows* index_keys = nullptr;  // kv sources: keys [index_head_dim]
};

struct SequenceState {
    int64_t num_tokens = 0;
    int64_t token_limit = INT64_MAX;
    // With prefill truncation, the layers after the last kv source hold window rows only from this position on.
    int64_t late_window_floor = 0;
    std::vector<LayerState> layers;
    TensorView token_history;  // ring [max_ngram - 1 + kMaxRollback, 1] f32: recent token ids by position
    const SequenceMemory* memory = nullptr;
    const StateSpec* spec = nullptr;

    int64_t capacity() const;
};

StateSpec state_spec(const DeepseekV41Config& config);
SequenceState bind_state(const DeepseekV41Config& config, const StateSpec& spec, const SequenceMemory& memory);
void truncate_state(SequenceState& state, int64_t new_len);

// Copies src's progress (token counts and bounds, not the memory) into dst.
void copy_progress(SequenceState& dst, const SequenceState& src);

}  // namespace deepinfer::dsv41
