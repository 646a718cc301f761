// deepinfer bench: offline throughput. N requests of random token ids with given input/output lengths, all
// submitted at once; prints requests/s, tokens/s, TTFT / TPOT / latency percentiles, the engine's CPU-work
// overlap and the state memory figures, optionally as JSON.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cxxopts.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "cli_common.h"
#include "commands.h"
#include "deepinfer/llm.h"

namespace deepinfer::cli {

namespace {

struct Summary {
    double mean = 0, p50 = 0, p90 = 0, p99 = 0;
};

Summary summarize(std::vector<double> v) {
    Summary s;
    if (v.empty()) return s;
    std::sort(v.begin(), v.end());
    for (double x : v) s.mean += x / static_cast<double>(v.size());
    auto pct = [&](double q) {
        return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
    };
    s.p50 = pct(0.5);
    s.p90 = pct(0.9);
    s.p99 = pct(0.99);
    return s;
}

nlohmann::json to_json(const Summary& s) { return {{"mean", s.mean}, {"p50", s.p50}, {"p90", s.p90}, {"p99", s.p99}}; }

void progress(size_t done, size_t total, int64_t tokens, double elapsed) {
    const int width = 30, filled = total ? static_cast<int>(width * done / total) : width;
    std::fprintf(stderr, "\r[%s%s] %zu/%zu requests, %lld tokens, %.1f s", std::string(filled, '=').c_str(),
                 std::string(width - filled, ' ').c_str(), done, total, static_cast<long long>(tokens), elapsed);
    std::fflush(stderr);
}

}  // namespace

int cmd_bench(int argc, char** argv) {
    cxxopts::Options opts("deepinfer bench", "Offline throughput: N random-token requests submitted at once.");
    opts.add_options()("num-prompts", "requests", cxxopts::value<int64_t>()->default_value("64"))(
        "input-len", "prompt tokens per request", cxxopts::value<int64_t>()->default_value("128"))(
        "output-len", "generated tokens per request (EOS ignored)", cxxopts::value<int64_t>()->default_value("64"))(
        "range-ratio", "lengths drawn uniformly from [len * (1 - r), len * (1 + r)]",
        cxxopts::value<double>()->default_value("0"))("temperature", "0: greedy",
                                                      cxxopts::value<float>()->default_value("0"))(
        "seed", "seed of the prompts and of sampling", cxxopts::value<uint64_t>()->default_value("0"))(
        "json", "also write the results as JSON to this file", cxxopts::value<std::string>())(
        "no-progress", "no progress bar (it shows only on a terminal anyway)")("h,help", "show help");
    add_engine_options(opts);
    auto args = opts.parse(argc, argv);
    if (args.count("help")) {
        std::printf("%s\n", opts.help({"", "Engine"}).c_str());
        return 0;
    }
    const int64_t n = args["num-prompts"].as<int64_t>(), in_len = args["input-len"].as<int64_t>(),
                  out_len = args["output-len"].as<int64_t>();
    const double ratio = args["range-ratio"].as<double>();
    DI_CHECK(n >= 1 && in_len >= 1 && out_len >= 1, "--num-prompts, --input-len and --output-len must be >= 1");
    DI_CHECK(ratio >= 0 && ratio < 1, "--range-ratio must be in [0, 1)");
    const uint64_t seed = args["seed"].as<uint64_t>();
    EngineOptions eo = engine_options(args);
    eo.seed = seed;
    LLM llm(eo);
    const ModelSummary& info = llm.model_info();
    DI_CHECK(
        static_cast<int64_t>(in_len * (1 + ratio)) + static_cast<int64_t>(out_len * (1 + ratio)) <= info.max_model_len,
        "--input-len + --output-len exceed the context limit of ", info.max_model_len, " tokens");

    // Random prompts over the vocabulary (ids 3.. skip the usual BOS/EOS/pad ids of DeepSeek tokenizers).
    std::mt19937_64 rng(seed);
    const int32_t lo = info.vocab_size > 16 ? 3 : 0;
    std::uniform_int_distribution<int32_t> token(lo, static_cast<int32_t>(info.vocab_size - 1));
    auto length = [&](int64_t len) {
        const int64_t a = std::max<int64_t>(1, static_cast<int64_t>(len * (1 - ratio)));
        const int64_t b = std::max<int64_t>(a, static_cast<int64_t>(len * (1 + ratio)));
        return std::uniform_int_distribution<int64_t>(a, b)(rng);
    };
    std::vector<Prompt> prompts;
    std::vector<SamplingParams> params;
    int64_t total_in = 0;
    for (int64_t i = 0; i < n; ++i) {
        std::vector<int32_t> ids(length(in_len));
        for (int32_t& t : ids) t = token(rng);
        total_in += static_cast<int64_t>(ids.size());
        prompts.push_back(Prompt::from_ids(std::move(ids)));
        SamplingParams p;
        p.temperature = args["temperature"].as<float>();
        p.max_tokens = length(out_len);
        p.ignore_eos = true;
        p.seq_seed = seed + static_cast<uint64_t>(i);
        params.push_back(p);
    }

    // Warm up (page in the weights), then measure.
    SamplingParams warm;
    warm.max_tokens = 4;
    llm.generate({Prompt::from_ids({static_cast<int32_t>(lo), static_cast<int32_t>(lo + 1)})}, warm);
    llm.reset_stats();
    const bool show = isatty(STDERR_FILENO) && !args.count("no-progress");
    std::vector<RequestOutput> outs(n);
    size_t done = 0;
    int64_t generated = 0;
    double last_draw = 0;
    const double t0 = now_seconds();
    for (int64_t i = 0; i < n; ++i) llm.add_request(prompts[i], params[i]);
    while (llm.has_unfinished_requests()) {
        for (RequestOutput& o : llm.step()) {
            generated += static_cast<int64_t>(o.outputs[0].delta_token_ids.size());
            if (!o.finished) continue;
            DI_CHECK(o.error.empty(), "request ", o.request_id, " failed: ", o.error);
            outs[done++] = std::move(o);
        }
        if (show && now_seconds() - last_draw > 0.1) {
            last_draw = now_seconds();
            progress(done, static_cast<size_t>(n), generated, last_draw - t0);
        }
    }
    const double elapsed = now_seconds() - t0;
    if (show) {
        progress(done, static_cast<size_t>(n), generated, elapsed);
        std::fprintf(stderr, "\n");
    }

    std::vector<double> ttft, tpot, latency;
    int64_t total_out = 0;
    for (const RequestOutput& o : outs) {
        const RequestMetrics& m = o.metrics;
        total_out += static_cast<int64_t>(o.outputs[0].token_ids.size());
        ttft.push_back(1e3 * m.time_to_first_token());
        if (m.num_generated_tokens > 1) tpot.push_back(1e3 * m.time_per_output_token());
        latency.push_back(1e3 * (m.finished_time - m.arrival_time));
    }
    const Summary s_ttft = summarize(ttft), s_tpot = summarize(tpot), s_lat = summarize(latency);
    const EngineStats st = llm.stats();
    const MemoryReport mem = llm.memory_report();
    const double overlap = st.cpu_seconds > 0 ? st.cpu_overlapped_seconds / st.cpu_seconds : 0;

    std::printf("deepinfer bench: %s (%s, vocab %lld)\n", info.dir.c_str(), info.model_type.c_str(),
                static_cast<long long>(info.vocab_size));
    std::printf(
        "  %lld requests, input %lld tokens, output %lld tokens (range ratio %.2f); %s, %d threads; async "
        "scheduling %s; max batch tokens %lld, max seqs %lld\n",
        static_cast<long long>(n), static_cast<long long>(in_len), static_cast<long long>(out_len), ratio,
        eo.device.c_str(), eo.num_threads, llm.async_scheduling() ? "on" : "off",
        static_cast<long long>(eo.max_batch_tokens), static_cast<long long>(eo.max_seqs));
    std::printf("  %-28s %12s\n", "metric", "value");
    std::printf("  %-28s %12.3f\n", "duration (s)", elapsed);
    std::printf("  %-28s %12.2f\n", "requests/s", n / elapsed);
    std::printf("  %-28s %12.1f\n", "input tokens/s", total_in / elapsed);
    std::printf("  %-28s %12.1f\n", "output tokens/s", total_out / elapsed);
    std::printf("  %-28s %12.1f\n", "total tokens/s", (total_in + total_out) / elapsed);
    std::printf("  %-28s %12s %10s %10s %10s\n", "latency (ms)", "mean", "p50", "p90", "p99");
    auto row = [](const char* name, const Summary& s) {
        std::printf("  %-28s %12.2f %10.2f %10.2f %10.2f\n", name, s.mean, s.p50, s.p90, s.p99);
    };
    row("TTFT", s_ttft);
    row("TPOT", s_tpot);
    row("end to end", s_lat);
    std::printf("  %-28s %12lld\n", "engine steps", static_cast<long long>(st.steps));
    std::printf("  %-28s %12lld\n", "steps prepared ahead", static_cast<long long>(st.steps_prepared_ahead));
    std::printf("  %-28s %12lld\n", "preemptions", static_cast<long long>(st.preemptions));
    std::printf("  %-28s %12.3f\n", "compute (s)", st.compute_seconds);
    std::printf("  %-28s %12.4f\n", "engine CPU work (s)", st.cpu_seconds);
    std::printf("  %-28s %11.1f%%\n", "CPU work overlapped", 100 * overlap);
    std::printf("  %-28s %12.1f\n", "state bytes/token", mem.bytes_per_token);
    std::printf("  %-28s %12zu\n", "state bytes/sequence fixed", mem.fixed_bytes_per_seq);
    std::printf("  %-28s %12lld\n", "max concurrent tokens", static_cast<long long>(mem.max_concurrent_tokens));

    if (args.count("json")) {
        nlohmann::json j = {
            {"model", info.dir},
            {"device", eo.device},
            {"threads", eo.num_threads},
            {"async_scheduling", llm.async_scheduling()},
            {"num_prompts", n},
            {"input_len", in_len},
            {"output_len", out_len},
            {"range_ratio", ratio},
            {"max_batch_tokens", eo.max_batch_tokens},
            {"max_seqs", eo.max_seqs},
            {"duration_s", elapsed},
            {"requests_per_s", n / elapsed},
            {"input_tokens_per_s", total_in / elapsed},
            {"output_tokens_per_s", total_out / elapsed},
            {"total_tokens_per_s", (total_in + total_out) / elapsed},
            {"ttft_ms", to_json(s_ttft)},
            {"tpot_ms", to_json(s_tpot)},
            {"latency_ms", to_json(s_lat)},
            {"steps", st.steps},
            {"preemptions", st.preemptions},
            {"steps_prepared_ahead", st.steps_prepared_ahead},
            {"compute_s", st.compute_seconds},
            {"cpu_work_s", st.cpu_seconds},
            {"cpu_overlapped_s", st.cpu_overlapped_seconds},
            {"wait_s", st.wait_seconds},
            {"state_bytes_per_token", mem.bytes_per_token},
            {"state_fixed_bytes_per_seq", mem.fixed_bytes_per_seq},
            {"state_budget_bytes", mem.budget_bytes},
            {"max_concurrent_tokens", mem.max_concurrent_tokens},
        };
        std::ofstream f(args["json"].as<std::string>());
        DI_CHECK(f, "cannot write ", args["json"].as<std::string>());
        f << j.dump(2) << "\n";
    }
    return 0;
}

}  // namespace deepinfer::cli
