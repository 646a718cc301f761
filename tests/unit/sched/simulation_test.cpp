// Thousands of scheduler steps with no model: random arrivals, prompt and output lengths, end-of-sequence
// and aborts, planned by sched::schedule and carried out on a real kv::StateManager. Every step checks the
// plan (token budget, sequence limit, decodes first, first come first served, memory), and every scenario
// ends with every request finished and the block pool whole. The async mode learns sampled tokens one step
// late, as the engine's async scheduling does.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "kv/state_manager.h"
#include "sched/scheduler.h"

namespace deepinfer::sched {
namespace {

struct SimRequest {
    uint64_t id = 0;
    int64_t prompt = 0, max_out = 0;
    int64_t outputs = 0;  // known generated tokens
    int64_t computed = 0, pending = 0;
    bool running = false, finished = false, aborted = false;
    int64_t preemptions = 0;
    int64_t known() const { return prompt + outputs; }
    int64_t target() const { return std::min(known() + pending, prompt + max_out - 1); }
};

struct Scenario {
    const char* name;
    int64_t max_batch_tokens, max_seqs, chunk;
    int64_t pool_blocks;  // state memory, in blocks
    bool async;
    int64_t num_requests, max_prompt, max_out;
    double arrival_rate;  // requests per step
    double abort_rate;
    bool expect_preemption;
};

void PrintTo(const Scenario& s, std::ostream* os) { *os << s.name; }

class Simulation : public ::testing::TestWithParam<Scenario> {};

TEST_P(Simulation, RunsToCompletionWithoutLeaks) {
    const Scenario& sc = GetParam();
    // A model with rings and two paged buffers (ratios 4 and 32).
    const std::vector<kv::BufferDesc> buffers = {
        {"w", 16, 40, 0}, {"c", 32, 24, 0}, {"e4", 16, 0, 4}, {"e32", 16, 0, 32}};
    const kv::Layout layout = kv::make_layout(buffers);
    kv::StateManager kv(buffers, static_cast<size_t>(sc.pool_blocks) * layout.block_bytes);
    const MemoryModel mem{layout.ring_blocks, layout.block_tokens};
    SchedulerConfig cfg;
    cfg.max_batch_tokens = sc.max_batch_tokens;
    cfg.max_seqs = sc.max_seqs;
    cfg.max_prefill_chunk = sc.chunk;
    cfg.watermark_blocks = sc.pool_blocks / 100;
    const int64_t max_len = kv.max_tokens_per_sequence();

    std::mt19937_64 rng(std::hash<std::string>{}(sc.name));
    std::map<uint64_t, SimRequest> reqs;
    uint64_t next_id = 1;
    int64_t arrived = 0, steps = 0, preemptions = 0, finished = 0, generated = 0;
    std::vector<uint64_t> inflight_samples;  // async: samples of the previous step, learnt one step late

    auto release = [&](SimRequest& r) {
        if (kv.contains(r.id)) kv.release(r.id);
        r.running = false;
    };
    auto finish = [&](SimRequest& r) {
        release(r);
        r.finished = true;
        ++finished;
    };
    auto resolve = [&](const std::vector<uint64_t>& sampled) {
        for (uint64_t id : sampled) {
            SimRequest& r = reqs.at(id);
            --r.pending;
            if (r.finished) continue;
            ++r.outputs;
            ++generated;
            if (r.outputs >= r.max_out || rng() % 50 == 0) finish(r);  // length, or an EOS now and then
        }
    };

    while (arrived < sc.num_requests || finished < arrived) {
        ASSERT_LT(steps, 200000) << "no progress";
        ++steps;
        // Arrivals.
        std::poisson_distribution<int> arrivals(sc.arrival_rate);
        for (int a = arrivals(rng); a > 0 && arrived < sc.num_requests; --a, ++arrived) {
            SimRequest r;
            r.id = next_id++;
            r.prompt = 1 + static_cast<int64_t>(rng() % sc.max_prompt);
            r.max_out = 1 + static_cast<int64_t>(rng() % sc.max_out);
            r.prompt = std::min(r.prompt, max_len - 1);
            r.max_out = std::min(r.max_out, max_len - r.prompt);
            reqs[r.id] = r;
        }
        // Aborts.
        if (sc.abort_rate > 0 && std::uniform_real_distribution<>(0, 1)(rng) < sc.abort_rate) {
            std::vector<uint64_t> live;
            for (auto& [id, r] : reqs)
                if (!r.finished) live.push_back(id);
            if (!live.empty()) {
                SimRequest& r = reqs.at(live[rng() % live.size()]);
                r.aborted = true;
                finish(r);
            }
        }

        std::vector<SeqState> running, waiting;
        for (auto& [id, r] : reqs) {
            if (r.finished) continue;
            if (r.running) {
                ASSERT_EQ(kv.blocks_held(id), mem.blocks_for(r.computed)) << "request " << id;
                running.push_back({id, r.target(), r.computed, r.pending, kv.blocks_held(id)});
            } else {
                waiting.push_back({id, r.target(), 0, r.pending, 0});
            }
        }
        const StepPlan plan = schedule(cfg, mem, running, waiting, kv.num_free_blocks());

        // The plan obeys the limits and the order.
        ASSERT_LE(plan.num_tokens, cfg.max_batch_tokens);
        int phase = 0;  // 0 decodes, 1 running prefills, 2 admissions
        size_t admitted = 0;
        for (const ScheduledSeq& s : plan.scheduled) {
            const SimRequest& r = reqs.at(s.id);
            ASSERT_GE(s.num_new_tokens, 1);
            const int p = s.admitted ? 2 : (r.target() - r.computed == 1 ? 0 : 1);
            ASSERT_GE(p, phase) << "step " << steps << ": decodes, then prefills, then admissions";
            phase = p;
            if (s.admitted) {
                ASSERT_LT(admitted, waiting.size());
                ASSERT_EQ(s.id, waiting[admitted].id) << "admission out of arrival order";
                ++admitted;
            }
        }
        std::vector<uint64_t> preempted = plan.preempted;
        std::sort(preempted.begin(), preempted.end());
        if (!plan.preempted.empty()) {
            ASSERT_EQ(admitted, 0u);
        }
        for (const SeqState& r : running) {
            const bool skipped =
                std::none_of(plan.scheduled.begin(), plan.scheduled.end(), [&](auto& s) { return s.id == r.id; });
            const bool was_preempted = std::binary_search(preempted.begin(), preempted.end(), r.id);
            // A decode left out (budget spent) means nothing else was scheduled after it.
            if (r.num_tokens - r.num_computed == 1 && skipped && !was_preempted) {
                ASSERT_EQ(phase, 0);
            }
        }

        // Carry it out.
        for (uint64_t id : plan.preempted) {
            SimRequest& r = reqs.at(id);
            ASSERT_TRUE(r.running);
            release(r);
            r.computed = 0;
            ++r.preemptions;
            ++preemptions;
        }
        std::vector<uint64_t> sampled;
        int64_t running_now = 0;
        for (const ScheduledSeq& s : plan.scheduled) {
            SimRequest& r = reqs.at(s.id);
            const int64_t end = r.computed + s.num_new_tokens;
            ASSERT_LE(end, r.target());
            ASSERT_EQ(s.samples, end == r.target());
            if (s.admitted) {
                ASSERT_FALSE(r.running);
                ASSERT_TRUE(kv.allocate(r.id, end)) << "admitted beyond free memory";
                r.running = true;
            } else {
                ASSERT_TRUE(kv.grow(r.id, end)) << "grown beyond free memory";
            }
            ASSERT_EQ(kv.blocks_held(r.id), mem.blocks_for(end));
            ASSERT_GE(kv.token_capacity(r.id), end);
            r.computed = end;
            if (s.samples) {
                ++r.pending;
                sampled.push_back(r.id);
            }
        }
        for (auto& [id, r] : reqs) running_now += r.running;
        ASSERT_LE(running_now, cfg.max_seqs);

        // The step's tokens: known now (sync) or after the next step is planned (async).
        if (sc.async) {
            resolve(inflight_samples);
            inflight_samples = std::move(sampled);
        } else {
            resolve(sampled);
        }
    }
    resolve(inflight_samples);
    for (auto& [id, r] : reqs) {
        ASSERT_TRUE(r.finished);
        ASSERT_EQ(r.pending, 0);
        if (!r.aborted) {
            ASSERT_GE(r.outputs, 1);
        }
        ASSERT_LE(r.outputs, r.max_out);
    }
    EXPECT_TRUE(kv.whole()) << "blocks leaked";
    if (sc.expect_preemption) {
        EXPECT_GT(preemptions, 0);
    }
    std::printf("[ %s ] %lld requests in %lld steps, %lld tokens generated, %lld preemptions\n", sc.name,
                static_cast<long long>(arrived), static_cast<long long>(steps), static_cast<long long>(generated),
                static_cast<long long>(preemptions));
}

INSTANTIATE_TEST_SUITE_P(
    Scenarios, Simulation,
    ::testing::Values(
        // name, batch tokens, seqs, chunk, pool blocks, async, requests, max prompt, max out, arrivals, aborts
        Scenario{"ample_memory", 256, 32, 0, 4000, false, 2000, 300, 64, 2.0, 0.0, false},
        Scenario{"tight_memory", 256, 32, 0, 40, false, 2000, 300, 400, 2.0, 0.0, true},
        Scenario{"tight_memory_async", 256, 32, 0, 40, true, 2000, 300, 400, 2.0, 0.0, true},
        Scenario{"small_budget_chunks", 16, 8, 8, 300, false, 500, 120, 32, 0.5, 0.0, false},
        Scenario{"one_sequence", 64, 1, 0, 200, true, 300, 100, 16, 0.5, 0.0, false},
        Scenario{"aborts_and_preemption", 128, 64, 32, 30, true, 2000, 200, 300, 3.0, 0.2, true}),
    [](const ::testing::TestParamInfo<Scenario>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace deepinfer::sched
