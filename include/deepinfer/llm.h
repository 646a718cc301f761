// The offline inference API: an LLM opened from a checkpoint directory serves many requests at once with
// continuous batching.
//
//   deepinfer::LLM llm({.model = "DIR"});
//   auto outs = llm.generate({deepinfer::Prompt::text("Hello"), deepinfer::Prompt::ids({0, 5, 9})},
//                            deepinfer::SamplingParams{.temperature = 0.8f, .max_tokens = 64, .seq_seed = 7});
//
// A request that is bad (empty prompt, too long, invalid parameters, malformed so_args, ...) finishes alone
// with finish_reason "error" and a message in RequestOutput::error; the other requests run normally.
// Engine-level problems (a missing checkpoint, a bad option) throw deepinfer::Error. An LLM is driven by one
// thread at a time (it runs its own compute thread inside).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "deepinfer/error.h"
#include "deepinfer/outputs.h"
#include "deepinfer/sampling_params.h"

namespace deepinfer {

struct EngineOptions {
    std::string model;      // checkpoint directory; empty: $DEEPINFER_HF_MODEL_DIR, else the default model
    std::string tokenizer;  // tokenizer.json or a directory holding one; empty: the model directory's (if any)
    std::string device = "cpu";
    int num_threads = 0;                   // backend threads (0: all cores, or $DEEPINFER_NUM_THREADS)
    int64_t max_batch_tokens = 2048;       // tokens per step over all sequences
    int64_t max_seqs = 64;                 // sequences running at once
    int64_t max_prefill_chunk = 0;         // prompt tokens of one sequence per step (0: max_batch_tokens)
    size_t memory_budget = 0;              // bytes of state memory (0: $DEEPINFER_MEMORY_BUDGET, else 1 GiB)
    int64_t block_tokens = 0;              // tokens per state block (0: chosen from the model's layout)
    int64_t max_model_len = 0;             // context limit (0: the model's max positions)
    std::optional<bool> async_scheduling;  // default on; DEEPINFER_ASYNC_SCHEDULING=0 turns it off
    std::optional<bool> batch_invariant;   // default: DEEPINFER_BATCH_INVARIANT=1
    uint64_t seed = 0;                     // seeds the requests that have no seq_seed
    std::string load_format = "auto";  // "auto": the checkpoint's weights; "random": random weights (config.json only)
    bool debug_poison_state = false;   // fill new state blocks with NaN (tests: no read of unwritten state)
};

struct ChatOptions {
    std::string thinking_mode = "chat";           // "chat" or "thinking"
    std::optional<std::string> reasoning_effort;  // "max", "high" or none
    bool drop_thinking = true;                    // drop the reasoning of turns before the last user message
};

// One prompt: text, token ids, or a chat conversation (OpenAI-style messages, a JSON array) encoded with the
// model's chat format (DeepSeek-V4).
struct Prompt {
    enum class Kind { kText, kTokenIds, kMessages };
    Kind kind = Kind::kText;
    std::string text;                // kText; kMessages: the messages' JSON
    std::vector<int32_t> token_ids;  // kTokenIds
    ChatOptions chat;                // kMessages

    static Prompt from_text(std::string text) { return {Kind::kText, std::move(text), {}, {}}; }
    static Prompt from_ids(std::vector<int32_t> ids) { return {Kind::kTokenIds, {}, std::move(ids), {}}; }
    static Prompt from_messages(std::string messages_json, ChatOptions options = {}) {
        return {Kind::kMessages, std::move(messages_json), {}, std::move(options)};
    }
};

struct ModelSummary {
    std::string model_type;
    std::string dir;
    int64_t vocab_size = 0;
    int64_t max_model_len = 0;  // the context limit requests are checked against
    std::vector<int> eos_token_ids;
    bool has_tokenizer = false;
    size_t weight_bytes = 0;
    std::string description;
};

// The state memory: fixed-size blocks from a pool sized by the budget.
struct MemoryReport {
    size_t budget_bytes = 0;
    size_t block_bytes = 0;
    int64_t num_blocks = 0;
    int64_t block_tokens = 0;          // tokens per paged block
    int64_t fixed_blocks_per_seq = 0;  // blocks every sequence holds (its rings)
    size_t fixed_bytes_per_seq = 0;
    double bytes_per_token = 0;         // marginal state bytes per token (a paged block over its tokens)
    double model_bytes_per_token = 0;   // the model's own paged bytes per token (no block slack)
    size_t model_ring_bytes = 0;        // the model's ring bytes per sequence (no packing slack)
    int64_t max_tokens_one_seq = 0;     // tokens one sequence could hold with the whole pool
    int64_t max_concurrent_tokens = 0;  // tokens max_seqs sequences can hold together
    int64_t free_blocks = 0;
};

// Where the time went; all seconds. CPU work is scheduling, input preparation, detokenization, stop checks
// and output building; it is "overlapped" when the compute of a step was running meanwhile.
struct EngineStats {
    int64_t steps = 0;
    int64_t prompt_tokens = 0;  // prefill tokens computed (recomputation after preemption included)
    int64_t generated_tokens = 0;
    int64_t preemptions = 0;
    int64_t steps_prepared_ahead = 0;  // steps scheduled and prepared while the previous one computed (async)
    double compute_seconds = 0;        // forward + sampling
    double cpu_seconds = 0;            // engine CPU work in total
    double cpu_overlapped_seconds = 0;
    double wait_seconds = 0;  // the CPU side waiting for compute
    double wall_seconds = 0;  // inside step() calls
};

// Called after every step for each request that changed (delta_text / delta_token_ids hold the news).
using OutputCallback = std::function<void(const RequestOutput&)>;

namespace engine {
class EngineCore;
}

class LLM {
public:
    explicit LLM(EngineOptions options = {});
    explicit LLM(const std::string& model);
    ~LLM();
    LLM(LLM&&) noexcept;
    LLM& operator=(LLM&&) noexcept;

    // Runs every prompt to completion; outputs in prompt order. One SamplingParams for all, or one per prompt.
    std::vector<RequestOutput> generate(const std::vector<Prompt>& prompts, const SamplingParams& params = {},
                                        const OutputCallback& on_output = {});
    std::vector<RequestOutput> generate(const std::vector<Prompt>& prompts, const std::vector<SamplingParams>& params,
                                        const OutputCallback& on_output = {});
    // Chat conversations (each a JSON array of messages), encoded with the model's chat format.
    std::vector<RequestOutput> chat(const std::vector<std::string>& conversations, const SamplingParams& params = {},
                                    const ChatOptions& options = {}, const OutputCallback& on_output = {});

    // The step-driven form a server uses: add requests, call step() while has_unfinished_requests(); each
    // step returns the requests it changed. add_request never throws for a bad request: it finishes with
    // an error at the next step.
    uint64_t add_request(Prompt prompt, SamplingParams params);
    bool abort_request(uint64_t request_id);  // false when unknown or already finished
    std::vector<RequestOutput> step();
    bool has_unfinished_requests() const;

    const ModelSummary& model_info() const;
    MemoryReport memory_report() const;
    EngineStats stats() const;
    void reset_stats();
    bool async_scheduling() const;

    // The tokenizer and chat format (throw Error when the model has no tokenizer).
    std::vector<int32_t> encode(const std::string& text, bool add_special_tokens = false) const;
    std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;
    std::string apply_chat_template(const std::string& messages_json, const ChatOptions& options = {}) const;

private:
    std::unique_ptr<engine::EngineCore> core_;
};

// The checkpoint directory LLM uses for EngineOptions::model (the flag, else $DEEPINFER_HF_MODEL_DIR, else the
// default model built into DeepInfer), and the tokenizer that goes with the default model.
std::string find_model_dir(const std::string& model);
std::string default_model_dir();  // empty when this build has none

// "1073741824", "512MiB", "4GiB", "64M", "2G" (binary units) -> bytes. Throws Error on anything else.
size_t parse_byte_size(const std::string& text);

}  // namespace deepinfer
