// Per-step CPU work of the engine, measured alone: how long scheduling, KV block bookkeeping and token
// selection take for realistic sizes (DeepSeek-V4's 129280-token vocabulary). With async scheduling this
// work overlaps the device's compute; these numbers say how much there is to hide.
//   build/bin/engine_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <random>

#include "kv/state_manager.h"
#include "sample/logits_processors.h"
#include "sample/sampler.h"
#include "sample/stop_strings.h"
#include "sched/scheduler.h"

namespace deepinfer {
namespace {

constexpr int64_t kVocab = 129280;

std::vector<float> random_logits(uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> n(0.0f, 3.0f);
    std::vector<float> l(kVocab);
    for (float& x : l) x = n(rng);
    return l;
}

// One step's plan for `running` decoding sequences and 64 waiting prompts.
void BM_Schedule(benchmark::State& state) {
    const auto n = state.range(0);
    const sched::MemoryModel mem{8, 128};
    std::vector<sched::SeqState> running, waiting;
    for (int64_t i = 0; i < n; ++i)
        running.push_back({static_cast<uint64_t>(i), 1001 + i, 1000 + i, 0, mem.blocks_for(1000 + i)});
    for (int64_t i = 0; i < 64; ++i) waiting.push_back({static_cast<uint64_t>(n + i), 2000, 0, 0, 0});
    sched::SchedulerConfig cfg;
    cfg.max_batch_tokens = 8192;
    cfg.max_seqs = n + 8;
    for (auto _ : state) benchmark::DoNotOptimize(sched::schedule(cfg, mem, running, waiting, 1 << 20));
    state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_Schedule)->Arg(16)->Arg(256)->Arg(1024);

// Allocating a sequence with 4096 tokens of state and releasing it (V4-Flash-like layout: 43 windows, 21 CSA
// layers with compressor and indexer rings and paged rows, 20 HCA layers).
void BM_KvAllocateRelease(benchmark::State& state) {
    std::vector<kv::BufferDesc> b;
    for (int l = 0; l < 43; ++l) {
        b.push_back({"w", 512, 136, 0});
        if (l < 2 || l == 42) continue;
        const int64_t m = l % 2 ? 128 : 4;
        b.push_back({"ci", 2 * 512 * (m == 4 ? 2 : 1), (m == 4 ? 2 : 1) * m + 8, 0});
        b.push_back({"c", 512, 0, m});
        if (m == 4) b.push_back({"ii", 4 * 128, 16, 0}), b.push_back({"ik", 128, 0, 4});
    }
    kv::StateManager m(b, size_t{2} << 30);
    uint64_t id = 0;
    for (auto _ : state) {
        m.allocate(id, 4096);
        m.release(id++);
    }
}
BENCHMARK(BM_KvAllocateRelease);

void BM_SampleGreedy(benchmark::State& state) {
    const std::vector<float> l = random_logits(1);
    for (auto _ : state) benchmark::DoNotOptimize(argmax(l));
}
BENCHMARK(BM_SampleGreedy);

void BM_SampleTemperature(benchmark::State& state) {
    const std::vector<float> l = random_logits(2);
    SamplingOptions o;
    o.temperature = 0.8f;
    o.top_p = state.range(0) / 100.0f;
    o.top_k = static_cast<int>(state.range(1));
    uint64_t i = 0;
    for (auto _ : state) benchmark::DoNotOptimize(sample_token(l, o, i++));
}
BENCHMARK(BM_SampleTemperature)->Args({100, 0})->Args({95, 0})->Args({100, 50})->Args({90, 50});

void BM_PenaltiesAndLogprobs(benchmark::State& state) {
    std::vector<float> l = random_logits(3);
    TokenHistory h;
    std::vector<int32_t> prompt(2000);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 7919) % kVocab);
    h.set_prompt(prompt);
    for (int i = 0; i < 500; ++i) h.add_output((i * 104729) % kVocab);
    const PenaltyParams p{1.1f, 0.5f, 0.2f};
    for (auto _ : state) {
        apply_penalties(l, p, h);
        benchmark::DoNotOptimize(compute_logprobs(l, 5, 5));
    }
}
BENCHMARK(BM_PenaltiesAndLogprobs);

void BM_StopStrings(benchmark::State& state) {
    std::string text(4000, 'a');
    const std::vector<std::string> stops = {"</answer>", "\n\nUser:", "STOP"};
    for (auto _ : state) benchmark::DoNotOptimize(find_stop_string(text, text.size() - 8, stops));
}
BENCHMARK(BM_StopStrings);

}  // namespace
}  // namespace deepinfer

BENCHMARK_MAIN();
