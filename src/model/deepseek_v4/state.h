// Per-sequence DeepSeek-V4 state: everything decoding needs from earlier tokens, in plain tensor views
// over memory the caller provides (a KV manager, or a sequence that owns its memory), with no model object inside.
//
// Per layer: the window ring of K=V rows; for CSA/HCA layers the compressor's per-position inputs (a ring
// holding the last windows' projections, as vLLM keeps them) and the compressed entries (paged: they grow
// by one row per `ratio` tokens); for CSA layers the same for the indexer, whose entries are the indexer
// keys. Rings are indexed by absolute position modulo their capacity and hold kMaxRollback spare rows, so
// the last k <= kMaxRollback tokens can be dropped (speculative decoding) without recomputing anything:
// truncate_state() only moves num_tokens back; stale rows and entries are rewritten when those positions
// come again.
#pragma once

#include <cstdint>
#include <climits>
#include <vector>

#include "core/tensor.h"
#include "model/deepseek_v4/config.h"
#include "model/model.h"

namespace deepinfer::dsv4 {

constexpr int kMaxRollback = 8;

struct CompressorState {
    TensorView rows;              // ring [ring, 2 * width] f32: per position, the kv then the gate projection
    const PagedRows* entries = nullptr;  // compressed entries [c] f32 (after norm and RoPE), one per window
};

struct LayerState {
    TensorView window;           // ring [window + kMaxRollback, d] f32: K=V rows by position
    CompressorState compressor;  // CSA/HCA layers
    CompressorState indexer;     // CSA layers: entries are the indexer keys [index_head_dim]
};

struct SequenceState {
    int64_t num_tokens = 0;  // tokens whose effects the state holds
    int64_t token_limit = INT64_MAX;  // an upper bound set by the memory's owner (an owning sequence: max_tokens)
    std::vector<LayerState> layers;
    const SequenceMemory* memory = nullptr;
    const StateSpec* spec = nullptr;

    // Tokens the paged buffers can hold now.
    int64_t capacity() const;
};

// The buffers of one sequence: per layer the window ring, then for CSA/HCA layers the compressor ring and
// its paged entries, then for CSA layers the indexer ring and its paged keys.
StateSpec state_spec(const DeepseekV4Config& config);

// Views the memory (laid out as `spec`) as a state with num_tokens = 0.
SequenceState bind_state(const DeepseekV4Config& config, const StateSpec& spec, const SequenceMemory& memory);

// Drops the last (num_tokens - new_len) tokens; at most kMaxRollback.
void truncate_state(SequenceState& state, int64_t new_len);

// Copies src's progress (token counts and bounds, not the memory) into dst.
void copy_progress(SequenceState& dst, const SequenceState& src);

}  // namespace deepinfer::dsv4
