#include "model/deepseek_v41/state.h"

#include <algorithm>
#include <string>

#include "deepinfer/error.h"

namespace deepinfer::dsv41 {

StateSpec state_spec(const DeepseekV41Config& c) {
    StateSpec spec;
    for (int l = 0; l < c.num_layers; ++l) {
        const std::string p = "l" + std::to_string(l) + ".";
        spec.buffers.push_back({p + "window", c.head_dim, c.window + kMaxRollback, 0});
        if (!c.is_kv_source(l)) continue;
        const int ratio = c.compress_ratio[l];
        if (ratio > 1) spec.buffers.push_back({p + "compressor_inputs", 2 * c.head_dim, ratio + kMaxRollback, 0});
        spec.buffers.push_back({p + "compressed", c.head_dim, 0, ratio});
        spec.buffers.push_back({p + "index_keys", c.index_head_dim, 0, ratio});
    }
    if (!c.engram.layer_ids.empty())
        spec.buffers.push_back({"tokens", 1, c.engram.max_ngram - 1 + kMaxRollback, 0});
    return spec;
}

int64_t SequenceState::capacity() const { return std::min(token_limit, paged_capacity(*spec, *memory)); }

SequenceState bind_state(const DeepseekV41Config& c, const StateSpec& spec, const SequenceMemory& memory) {
    check_sequence_memory(spec, memory);
    SequenceState s;
    s.memory = &memory;
    s.spec = &spec;
    s.layers.resize(c.num_layers);
    for (size_t i = 0; i < spec.buffers.size(); ++i) {
        const StateBufferSpec& b = spec.buffers[i];
        const TensorView ring = b.ring_rows > 0 ? memory.rings[i].reshape(Shape{b.ring_rows, b.row_elems}) : TensorView();
        if (b.name == "tokens") {
            s.token_history = ring;
            continue;
        }
        LayerState& L = s.layers[std::stoi(b.name.substr(1))];
        const std::string kind = b.name.substr(b.name.find('.') + 1);
        if (kind == "window") L.window = ring;
        else if (kind == "compressor_inputs") L.compressor_inputs = ring;
        else if (kind == "compressed") L.compressed = &memory.pages[i];
        else L.index_keys = &memory.pages[i];
    }
    return s;
}

void copy_progress(SequenceState& dst, const SequenceState& src) {
    dst.num_tokens = src.num_tokens;
    dst.late_window_floor = src.late_window_floor;
}

void truncate_state(SequenceState& state, int64_t new_len) {
    DI_CHECK(new_len >= 0 && new_len <= state.num_tokens, "cannot truncate a state of ", state.num_tokens,
             " tokens to ", new_len);
    DI_CHECK(state.num_tokens - new_len <= kMaxRollback, "cannot drop ", state.num_tokens - new_len,
             " tokens: at most ", kMaxRollback, " can be rolled back");
    DI_CHECK(new_len >= state.late_window_floor, "cannot roll back into a truncated prefill (its late-layer window "
             "rows were never computed)");
    state.num_tokens = new_len;
}

}  // namespace deepinfer::dsv41
