#include "model/deepseek_v4/state.h"

#include "deepinfer/error.h"

namespace deepinfer::dsv4 {

int window_ring_rows(const DeepseekV4Config& c) { return c.window + kMaxRollback; }

int compressor_ring_rows(const DeepseekV4Config& c, int layer) {
    // CSA pools the previous window too, so it needs two windows of inputs.
    const int windows = c.attn[layer] == AttnKind::kCsa ? 2 : 1;
    return windows * c.compress_ratio[layer] + kMaxRollback;
}

StateLayout state_layout(const DeepseekV4Config& c, int64_t max_tokens) {
    DI_CHECK(max_tokens > 0, "state capacity must be positive");
    StateLayout layout;
    layout.max_tokens = max_tokens;
    for (int l = 0; l < c.num_layers; ++l) {
        layout.buffers.push_back({l, StateBufferKind::kWindow, Shape{window_ring_rows(c), c.head_dim}});
        if (c.attn[l] == AttnKind::kSliding) continue;
        const int64_t entries = max_tokens / c.compress_ratio[l] + 1;
        const int ring = compressor_ring_rows(c, l);
        layout.buffers.push_back({l, StateBufferKind::kCompressorRows, Shape{ring, 2 * c.compressor_width(l)}});
        layout.buffers.push_back({l, StateBufferKind::kCompressorEntries, Shape{entries, c.head_dim}});
        if (c.attn[l] != AttnKind::kCsa) continue;
        layout.buffers.push_back({l, StateBufferKind::kIndexerRows, Shape{ring, 4 * c.index_head_dim}});
        layout.buffers.push_back({l, StateBufferKind::kIndexerEntries, Shape{entries, c.index_head_dim}});
    }
    return layout;
}

size_t StateLayout::total_bytes() const {
    size_t n = 0;
    for (const StateBuffer& b : buffers) n += b.bytes();
    return n;
}

size_t StateLayout::fixed_bytes() const {
    size_t n = 0;
    for (const StateBuffer& b : buffers)
        if (b.kind != StateBufferKind::kCompressorEntries && b.kind != StateBufferKind::kIndexerEntries) n += b.bytes();
    return n;
}

double StateLayout::bytes_per_token() const {
    return static_cast<double>(total_bytes() - fixed_bytes()) / static_cast<double>(max_tokens);
}

SequenceState bind_state(const StateLayout& layout, const std::vector<TensorView>& memory, int num_layers) {
    DI_ICHECK(memory.size() == layout.buffers.size(), "state memory has ", memory.size(), " buffers, layout ",
              layout.buffers.size());
    SequenceState s;
    s.max_tokens = layout.max_tokens;
    s.layers.resize(num_layers);
    for (size_t i = 0; i < memory.size(); ++i) {
        const StateBuffer& b = layout.buffers[i];
        DI_ICHECK(memory[i].dtype() == DType::kF32 && memory[i].numel() == b.shape.numel(), "state buffer ", i,
                  " has the wrong size");
        TensorView v = memory[i].reshape(b.shape);
        LayerState& L = s.layers[b.layer];
        switch (b.kind) {
            case StateBufferKind::kWindow: L.window = v; break;
            case StateBufferKind::kCompressorRows: L.compressor.rows = v; break;
            case StateBufferKind::kCompressorEntries: L.compressor.entries = v; break;
            case StateBufferKind::kIndexerRows: L.indexer.rows = v; break;
            case StateBufferKind::kIndexerEntries: L.indexer.entries = v; break;
        }
    }
    return s;
}

void truncate_state(SequenceState& state, int64_t new_len) {
    DI_CHECK(new_len >= 0 && new_len <= state.num_tokens, "cannot truncate a state of ", state.num_tokens,
             " tokens to ", new_len);
    DI_CHECK(state.num_tokens - new_len <= kMaxRollback, "cannot drop ", state.num_tokens - new_len,
             " tokens: at most ", kMaxRollback, " can be rolled back");
    state.num_tokens = new_len;
}

OwnedSequenceState::OwnedSequenceState(const DeepseekV4Config& config, int64_t max_tokens)
    : layout_(state_layout(config, max_tokens)) {
    std::vector<TensorView> views;
    for (const StateBuffer& b : layout_.buffers) {
        memory_.emplace_back(DType::kF32, b.shape);
        views.push_back(memory_.back().view());
    }
    state_ = bind_state(layout_, views, config.num_layers);
}

}  // namespace deepinfer::dsv4
