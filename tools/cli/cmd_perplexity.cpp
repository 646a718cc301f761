// deepinfer perplexity: held-out perplexity of a text, windowed exactly as the training script's reference
// (tools/train/train_tiny_v4.py): ids = [bos] + encode(text), windows of --context ids from fresh context.
#include <cstdio>
#include <cxxopts.hpp>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "cli_common.h"
#include "commands.h"
#include "core/file.h"
#include "deepinfer/llm.h"
#include "model/model.h"
#include "model/perplexity.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::cli {

int cmd_perplexity(int argc, char** argv) {
    cxxopts::Options opts("deepinfer perplexity", "Perplexity of a text file under the model (next-token NLL).");
    opts.add_options()("model", "checkpoint directory (default: $DEEPINFER_HF_MODEL_DIR, else the default model)",
                       cxxopts::value<std::string>()->default_value(""))(
        "text-file", "UTF-8 text to score (default: the model directory's heldout.txt)",
        cxxopts::value<std::string>()->default_value(""))(
        "tokenizer", "tokenizer.json or its directory (default: the model's)",
        cxxopts::value<std::string>()->default_value(""))(
        "context", "tokens per window", cxxopts::value<int64_t>()->default_value("512"))(
        "max-windows", "score only the first N windows (0: all)", cxxopts::value<int64_t>()->default_value("0"))(
        "batch", "windows per forward pass", cxxopts::value<int64_t>()->default_value("8"))(
        "json", "also write the result (per-window NLL included) to this file",
        cxxopts::value<std::string>()->default_value(""))(
        "device", "cpu or cuda", cxxopts::value<std::string>()->default_value("cpu"))(
        "threads", "CPU threads (0: all cores)", cxxopts::value<int>()->default_value("0"))("h,help", "show help");
    auto args = opts.parse(argc, argv);
    if (args.count("help")) {
        std::printf("%s\n", opts.help().c_str());
        return 0;
    }
    const int64_t context = args["context"].as<int64_t>(), max_windows = args["max-windows"].as<int64_t>(),
                  batch = args["batch"].as<int64_t>();
    DI_CHECK(context >= 1, "--context must be at least 1, got ", context);
    DI_CHECK(batch >= 1, "--batch must be at least 1, got ", batch);
    DI_CHECK(max_windows >= 0, "--max-windows must be 0 (all) or more, got ", max_windows);
    const std::string dir = find_model_dir(args["model"].as<std::string>());
    std::string text_path = args["text-file"].as<std::string>();
    if (text_path.empty()) text_path = path_join(dir, "heldout.txt");
    DI_CHECK(file_exists(text_path), "no text to score: ", text_path, " does not exist (pass --text-file)");
    const std::string tok_path = args["tokenizer"].as<std::string>().empty() ? dir : args["tokenizer"].as<std::string>();
    const std::vector<int32_t> ids = perplexity_ids(Tokenizer::from_file(tok_path), read_file(text_path));

    auto backend = create_backend(args["device"].as<std::string>(), args["threads"].as<int>());
    auto model = load_model(dir, *backend);
    const double t0 = now_seconds();
    const PerplexityResult r = evaluate_perplexity(*model, ids, context, max_windows, batch, &backend->pool());
    const double seconds = now_seconds() - t0;
    std::printf("perplexity %.4f (mean NLL %.5f nats) over %lld tokens in %zu windows of %lld; uniform %lld; %.1f s\n",
                r.perplexity(), r.nll_sum() / static_cast<double>(r.tokens()), static_cast<long long>(r.tokens()),
                r.window_nll.size(), static_cast<long long>(context),
                static_cast<long long>(model->info().vocab_size), seconds);
    if (const std::string out = args["json"].as<std::string>(); !out.empty()) {
        const nlohmann::json j = {{"perplexity", r.perplexity()},   {"tokens", r.tokens()},
                                  {"windows", r.window_nll.size()}, {"context", context},
                                  {"window_nll", r.window_nll},     {"window_tokens", r.window_tokens},
                                  {"text_file", text_path},         {"seconds", seconds}};
        std::ofstream f(out);
        f << j.dump(1) << "\n";
        DI_CHECK(f.good(), "cannot write ", out);
    }
    return 0;
}

}  // namespace deepinfer::cli
