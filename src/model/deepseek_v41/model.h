// DeepSeek-V4.1 (model_type "deepseek_v41"), text path: the forward pass over backend ops for a batch of
// sequences, with cross-layer compressed KV, two-level indexer top-k, Engram, the delayed mHC pre-mix, the
// model's own quantize-dequantize steps, and optional prefill truncation of the layers after the last
// kv source ("YOCO prefill truncation" / SWA bounded replay).
#pragma once

#include <memory>
#include <string>

#include "model/deepseek_v41/config.h"
#include "model/deepseek_v41/engram.h"
#include "model/deepseek_v41/state.h"
#include "model/deepseek_v41/weights.h"
#include "model/model.h"
#include "model/safetensors.h"

namespace deepinfer::dsv41 {

// With kCompact, a prefill chunk runs the layers after the last kv source only on its last `keep` rows
// (their windows floored at the first kept row) when no earlier row's logits are requested; the kv-source
// layers and everything they cache still see every row.
struct PrefillTruncation {
    enum class Mode { kOff, kCompact };
    Mode mode = Mode::kCompact;
    int64_t keep_tokens = 140;

    // DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE=compact|off and DEEPINFER_YOCO_PREFILL_KEEP_TOKENS=N.
    static PrefillTruncation from_env();
};

class DeepseekV41Model final : public CausalLM {
public:
    DeepseekV41Model(const std::string& dir, const std::string& config_json, Backend& backend,
                     const LoadOptions& options);

    const ModelInfo& info() const override { return info_; }
    const StateSpec& state_spec() const override { return state_spec_; }
    const DeepseekV41Config& config() const { return config_; }
    std::unique_ptr<ModelSequence> new_sequence(SequenceMemory memory) override;
    std::unique_ptr<ModelSequence> new_sequence(int64_t max_tokens) override;
    std::unique_ptr<ModelSequence> fork_sequence(ModelSequence& src, int64_t max_tokens) override;
    Tensor forward(std::span<const SequenceInput> batch) override;
    // V4.1 runs on host backends only, where the host is the backend's memory.
    Tensor forward_on_backend(std::span<const SequenceInput> batch) override { return forward(batch); }

    void set_prefill_truncation(PrefillTruncation t) { truncation_ = t; }
    const PrefillTruncation& prefill_truncation() const { return truncation_; }
    const std::vector<int32_t>& engram_token_map() const { return token_map_; }
    // Rows the last forward ran through the late layers (after the last kv source), for reporting savings.
    int64_t last_late_rows() const { return last_late_rows_; }

private:
    struct Rows;
    struct Selections;
    void engram(int layer, const std::vector<int64_t>& table_rows, Tensor& streams);
    void attention(int layer, const Rows& rows, TensorView xn, TensorView out, Selections& sel);
    void compress(int layer, const Rows& rows, size_t seq, TensorView latent_rows, std::vector<int32_t>* groups,
                  Tensor* latents);
    void select(int layer, const Rows& rows, TensorView cq, TensorView xn, Selections& sel);

    DeepseekV41Config config_;
    Checkpoint checkpoint_;
    DeepseekV41Weights weights_;
    Backend& backend_;
    ModelInfo info_;
    StateSpec state_spec_;
    PrefillTruncation truncation_;
    std::vector<float> main_inv_freq_, compress_inv_freq_;
    std::vector<int32_t> token_map_;  // token id -> compressed id (Engram)
    EngramLayout engram_layout_;
    int64_t last_late_rows_ = 0;
};

}  // namespace deepinfer::dsv41
