// Continuous-batching scheduler: pure functions from request snapshots to a step plan (no model, no memory).
//
// Each step has a token budget. Running requests go first in arrival order, decodes (one token) before
// prefill chunks, then waiting requests are admitted first come, first served while the budget, the sequence
// limit and free memory last; a long prompt is prefilled in chunks over several steps. Memory is planned with
// the KV manager's block formula; when a running request cannot grow, the latest-arrived running request is
// preempted (its state is dropped and recomputed later from its tokens), possibly the request itself.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace deepinfer::sched {

struct SchedulerConfig {
    int64_t max_batch_tokens = 2048;  // tokens per step, over all sequences
    int64_t max_seqs = 64;            // sequences holding state at once
    int64_t max_prefill_chunk = 0;    // prompt tokens of one sequence per step (0: max_batch_tokens)
    int64_t watermark_blocks = 0;     // free blocks an admission must leave, so decodes can grow a while
    // Throws deepinfer::Error naming a bad field.
    void validate() const;
};

// The KV manager's block formula (kv::Layout::blocks_for): fixed blocks per sequence plus one per
// tokens_per_block tokens.
struct MemoryModel {
    int64_t fixed_blocks = 0;
    int64_t tokens_per_block = 0;  // 0: the state does not grow with length
    int64_t blocks_for(int64_t tokens) const;
};

// A request as the scheduler sees it. Both lists are ordered by id: arrival order, earlier = higher priority.
struct SeqState {
    uint64_t id = 0;
    int64_t num_tokens = 0;    // tokens the state must reach: known tokens plus pending samples, minus a final
                               // token nobody needs to feed (the engine leaves it out when the request will end)
    int64_t num_computed = 0;  // tokens in the state, or in a step still running
    int64_t num_pending = 0;   // samples of a running step not known yet (async); such a waiting request waits
    int64_t blocks_held = 0;
};

struct ScheduledSeq {
    uint64_t id = 0;
    int64_t num_new_tokens = 0;  // tokens [num_computed, num_computed + num_new_tokens) run this step
    int64_t new_blocks = 0;      // blocks to add before the step
    bool admitted = false;       // a waiting request that (re)starts: allocate its state
    bool samples = false;        // the step reaches num_tokens, so its last row yields a token
};

struct StepPlan {
    std::vector<ScheduledSeq> scheduled;  // running decodes, running prefills, admissions (arrival order in each)
    std::vector<uint64_t> preempted;      // running requests to free now and recompute later
    int64_t num_tokens = 0;
    int64_t new_blocks = 0;
    bool empty() const { return scheduled.empty(); }
};

// running, waiting: sorted by id. free_blocks: blocks the KV pool can hand out now.
StepPlan schedule(const SchedulerConfig& config, const MemoryModel& memory, std::span<const SeqState> running,
                  std::span<const SeqState> waiting, int64_t free_blocks);

}  // namespace deepinfer::sched
