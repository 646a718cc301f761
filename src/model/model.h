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
class Checkpoint;

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

// A growing per-sequence buffer kept in fixed-size blocks: row i lives in blocks[i / rows_per_block].
struct PagedRows {
    std::vector<float*> blocks;
    int64_t rows_per_block = 0;
    int64_t row_elems = 0;  // f32 elements per row

    float* row(int64_t i) const { return blocks[i / rows_per_block] + (i % rows_per_block) * row_elems; }
    int64_t capacity_rows() const { return static_cast<int64_t>(blocks.size()) * rows_per_block; }
};

// One buffer of a sequence's state: either a ring allocated once with the sequence, or a paged buffer that
// grows by one row per `tokens_per_row` tokens.
struct StateBufferSpec {
    std::string name;            // e.g. "l3.window", "l2.compressed"
    int64_t row_elems = 0;       // f32 elements per row
    int64_t ring_rows = 0;       // > 0: a ring of this many rows
    int64_t tokens_per_row = 0;  // > 0: paged, rows needed for n tokens = n / tokens_per_row

    int64_t rows_for(int64_t tokens) const { return tokens_per_row > 0 ? tokens / tokens_per_row : ring_rows; }
};

struct StateSpec {
    std::vector<StateBufferSpec> buffers;
    size_t ring_bytes() const;                // per sequence, independent of its length
    double paged_bytes_per_token() const;     // growth of the paged buffers
};

// Memory for one sequence's state, one entry per StateSpec buffer (in order): a ring view [ring_rows,
// row_elems] f32 for ring buffers, paged blocks for paged ones (the other member left empty).
struct SequenceMemory {
    std::vector<TensorView> rings;
    std::vector<PagedRows> pages;
};

// Contiguous memory in `backend` for one sequence of up to max_tokens tokens (one block per paged buffer),
// owned by `storage`.
SequenceMemory allocate_sequence_memory(const StateSpec& spec, int64_t max_tokens, Backend& backend,
                                        std::vector<Tensor>* storage);
// Checks that `memory` has the buffers `spec` describes (throws Error naming the first mismatch).
void check_sequence_memory(const StateSpec& spec, const SequenceMemory& memory);
// Tokens the paged buffers can hold (no limit without paged buffers).
int64_t paged_capacity(const StateSpec& spec, const SequenceMemory& memory);
// Copies the state rows of a sequence of num_tokens tokens from src to dst (both laid out as `spec`, in
// `backend` memory): the rings whole, the paged buffers up to the rows those tokens fill.
void copy_sequence_memory(Backend& backend, const StateSpec& spec, const SequenceMemory& src, SequenceMemory& dst,
                          int64_t num_tokens);

// One sequence's model state (K/V rows, compressor inputs, compressed entries, ...).
class ModelSequence {
public:
    virtual ~ModelSequence() = default;
    virtual int64_t num_tokens() const = 0;
    // Tokens the sequence can hold with its current memory (a forward past it is an Error).
    virtual int64_t capacity() const = 0;
    // The memory the state lives in; a KV manager appends blocks to the paged buffers to grow capacity.
    virtual SequenceMemory& memory() = 0;
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
    // The buffers one sequence's state needs (for a KV manager to allocate).
    virtual const StateSpec& state_spec() const = 0;
    // A sequence over caller-owned memory (laid out as state_spec() says).
    virtual std::unique_ptr<ModelSequence> new_sequence(SequenceMemory memory) = 0;
    // A sequence that owns memory for up to max_tokens tokens.
    virtual std::unique_ptr<ModelSequence> new_sequence(int64_t max_tokens) = 0;
    // A sequence that owns memory for up to max_tokens tokens and starts with a copy of src's state (as if
    // fed src's tokens): n samples of one prompt, or a batch of equal contexts, share one prefill.
    virtual std::unique_ptr<ModelSequence> fork_sequence(ModelSequence& src, int64_t max_tokens) = 0;
    // Advances every sequence by its tokens and returns the requested logits, [rows, vocab] f32, in batch
    // order. Sequences must be distinct; bad token ids or capacity overflows throw Error before any state
    // is modified.
    virtual Tensor forward(std::span<const SequenceInput> batch) = 0;
    // The same step, with the logits left in the backend's memory (for selecting tokens on the device).
    virtual Tensor forward_on_backend(std::span<const SequenceInput> batch) = 0;
};

struct LoadOptions {
    // "auto": the checkpoint's weights. "random": random weights in the release formats, so that any
    // config runs without its checkpoint (the directory needs only config.json).
    std::string format = "auto";
    uint64_t seed = 0;  // of the random weights
};

// Opens a checkpoint directory (config.json + safetensors) with the architecture its model_type names.
std::unique_ptr<CausalLM> load_model(const std::string& dir, Backend& backend, const LoadOptions& options = {});
// The checkpoint `options` ask for: the directory's safetensors, or a synthetic one for random weights.
Checkpoint open_checkpoint(const std::string& dir, const LoadOptions& options);

}  // namespace deepinfer
