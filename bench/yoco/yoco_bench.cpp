// YOCO prefill truncation (SWA bounded replay) on a DeepSeek-V4.1 checkpoint: for random prompts of several
// lengths, prefill with truncation off and compact, and report the last-row logit deviation, the rows the
// late layers ran, the matrix-multiply FLOPs and the wall time of each.
//   yoco_bench MODEL_DIR [--keep N] [--lengths 300,1000,4000] [--threads N] [--repeats R]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/thread_pool.h"
#include "model/safetensors.h"
#include "model/deepseek_v41/model.h"
#include "model/model.h"

using namespace deepinfer;

namespace {

double seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Multiply-adds per row of one layer's matrices (attention, compressor, indexer, routed top-k and shared
// experts). The indexer's scoring is counted separately; attention over the window and the top-k entries
// is left out (at most window + top-k keys per row).
double layer_macs(const dsv41::DeepseekV41Config& c, const dsv41::LayerWeights& L) {
    auto mk = [](const LinearWeight& w) { return w.empty() ? 0.0 : static_cast<double>(w.rows) * w.cols; };
    double macs = mk(L.wq_a) + mk(L.wq_b) + mk(L.wkv) + mk(L.wo_a) / c.o_groups + mk(L.wo_b) + mk(L.compressor_wkv) +
                  mk(L.compressor_wgate) + mk(L.index_wq_b) + mk(L.index_weights_proj);
    const ExpertWeights e = L.moe.expert(0);
    macs += c.moe.experts_per_token * (mk(e.w1) + mk(e.w2) + mk(e.w3));
    macs += mk(L.moe.shared.w1) + mk(L.moe.shared.w2) + mk(L.moe.shared.w3) + mk(L.moe.gate);
    if (L.has_engram) macs += mk(L.engram.wkv);
    return macs;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        std::fprintf(stderr, "usage: yoco_bench MODEL_DIR [--keep N] [--lengths a,b,c] [--threads N] [--repeats R]\n");
        return 2;
    }
    int64_t keep = 140;
    int threads = 0, repeats = 3;
    std::vector<int64_t> lengths = {300, 1000, 4000};
    for (int i = 2; i + 1 < argc; i += 2) {
        const std::string flag = argv[i];
        if (flag == "--keep") keep = std::stoll(argv[i + 1]);
        else if (flag == "--threads") threads = std::stoi(argv[i + 1]);
        else if (flag == "--repeats") repeats = std::stoi(argv[i + 1]);
        else if (flag == "--lengths") {
            lengths.clear();
            std::stringstream ss(argv[i + 1]);
            for (std::string tok; std::getline(ss, tok, ',');) lengths.push_back(std::stoll(tok));
        }
    }
    try {
        auto backend = create_backend("cpu", threads);
        auto model = load_model(argv[1], *backend);
        auto* v41 = dynamic_cast<dsv41::DeepseekV41Model*>(model.get());
        if (!v41) throw Error("yoco_bench needs a deepseek_v41 checkpoint");
        const dsv41::DeepseekV41Config& c = v41->config();
        // Weights are private to the model; reload them for the FLOP count (cheap: memory-mapped).
        Checkpoint ckpt(argv[1]);
        const dsv41::DeepseekV41Weights w = dsv41::load_deepseek_v41_weights(ckpt, c);
        const int late_start = c.last_kv_source() + 1;
        double early_macs = 0, late_macs = 0;
        for (int l = 0; l < c.num_layers; ++l) (l < late_start ? early_macs : late_macs) += layer_macs(c, w.layers[l]);
        // The indexer scores every row against every compressed entry of the chunk: rows x entries x heads x dim.
        auto indexer_macs = [&](int64_t len, int64_t late_rows) {
            double m = 0;
            for (int l = 0; l < c.num_layers; ++l) {
                if (!c.is_index_source(l)) continue;
                const double rows = l < late_start ? len : late_rows;
                m += rows * (static_cast<double>(len) / c.compress_ratio[l]) * c.index_heads * c.index_head_dim;
            }
            return m;
        };

        std::printf("model %s: %d layers, window %d, last kv source %d; keep %lld rows; %d threads\n", argv[1],
                    c.num_layers, c.window, c.last_kv_source(), static_cast<long long>(keep),
                    backend->pool().num_threads());
        std::printf("| prompt | late-layer rows off / compact | GFLOP off / compact | saving | time off / compact (ms) "
                    "| speedup | last-row logits deviation |\n|---|---|---|---|---|---|---|\n");
        std::mt19937 rng(17);
        for (int64_t len : lengths) {
            std::vector<int32_t> ids(len);
            ids[0] = c.bos_token_id >= 0 ? c.bos_token_id : 0;
            for (int64_t i = 1; i < len; ++i) ids[i] = 3 + static_cast<int32_t>(rng() % (c.vocab_size - 3));
            double best[2] = {1e30, 1e30};
            std::vector<float> last[2];
            int64_t late_rows[2] = {0, 0};
            for (int mode = 0; mode < 2; ++mode) {
                v41->set_prefill_truncation({mode ? dsv41::PrefillTruncation::Mode::kCompact
                                                  : dsv41::PrefillTruncation::Mode::kOff,
                                             keep});
                for (int r = 0; r < repeats; ++r) {
                    auto seq = model->new_sequence(len);
                    SequenceInput in{seq.get(), std::span<const int32_t>(ids), len - 1};
                    const double t0 = seconds();
                    Tensor logits = model->forward(std::span<const SequenceInput>(&in, 1));
                    best[mode] = std::min(best[mode], seconds() - t0);
                    last[mode].assign(logits.f32(), logits.f32() + logits.numel());
                    late_rows[mode] = v41->last_late_rows();
                }
            }
            double max_diff = 0, max_ref = 0;
            for (size_t i = 0; i < last[0].size(); ++i) {
                max_diff = std::max(max_diff, static_cast<double>(std::fabs(last[1][i] - last[0][i])));
                max_ref = std::max(max_ref, static_cast<double>(std::fabs(last[0][i])));
            }
            const double flops_off = 2.0 * (len * (early_macs + late_macs) + indexer_macs(len, len)) * 1e-9;
            const double flops_on =
                2.0 * (len * early_macs + late_rows[1] * late_macs + indexer_macs(len, late_rows[1])) * 1e-9;
            std::printf("| %lld | %lld / %lld | %.3f / %.3f | %.0f%% | %.1f / %.1f | %.2fx | %.2e |\n",
                        static_cast<long long>(len), static_cast<long long>(late_rows[0]),
                        static_cast<long long>(late_rows[1]), flops_off, flops_on, 100.0 * (1 - flops_on / flops_off),
                        best[0] * 1e3, best[1] * 1e3, best[0] / best[1], max_diff / max_ref);
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "yoco_bench: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
