#include "model/deepseek_v4/state.h"

#include <algorithm>
#include <string>

#include "deepinfer/error.h"

namespace deepinfer::dsv4 {

StateSpec state_spec(const DeepseekV4Config& c) {
    StateSpec spec;
    for (int l = 0; l < c.num_layers; ++l) {
        const std::string p = "l" + std::to_string(l) + ".";
        spec.buffers.push_back({p + "window", c.head_dim, c.window + kMaxRollback, 0});
        if (c.attn[l] == AttnKind::kSliding) continue;
        const int64_t m = c.compress_ratio[l];
        // CSA pools the previous window too, so its ring holds two windows of inputs.
        const int64_t ring = (c.attn[l] == AttnKind::kCsa ? 2 : 1) * m + kMaxRollback;
        spec.buffers.push_back({p + "compressor_inputs", 2 * c.compressor_width(l), ring, 0});
        spec.buffers.push_back({p + "compressed", c.head_dim, 0, m});
        if (c.attn[l] != AttnKind::kCsa) continue;
        spec.buffers.push_back({p + "indexer_inputs", 4 * c.index_head_dim, ring, 0});
        spec.buffers.push_back({p + "index_keys", c.index_head_dim, 0, m});
    }
    return spec;
}

int64_t SequenceState::capacity() const { return std::min(token_limit, paged_capacity(*spec, *memory)); }

SequenceState bind_state(const DeepseekV4Config& c, const StateSpec& spec, const SequenceMemory& memory) {
    check_sequence_memory(spec, memory);
    SequenceState s;
    s.memory = &memory;
    s.spec = &spec;
    s.layers.resize(c.num_layers);
    for (size_t i = 0; i < spec.buffers.size(); ++i) {
        const StateBufferSpec& b = spec.buffers[i];
        const int layer = std::stoi(b.name.substr(1));
        const std::string kind = b.name.substr(b.name.find('.') + 1);
        LayerState& L = s.layers[layer];
        if (b.ring_rows > 0) {
            const TensorView ring = memory.rings[i].reshape(Shape{b.ring_rows, b.row_elems});
            if (kind == "window") L.window = ring;
            else if (kind == "compressor_inputs") L.compressor.rows = ring;
            else L.indexer.rows = ring;
        } else {
            (kind == "compressed" ? L.compressor.entries : L.indexer.entries) = &memory.pages[i];
        }
    }
    return s;
}

void copy_progress(SequenceState& dst, const SequenceState& src) {
    dst.num_tokens = src.num_tokens;
}

void truncate_state(SequenceState& state, int64_t new_len) {
    DI_CHECK(new_len >= 0 && new_len <= state.num_tokens, "cannot truncate a state of ", state.num_tokens,
             " tokens to ", new_len);
    DI_CHECK(state.num_tokens - new_len <= kMaxRollback, "cannot drop ", state.num_tokens - new_len,
             " tokens: at most ", kMaxRollback, " can be rolled back");
    state.num_tokens = new_len;
}

}  // namespace deepinfer::dsv4
