// deepinfer generate: one prompt (text, token ids or chat messages) through the engine, streaming the output.
// Also the engine and sampling flags shared with chat and bench.
#include <cstdio>
#include <cxxopts.hpp>
#include <random>

#include "cli_common.h"
#include "commands.h"
#include "core/file.h"
#include "core/npy.h"
#include "deepinfer/llm.h"

namespace deepinfer::cli {

void add_engine_options(cxxopts::Options& opts) {
    opts.add_options("Engine")(
        "model", "checkpoint directory (default: $DEEPINFER_HF_MODEL_DIR, else the built-in default model)",
        cxxopts::value<std::string>()->default_value(""))(
        "tokenizer", "tokenizer.json or its directory (default: the model directory's)",
        cxxopts::value<std::string>()->default_value(""))("device", "cpu or cuda",
                                                          cxxopts::value<std::string>()->default_value("cpu"))(
        "load-format", "auto: the checkpoint's weights; random: random weights (the directory needs only config.json)",
        cxxopts::value<std::string>()->default_value("auto"))("threads", "CPU threads (0: all cores)",
                                                              cxxopts::value<int>()->default_value("0"))(
        "max-batch-tokens", "tokens per engine step", cxxopts::value<int64_t>()->default_value("2048"))(
        "max-seqs", "sequences running at once", cxxopts::value<int64_t>()->default_value("64"))(
        "prefill-chunk", "prompt tokens of one sequence per step (0: --max-batch-tokens)",
        cxxopts::value<int64_t>()->default_value("0"))(
        "memory-budget", "state memory, e.g. 512MiB or 4GiB (default: $DEEPINFER_MEMORY_BUDGET, else 1GiB)",
        cxxopts::value<std::string>()->default_value(""))("max-model-len", "context limit in tokens (0: the model's)",
                                                          cxxopts::value<int64_t>()->default_value("0"))(
        "async-scheduling", "on or off (default: on, unless DEEPINFER_ASYNC_SCHEDULING=0)",
        cxxopts::value<std::string>()->default_value(""));
}

EngineOptions engine_options(const cxxopts::ParseResult& args) {
    EngineOptions o;
    o.model = args["model"].as<std::string>();
    o.tokenizer = args["tokenizer"].as<std::string>();
    o.device = args["device"].as<std::string>();
    o.load_format = args["load-format"].as<std::string>();
    DI_CHECK(o.load_format == "auto" || o.load_format == "random", "--load-format must be auto or random, got ",
             o.load_format);
    o.num_threads = args["threads"].as<int>();
    o.max_batch_tokens = args["max-batch-tokens"].as<int64_t>();
    o.max_seqs = args["max-seqs"].as<int64_t>();
    o.max_prefill_chunk = args["prefill-chunk"].as<int64_t>();
    DI_CHECK(o.max_prefill_chunk >= 0, "--prefill-chunk must be >= 0");
    if (const std::string b = args["memory-budget"].as<std::string>(); !b.empty()) o.memory_budget = parse_byte_size(b);
    o.max_model_len = args["max-model-len"].as<int64_t>();
    if (const std::string a = args["async-scheduling"].as<std::string>(); !a.empty()) {
        DI_CHECK(a == "on" || a == "off", "--async-scheduling must be on or off, got ", a);
        o.async_scheduling = a == "on";
    }
    return o;
}

void add_sampling_options(cxxopts::Options& opts, const std::string& max_tokens, const std::string& temperature) {
    opts.add_options("Sampling")("max-tokens", "tokens to generate",
                                 cxxopts::value<int64_t>()->default_value(max_tokens))(
        "temperature", "0 is greedy (exact argmax)", cxxopts::value<float>()->default_value(temperature))(
        "top-p", "nucleus sampling mass", cxxopts::value<float>()->default_value("1"))(
        "top-k", "sample among the k most likely tokens (0: all)", cxxopts::value<int>()->default_value("0"))(
        "min-p", "drop tokens below min-p times the top probability", cxxopts::value<float>()->default_value("0"))(
        "repetition-penalty", "penalise tokens of the prompt and output (1: off)",
        cxxopts::value<float>()->default_value("1"))("presence-penalty", "penalise tokens already generated",
                                                     cxxopts::value<float>()->default_value("0"))(
        "frequency-penalty", "penalise tokens by how often they were generated",
        cxxopts::value<float>()->default_value("0"))("min-tokens", "generate at least this many tokens",
                                                     cxxopts::value<int64_t>()->default_value("0"))(
        "stop", "stop string (repeatable)", cxxopts::value<std::vector<std::string>>())(
        "stop-token-id", "stop token id (repeatable)", cxxopts::value<std::vector<int32_t>>())(
        "seed", "sampling seed (the request's seq_seed)", cxxopts::value<uint64_t>())(
        "ignore-eos", "do not stop at the model's end-of-sequence token")(
        "so-args", "structured output, JSON: {\"type\": \"regex\", \"value\": \"[0-9]+\"}",
        cxxopts::value<std::string>()->default_value(""));
}

SamplingParams sampling_params(const cxxopts::ParseResult& args) {
    SamplingParams p;
    p.max_tokens = args["max-tokens"].as<int64_t>();
    p.temperature = args["temperature"].as<float>();
    p.top_p = args["top-p"].as<float>();
    p.top_k = args["top-k"].as<int>();
    p.min_p = args["min-p"].as<float>();
    p.repetition_penalty = args["repetition-penalty"].as<float>();
    p.presence_penalty = args["presence-penalty"].as<float>();
    p.frequency_penalty = args["frequency-penalty"].as<float>();
    p.min_tokens = args["min-tokens"].as<int64_t>();
    if (args.count("stop")) p.stop = args["stop"].as<std::vector<std::string>>();
    if (args.count("stop-token-id")) p.stop_token_ids = args["stop-token-id"].as<std::vector<int32_t>>();
    if (args.count("seed")) p.seq_seed = args["seed"].as<uint64_t>();
    p.ignore_eos = args.count("ignore-eos") > 0;
    p.so_args = args["so-args"].as<std::string>();
    p.validate();
    return p;
}

int cmd_generate(int argc, char** argv) {
    cxxopts::Options opts("deepinfer generate", "Generate a continuation of a prompt, streaming it.");
    opts.add_options()("prompt", "prompt text (needs the model's tokenizer)", cxxopts::value<std::string>())(
        "ids-npy", "prompt token ids (.npy, 1-D integers)", cxxopts::value<std::string>())(
        "chat", "chat messages (JSON array of OpenAI-style messages)", cxxopts::value<std::string>())(
        "thinking-mode", "chat or thinking (with --chat)", cxxopts::value<std::string>()->default_value("chat"))(
        "logprobs", "print the top-n log-probabilities of each token (stderr)", cxxopts::value<int>())(
        "out", "write the generated ids (int32 .npy)", cxxopts::value<std::string>())(
        "quiet", "do not stream the output, print only the summary")("h,help", "show help");
    add_sampling_options(opts, "128", "0");
    add_engine_options(opts);
    auto args = opts.parse(argc, argv);
    if (args.count("help")) {
        std::printf("%s\n", opts.help({"", "Sampling", "Engine"}).c_str());
        return 0;
    }
    const int inputs = static_cast<int>(args.count("prompt") + args.count("ids-npy") + args.count("chat"));
    DI_CHECK(inputs == 1, "give exactly one of --prompt, --ids-npy or --chat");
    SamplingParams params = sampling_params(args);
    if (args.count("logprobs")) params.logprobs = args["logprobs"].as<int>();
    params.validate();
    EngineOptions eo = engine_options(args);
    eo.max_seqs = std::max<int64_t>(eo.max_seqs, 1);
    if (!params.seq_seed) eo.seed = std::random_device{}();  // unseeded sampling differs from run to run
    Prompt prompt;
    if (args.count("prompt")) {
        prompt = Prompt::from_text(args["prompt"].as<std::string>());
    } else if (args.count("ids-npy")) {
        prompt = Prompt::from_ids(read_ids_npy(args["ids-npy"].as<std::string>()));
    } else {
        ChatOptions chat;
        chat.thinking_mode = args["thinking-mode"].as<std::string>();
        prompt = Prompt::from_messages(read_file(args["chat"].as<std::string>()), chat);
    }
    LLM llm(eo);
    const bool text = llm.model_info().has_tokenizer, quiet = args.count("quiet") > 0;
    bool first = true;
    const RequestOutput out = llm.generate({prompt}, params, [&](const RequestOutput& o) {
        if (quiet) return;
        const CompletionOutput& c = o.outputs[0];
        if (text) {
            std::fwrite(c.delta_text.data(), 1, c.delta_text.size(), stdout);
        } else {
            for (int32_t t : c.delta_token_ids) {
                std::printf("%s%d", first ? "" : " ", t);
                first = false;
            }
        }
        std::fflush(stdout);
    })[0];
    DI_CHECK(out.error.empty(), out.error);
    const CompletionOutput& c = out.outputs[0];
    if (!quiet) std::printf("\n");
    std::fflush(stdout);  // before the summary on stderr
    if (params.logprobs) {
        for (size_t i = 0; i < c.logprobs.size(); ++i) {
            std::fprintf(stderr, "logprobs[%zu]: %d %.4f (rank %d):", i, c.logprobs[i].token_id, c.logprobs[i].logprob,
                         c.logprobs[i].rank);
            for (const auto& [t, lp] : c.logprobs[i].top) std::fprintf(stderr, " %d:%.4f", t, lp);
            std::fprintf(stderr, "\n");
        }
    }
    if (args.count("out"))
        write_npy(args["out"].as<std::string>(), c.token_ids.data(), {static_cast<int64_t>(c.token_ids.size())});
    const RequestMetrics& m = out.metrics;
    const double decode_s = m.last_token_time - m.first_token_time;
    std::fprintf(stderr, "generate: prompt %lld tokens, generated %zu (%s); TTFT %.3f s, decode %.1f tokens/s\n",
                 static_cast<long long>(m.num_prompt_tokens), c.token_ids.size(), c.finish_reason.c_str(),
                 m.time_to_first_token(),
                 c.token_ids.size() > 1 && decode_s > 0 ? (c.token_ids.size() - 1) / decode_s : 0.0);
    return 0;
}

}  // namespace deepinfer::cli
