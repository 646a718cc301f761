// The interface the engine and the CLI use for any supported architecture, and the loader that picks the
// architecture from config.json's model_type.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace deepinfer {

class Backend;

struct ModelInfo {
    std::string model_type;  // "deepseek_v4"
    std::string dir;         // checkpoint directory
    int64_t vocab_size = 0;
    int64_t max_positions = 0;
    int bos_token_id = -1;
    std::vector<int> eos_token_ids;
    size_t weight_bytes = 0;  // stored bytes of the loaded weights
    std::string description;  // multi-line summary of the hyper-parameters
};

// One sequence's model state (K/V rows, compressor inputs, compressed entries, ...).
class ModelSequence {
public:
    virtual ~ModelSequence() = default;
    virtual int64_t num_tokens() const = 0;
    virtual int64_t capacity() const = 0;
    // Forgets the last num_tokens() - new_len tokens (at most max_rollback()).
    virtual void truncate(int64_t new_len) = 0;
    virtual int max_rollback() const = 0;
    virtual size_t state_bytes() const = 0;
};

// New tokens for one sequence in a forward step. Their positions continue from seq->num_tokens().
struct SequenceInput {
    ModelSequence* seq = nullptr;
    std::span<const int32_t> tokens;
    int64_t logits_from = 0;  // logits are returned for tokens[logits_from:] (tokens.size() - 1: the last)
};

class CausalLM {
public:
    virtual ~CausalLM() = default;
    virtual const ModelInfo& info() const = 0;
    virtual std::unique_ptr<ModelSequence> new_sequence(int64_t max_tokens) = 0;
    // Advances every sequence by its tokens and returns the requested logits, [rows, vocab] f32, in batch
    // order. Sequences must be distinct; bad token ids or capacity overflows throw Error before any state
    // is modified.
    virtual Tensor forward(std::span<const SequenceInput> batch) = 0;
};

// Opens a checkpoint directory (config.json + safetensors) with the architecture its model_type names.
std::unique_ptr<CausalLM> load_model(const std::string& dir, Backend& backend);

}  // namespace deepinfer
