// deepinfer logits: every position's logits for a prompt of token ids, optionally fed in chunks through
// the incremental path (--chunk 1 is pure decoding). Always runs every layer on every row.
#include <cstdio>
#include <cstring>
#include <cxxopts.hpp>

#include "backend/backend.h"
#include "cli_common.h"
#include "commands.h"
#include "core/npy.h"
#include "deepinfer/llm.h"
#include "model/model.h"

namespace deepinfer::cli {

int cmd_logits(int argc, char** argv) {
    cxxopts::Options opts("deepinfer logits", "Write float32 [T, vocab] logits for every position of a prompt.");
    opts.add_options()("model", "checkpoint directory (default: $DEEPINFER_HF_MODEL_DIR, else the default model)",
                       cxxopts::value<std::string>()->default_value(""))(
        "ids-npy", "prompt token ids (.npy, 1-D integers)", cxxopts::value<std::string>())(
        "out", "output .npy file", cxxopts::value<std::string>())(
        "chunk", "feed the prompt N tokens at a time (0: all at once)", cxxopts::value<int64_t>()->default_value("0"))(
        "device", "cpu or cuda", cxxopts::value<std::string>()->default_value("cpu"))(
        "load-format", "auto: the checkpoint's weights; random: random weights (needs only config.json)",
        cxxopts::value<std::string>()->default_value("auto"))(
        "seed", "seed of random weights", cxxopts::value<uint64_t>()->default_value("0"))(
        "threads", "CPU threads (0: all cores)", cxxopts::value<int>()->default_value("0"))("h,help", "show help");
    auto args = opts.parse(argc, argv);
    if (args.count("help")) {
        std::printf("%s\n", opts.help().c_str());
        return 0;
    }
    DI_CHECK(args.count("ids-npy") && args.count("out"), "--ids-npy and --out are required (see --help)");
    const int64_t chunk = args["chunk"].as<int64_t>();
    DI_CHECK(chunk >= 0, "--chunk must be >= 0");

    const std::vector<int32_t> ids = read_ids_npy(args["ids-npy"].as<std::string>());
    DI_CHECK(!ids.empty(), "the prompt is empty");
    auto backend = create_backend(args["device"].as<std::string>(), args["threads"].as<int>());
    const double t_load = now_seconds();
    LoadOptions load;
    load.format = args["load-format"].as<std::string>();
    load.seed = args["seed"].as<uint64_t>();
    auto model = load_model(find_model_dir(args["model"].as<std::string>()), *backend, load);
    const int64_t T = static_cast<int64_t>(ids.size()), V = model->info().vocab_size;

    const double t0 = now_seconds();
    auto seq = model->new_sequence(T);
    std::vector<float> all(static_cast<size_t>(T * V));
    const int64_t step = chunk > 0 ? chunk : T;
    for (int64_t begin = 0; begin < T; begin += step) {
        const int64_t n = std::min(step, T - begin);
        SequenceInput in{seq.get(), std::span<const int32_t>(ids.data() + begin, n), 0};
        Tensor rows = model->forward(std::span<const SequenceInput>(&in, 1));
        std::memcpy(all.data() + begin * V, rows.f32(), n * V * 4);
    }
    const double t1 = now_seconds();
    write_npy(args["out"].as<std::string>(), all.data(), {T, V});
    std::fprintf(stderr, "logits: %lld tokens (chunk %lld) in %.3f s (%.1f tokens/s); load %.3f s\n",
                 static_cast<long long>(T), static_cast<long long>(step), t1 - t0, T / (t1 - t0), t0 - t_load);
    return 0;
}

}  // namespace deepinfer::cli
