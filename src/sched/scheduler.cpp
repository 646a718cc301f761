#include "sched/scheduler.h"

#include <algorithm>

#include "deepinfer/error.h"

namespace deepinfer::sched {

void SchedulerConfig::validate() const {
    DI_CHECK(max_batch_tokens > 0, "max_batch_tokens must be > 0, got ", max_batch_tokens);
    DI_CHECK(max_seqs > 0, "max_seqs must be > 0, got ", max_seqs);
    DI_CHECK(max_prefill_chunk >= 0, "max_prefill_chunk must be >= 0 (0: max_batch_tokens), got ", max_prefill_chunk);
    DI_CHECK(watermark_blocks >= 0, "watermark_blocks must be >= 0, got ", watermark_blocks);
}

int64_t MemoryModel::blocks_for(int64_t tokens) const {
    if (tokens_per_block == 0) return fixed_blocks;
    return fixed_blocks + (std::max<int64_t>(tokens, 0) + tokens_per_block - 1) / tokens_per_block;
}

namespace {

bool sorted_by_id(std::span<const SeqState> v) {
    for (size_t i = 1; i < v.size(); ++i)
        if (v[i - 1].id >= v[i].id) return false;
    return true;
}

}  // namespace

StepPlan schedule(const SchedulerConfig& config, const MemoryModel& memory, std::span<const SeqState> running,
                  std::span<const SeqState> waiting, int64_t free_blocks) {
    DI_ICHECK(sorted_by_id(running) && sorted_by_id(waiting), "scheduler lists must be sorted by id");
    const int64_t chunk_limit = config.max_prefill_chunk > 0 ? config.max_prefill_chunk : config.max_batch_tokens;
    int64_t budget = config.max_batch_tokens, free = free_blocks;

    // Per running request: its entry in `plan` (or -1) and whether it was preempted.
    const size_t n = running.size();
    std::vector<ScheduledSeq> picked(n);
    std::vector<bool> is_picked(n, false), preempted(n, false);
    std::vector<uint64_t> preempted_ids;

    auto unpick = [&](size_t i) {
        if (!is_picked[i]) return;
        budget += picked[i].num_new_tokens;
        free += picked[i].new_blocks;
        is_picked[i] = false;
    };
    // Schedules running[i] for up to `want` tokens, preempting later arrivals when memory is short.
    auto try_run = [&](size_t i, int64_t want) {
        const SeqState& r = running[i];
        const int64_t tokens = std::min({want, budget, chunk_limit});
        if (tokens <= 0) return;
        const int64_t need = std::max<int64_t>(0, memory.blocks_for(r.num_computed + tokens) - r.blocks_held);
        while (need > free) {
            size_t victim = n;
            for (size_t j = n; j-- > i + 1;)
                if (!preempted[j]) {
                    victim = j;
                    break;
                }
            if (victim == n) victim = i;  // nobody arrived later: this request gives way itself
            unpick(victim);
            preempted[victim] = true;
            preempted_ids.push_back(running[victim].id);
            free += running[victim].blocks_held;
            if (victim == i) return;
        }
        free -= need;
        budget -= tokens;
        picked[i] = {r.id, tokens, need, false, r.num_computed + tokens == r.num_tokens};
        is_picked[i] = true;
    };

    // Decodes first, then chunks of prompts (or recomputations) already running.
    for (int pass = 0; pass < 2; ++pass) {
        for (size_t i = 0; i < n; ++i) {
            if (preempted[i]) continue;
            const int64_t want = running[i].num_tokens - running[i].num_computed;
            if (want <= 0 || (pass == 0) != (want == 1)) continue;
            try_run(i, want);
        }
    }

    StepPlan plan;
    for (int pass = 0; pass < 2; ++pass)
        for (size_t i = 0; i < n; ++i) {
            if (!is_picked[i]) continue;
            const bool decode = running[i].num_tokens - running[i].num_computed == 1;
            if ((pass == 0) == decode) plan.scheduled.push_back(picked[i]);
        }

    // Admissions, first come first served: stop at the first request that does not fit, and admit nothing in a
    // step that had to preempt (memory is short).
    int64_t seqs = static_cast<int64_t>(std::count(preempted.begin(), preempted.end(), false));
    if (preempted_ids.empty()) {
        for (const SeqState& w : waiting) {
            if (seqs >= config.max_seqs || budget <= 0 || w.num_pending > 0) break;
            const int64_t want = w.num_tokens - w.num_computed;
            if (want <= 0) break;
            const int64_t tokens = std::min({want, budget, chunk_limit});
            const int64_t need = std::max<int64_t>(0, memory.blocks_for(w.num_computed + tokens) - w.blocks_held);
            // The watermark keeps room for running decodes to grow; with nothing running it is not needed.
            if (need + (seqs > 0 ? config.watermark_blocks : 0) > free) break;
            free -= need;
            budget -= tokens;
            ++seqs;
            plan.scheduled.push_back({w.id, tokens, need, true, w.num_computed + tokens == w.num_tokens});
        }
    }
    plan.preempted = std::move(preempted_ids);
    for (const ScheduledSeq& s : plan.scheduled) {
        plan.num_tokens += s.num_new_tokens;
        plan.new_blocks += s.new_blocks;
    }
    return plan;
}

}  // namespace deepinfer::sched
