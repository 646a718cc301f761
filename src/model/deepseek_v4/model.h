// DeepSeek-V4 (model_type "deepseek_v4"): the forward pass over backend ops, for a batch of sequences
// each bringing any number of new tokens (prefill chunks and decode steps mix freely).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/activation_quant.h"
#include "model/deepseek_v4/config.h"
#include "model/deepseek_v4/state.h"
#include "model/deepseek_v4/weights.h"
#include "model/model.h"
#include "model/safetensors.h"

namespace deepinfer {
class StepArrays;
}

namespace deepinfer::dsv4 {

class DeepseekV4Model final : public CausalLM {
public:
    DeepseekV4Model(const std::string& dir, const std::string& config_json, Backend& backend,
                    const LoadOptions& options);

    const ModelInfo& info() const override { return info_; }
    const StateSpec& state_spec() const override { return state_spec_; }
    const DeepseekV4Config& config() const { return config_; }
    const DeepseekV4Weights& weights() const { return weights_; }  // as loaded (host views; benchmarks count them)
    std::unique_ptr<ModelSequence> new_sequence(SequenceMemory memory) override;
    std::unique_ptr<ModelSequence> new_sequence(int64_t max_tokens) override;
    std::unique_ptr<ModelSequence> fork_sequence(ModelSequence& src, int64_t max_tokens) override;
    Tensor forward(std::span<const SequenceInput> batch) override;
    Tensor forward_on_backend(std::span<const SequenceInput> batch) override;
    // While sink is set, every forward stores layer l's routed expert ids ([rows * experts_per_token], the step's
    // rows in order) in (*sink)[l]; the host then waits for the device at each MoE layer, so benchmarks record
    // routing in untimed steps only. Null stops it.
    void record_routing(std::vector<std::vector<int32_t>>* sink) { routing_sink_ = sink; }

private:
    struct StateInput {
        SequenceState* state;
        std::span<const int32_t> tokens;
        int64_t logits_from;
    };
    // The logits in the backend's memory (on_backend) or on the host.
    Tensor forward_states(std::span<const StateInput> batch, bool on_backend);
    Tensor forward_sequences(std::span<const SequenceInput> batch, bool on_backend);
    struct Rows;  // the batch flattened into rows
    void attention(int layer, const Rows& rows, TensorView xn, TensorView out);
    struct RowCopies;
    struct CompressPlan;
    CompressPlan plan_compress(int layer, const Rows& rows, bool indexer, TensorView kv, TensorView gate,
                               StepArrays& arrays, RowCopies& keep);
    void run_compress(int layer, const CompressPlan& plan, bool indexer, StepArrays& arrays);

    DeepseekV4Config config_;
    Checkpoint checkpoint_;
    DeepseekV4Weights weights_;
    Backend& backend_;
    ModelInfo info_;
    std::vector<std::vector<int32_t>>* routing_sink_ = nullptr;  // record_routing()
    StateSpec state_spec_;
    std::vector<MoeParams> moe_params_;
    ActivationQuant act_quant_;  // FP8 activations for the FP8 products (DEEPINFER_FP8_ACTIVATIONS; off by default)
    std::vector<Tensor> device_weights_;         // the weights' copies in backend memory (device backends)
    Tensor main_inv_freq_, compress_inv_freq_;   // [rope_dim / 2] in backend memory
    Tensor zero_row_, neg_inf_row_;              // constant rows for empty compressor slots
};

}  // namespace deepinfer::dsv4
