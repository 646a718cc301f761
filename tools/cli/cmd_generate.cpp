// deepinfer generate: prefill a prompt, then decode token by token, streaming the output.
#include <cstdio>
#include <cxxopts.hpp>
#include <random>

#include "backend/backend.h"
#include "cli_common.h"
#include "commands.h"
#include "core/npy.h"
#include "model/model.h"
#include "sample/sampler.h"

namespace deepinfer::cli {

int cmd_generate(int argc, char** argv) {
    cxxopts::Options opts("deepinfer generate", "Generate a continuation of a prompt.");
    opts.add_options()("model", "checkpoint directory (default: $DEEPINFER_HF_MODEL_DIR)",
                       cxxopts::value<std::string>()->default_value(""))(
        "prompt", "prompt text", cxxopts::value<std::string>())(
        "ids-npy", "prompt token ids (.npy, 1-D integers)", cxxopts::value<std::string>())(
        "chat", "chat messages (JSON array of OpenAI-style messages)", cxxopts::value<std::string>())(
        "max-tokens", "tokens to generate", cxxopts::value<int64_t>()->default_value("128"))(
        "temperature", "0 is greedy", cxxopts::value<float>()->default_value("0"))(
        "top-p", "nucleus sampling mass", cxxopts::value<float>()->default_value("1"))(
        "top-k", "sample among the k most likely tokens (0: all)", cxxopts::value<int>()->default_value("0"))(
        "seed", "sampling seed (the request's seq_seed)", cxxopts::value<uint64_t>())(
        "ignore-eos", "do not stop at the model's end-of-sequence token")(
        "out", "write the generated ids (int32 .npy)", cxxopts::value<std::string>())(
        "prefill-chunk", "prefill at most N tokens per forward (0: all)",
        cxxopts::value<int64_t>()->default_value("0"))(
        "device", "cpu or cuda", cxxopts::value<std::string>()->default_value("cpu"))(
        "threads", "CPU threads (0: all cores)", cxxopts::value<int>()->default_value("0"))(
        "quiet", "do not stream tokens, print only the summary")("h,help", "show help");
    auto args = opts.parse(argc, argv);
    if (args.count("help")) {
        std::printf("%s\n", opts.help().c_str());
        return 0;
    }
    const int inputs = static_cast<int>(args.count("prompt") + args.count("ids-npy") + args.count("chat"));
    DI_CHECK(inputs == 1, "give exactly one of --prompt, --ids-npy or --chat");
    DI_CHECK(!args.count("prompt") && !args.count("chat"),
             "--prompt and --chat need the tokenizer, which this build does not have yet; use --ids-npy");
    const int64_t max_tokens = args["max-tokens"].as<int64_t>();
    DI_CHECK(max_tokens >= 0, "--max-tokens must be >= 0");
    SamplingOptions sampling;
    sampling.temperature = args["temperature"].as<float>();
    sampling.top_p = args["top-p"].as<float>();
    sampling.top_k = args["top-k"].as<int>();
    sampling.seed = args.count("seed") ? args["seed"].as<uint64_t>() : std::random_device{}();
    check_sampling_options(sampling);
    const int64_t prefill_chunk = args["prefill-chunk"].as<int64_t>();
    DI_CHECK(prefill_chunk >= 0, "--prefill-chunk must be >= 0");

    const std::vector<int32_t> prompt = read_ids_npy(args["ids-npy"].as<std::string>());
    DI_CHECK(!prompt.empty(), "the prompt is empty");
    auto backend = create_backend(args["device"].as<std::string>(), args["threads"].as<int>());
    auto model = load_model(resolve_model_dir(args["model"].as<std::string>()), *backend);
    const ModelInfo& info = model->info();
    const bool quiet = args.count("quiet") > 0, ignore_eos = args.count("ignore-eos") > 0;

    const int64_t T = static_cast<int64_t>(prompt.size());
    auto seq = model->new_sequence(T + max_tokens);
    std::vector<int32_t> generated;
    const double t0 = now_seconds();
    double t_first = t0;
    if (max_tokens > 0) {
        const int64_t step = prefill_chunk > 0 ? prefill_chunk : T;
        Tensor logits;
        for (int64_t begin = 0; begin < T; begin += step) {
            const int64_t n = std::min(step, T - begin);
            SequenceInput in{seq.get(), std::span<const int32_t>(prompt.data() + begin, n), n - 1};
            logits = model->forward(std::span<const SequenceInput>(&in, 1));
        }
        for (;;) {
            const int32_t token =
                sample_token(std::span<const float>(logits.f32(), info.vocab_size), sampling, generated.size());
            if (generated.empty()) t_first = now_seconds();
            generated.push_back(token);
            if (!quiet) {
                std::printf("%s%d", generated.size() == 1 ? "" : " ", token);
                std::fflush(stdout);
            }
            const bool eos = std::find(info.eos_token_ids.begin(), info.eos_token_ids.end(), token) !=
                             info.eos_token_ids.end();
            if ((eos && !ignore_eos) || static_cast<int64_t>(generated.size()) >= max_tokens) break;
            SequenceInput in{seq.get(), std::span<const int32_t>(&generated.back(), 1), 0};
            logits = model->forward(std::span<const SequenceInput>(&in, 1));
        }
        if (!quiet) std::printf("\n");
    }
    const double t1 = now_seconds();
    if (args.count("out"))
        write_npy(args["out"].as<std::string>(), generated.data(), {static_cast<int64_t>(generated.size())});
    const double decode_s = t1 - t_first;
    std::fprintf(stderr, "generate: prompt %lld tokens, generated %zu; TTFT %.3f s, decode %.1f tokens/s\n",
                 static_cast<long long>(T), generated.size(), t_first - t0,
                 generated.size() > 1 ? (generated.size() - 1) / decode_s : 0.0);
    return 0;
}

}  // namespace deepinfer::cli
