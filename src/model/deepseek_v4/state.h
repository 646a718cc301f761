// Per-sequence DeepSeek-V4 state: everything decoding needs from earlier tokens, in plain tensor views
// (no model object), so a KV manager can own the memory and hand it to the model.
//
// Per layer: the window ring of K=V rows; for CSA/HCA layers the compressor's per-position inputs
// (a ring holding the last windows' projections, as vLLM keeps them) and the compressed entries; for CSA
// layers the same for the indexer (its entries are the indexer keys). Rings are indexed by absolute
// position modulo their capacity and hold kMaxRollback spare rows, so the last k <= kMaxRollback tokens
// can be dropped (speculative decoding) without recomputing anything: truncate_state() only moves
// num_tokens back; stale rows and entries are rewritten when those positions come again.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/deepseek_v4/config.h"

namespace deepinfer::dsv4 {

constexpr int kMaxRollback = 8;

struct CompressorState {
    TensorView rows;     // [ring, 2 * width] f32: per position, the kv projection then the gate projection
    TensorView entries;  // [max_entries, c] f32: compressed entries (after norm and RoPE)
};

struct LayerState {
    TensorView window;           // [window ring, d] f32: K=V rows by position (after norm and RoPE)
    CompressorState compressor;  // CSA/HCA layers
    CompressorState indexer;     // CSA layers: entries are the indexer keys [max_entries, index_head_dim]
};

struct SequenceState {
    int64_t num_tokens = 0;  // tokens whose effects the state holds
    int64_t max_tokens = 0;  // capacity (compressed entries are sized for it)
    std::vector<LayerState> layers;
};

enum class StateBufferKind { kWindow, kCompressorRows, kCompressorEntries, kIndexerRows, kIndexerEntries };

struct StateBuffer {
    int layer;
    StateBufferKind kind;
    Shape shape;  // f32
    size_t bytes() const { return static_cast<size_t>(shape.numel()) * 4; }
};

// The buffers one sequence of up to max_tokens needs, in a fixed order.
struct StateLayout {
    int64_t max_tokens = 0;
    std::vector<StateBuffer> buffers;
    size_t total_bytes() const;
    size_t fixed_bytes() const;              // window and compressor rings (independent of length)
    double bytes_per_token() const;          // growth of the compressed entries per token
};

StateLayout state_layout(const DeepseekV4Config& config, int64_t max_tokens);

// Views the layout's buffers in `memory` (one view per buffer, same order and shapes).
SequenceState bind_state(const StateLayout& layout, const std::vector<TensorView>& memory, int num_layers);

// Drops the last (num_tokens - new_len) tokens; at most kMaxRollback.
void truncate_state(SequenceState& state, int64_t new_len);

// A state that owns its memory (for the CLI and tests; the engine's KV manager owns memory itself).
class OwnedSequenceState {
public:
    OwnedSequenceState(const DeepseekV4Config& config, int64_t max_tokens);
    SequenceState& state() { return state_; }
    const SequenceState& state() const { return state_; }
    size_t bytes() const { return layout_.total_bytes(); }

private:
    StateLayout layout_;
    std::vector<Tensor> memory_;
    SequenceState state_;
};

// Ring capacities (rows).
int window_ring_rows(const DeepseekV4Config& config);
int compressor_ring_rows(const DeepseekV4Config& config, int layer);

}  // namespace deepinfer::dsv4
