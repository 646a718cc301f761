// Step times of the DeepSeek-V4 forward on one device: decode steps at several batch sizes over a common
// context, and prefill of several batch x length shapes, each beside its floor: the bytes a decode step must
// read over the measured memory bandwidth, and the FLOPs a prefill must do over the measured matrix rate.
//   step_bench MODEL_DIR [--device cuda] [--load-format random] [--seed S] [--context 4096]
//              [--decode-batches 1,8,32,128] [--decode-steps 10] [--prefill 1x4096,8x2048] [--repeats 3]
//              [--bandwidth-gbs 4300] [--matmul-tflops 790] [--threads N] [--json FILE] [--hold-ms MS]
//              [--variants NAME:VAR=V,...;NAME:...] [--rounds 1]
// The floors count weights in their stored formats (FP8 / FP4 / BF16, scales included) and the KV state at
// bf16 (what the reference keeps); routed experts count the expected number a batch of uniformly routed
// tokens touches. Decode sequences are forks of one prefilled context, so every batch sees the same history.
// After each batch's timed steps one untimed step records the routing: the experts each layer touched, and the
// "routed floor" counting those instead (random weights send a batch's rows to fewer experts in score-routed
// layers than uniform routing would; bench/configs/*-uniform-routing hash-routes every layer instead).
// A decode step is timed as the engine runs an all-greedy step: the logits stay in backend memory and only the
// picked ids are downloaded (transformers' step likewise leaves its logits on the GPU).
// With --hold-ms MS each timed decode step is also run behind a busy op on the device (a matmul through the head, timed
// alone first, long enough to outlast the host's issue of the whole step): "device ms" is that run's time less the
// busy op's (which lasts at least MS), the step's time with the host out of the way, which is what issuing it as a CUDA
// graph could at best give. The plain "step ms" stays the figure to report. With DEEPINFER_CUDA_PROFILE=1 each
// measurement is followed by its per-op device time (events around every op add host overhead, so the step times of
// such a run are not the ones to report).
// With --variants "NAME:VAR=V,VAR=V;NAME:..." [--rounds R] the decode and prefill measurements run once a variant and
// round (variants in turn, R rounds: A B A B ...) on the one loaded model, each with its environment variables set
// (those another variant names and this one does not are put back as they were): an A/B of the backend's switches
// that are read per call, without loading the model again. Each variant also runs one more, untimed step a batch on
// fresh forks of the context with fixed tokens (the same in every variant and round), and the end of the run says how
// its logits compare with the first variant's (relative L2 difference, rows whose argmax agrees) and whether a later
// round's are bitwise its first round's: an end-to-end check of a switch's numerics beside its speed.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "model/deepseek_v4/model.h"
#include "model/model.h"

using namespace deepinfer;

namespace {

double seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
}

double bytes_of(const LinearWeight& w) {
    return w.empty() ? 0.0 : static_cast<double>(w.data.nbytes() + (w.scale.empty() ? 0 : w.scale.nbytes()));
}
double macs_of(const LinearWeight& w) { return w.empty() ? 0.0 : static_cast<double>(w.rows) * w.cols; }
double bytes_of(const ExpertWeights& e) { return bytes_of(e.w1) + bytes_of(e.w2) + bytes_of(e.w3); }
double macs_of(const ExpertWeights& e) { return macs_of(e.w1) + macs_of(e.w2) + macs_of(e.w3); }

// Per-layer matrices every token runs through (attention, compressors, indexer projections, router,
// shared expert), in bytes and multiply-adds per token.
void dense_layer(const dsv4::LayerWeights& L, double* bytes, double* macs) {
    std::vector<const LinearWeight*> ws = {&L.wq_a, &L.wq_b, &L.wkv, &L.wo_a, &L.wo_b, &L.moe.gate,
                                           &L.moe.shared.w1, &L.moe.shared.w2, &L.moe.shared.w3};
    if (L.has_compressor) ws.insert(ws.end(), {&L.compressor.wkv, &L.compressor.wgate});
    if (L.has_indexer)
        ws.insert(ws.end(), {&L.indexer.compressor.wkv, &L.indexer.compressor.wgate, &L.indexer.wq_b,
                             &L.indexer.weights_proj});
    *bytes = *macs = 0;
    for (const LinearWeight* w : ws) {
        *bytes += bytes_of(*w);
        *macs += macs_of(*w);
    }
    // mHC projections (fp32 as released).
    *bytes += 4.0 * static_cast<double>(L.hc_attn.fn.numel() + L.hc_ffn.fn.numel());
    *macs += static_cast<double>(L.hc_attn.fn.numel() + L.hc_ffn.fn.numel());
}

struct Floors {
    const dsv4::DeepseekV4Config& c;
    const dsv4::DeepseekV4Weights& w;

    // Bytes one decode step of `batch` sequences at context `ctx` must read: the routed experts a batch of uniformly
    // routed tokens touches, or layer l's touched[l] experts when given.
    double decode_bytes(int64_t batch, int64_t ctx, const std::vector<int64_t>* touched_experts = nullptr) const {
        double total = bytes_of(w.head) + static_cast<double>(batch) * w.embed.cols * 2;
        for (int l = 0; l < c.num_layers; ++l) {
            const dsv4::LayerWeights& L = w.layers[l];
            double b = 0, m = 0;
            dense_layer(L, &b, &m);
            const double E = static_cast<double>(L.moe.w1.size()), k = c.experts_per_token;
            const double touched = touched_experts ? static_cast<double>((*touched_experts)[l])
                                                   : E * (1.0 - std::pow(1.0 - k / E, static_cast<double>(batch)));
            total += b + touched * bytes_of(L.moe.expert(0));
            // KV at bf16: window rows, then the entries attention or the indexer reads.
            double kv = static_cast<double>(std::min<int64_t>(ctx, c.window)) * c.head_dim;
            if (c.attn[l] != dsv4::AttnKind::kSliding) {
                const int64_t entries = ctx / c.compress_ratio[l];
                if (c.attn[l] == dsv4::AttnKind::kCsa)
                    kv += static_cast<double>(std::min<int64_t>(entries, c.index_topk)) * c.head_dim +
                          static_cast<double>(entries) * c.index_head_dim;
                else
                    kv += static_cast<double>(entries) * c.head_dim;
            }
            total += static_cast<double>(batch) * kv * 2;
        }
        return total;
    }

    // FLOPs of a prefill of `batch` sequences of `len` tokens (logits for the last token of each).
    double prefill_flops(int64_t batch, int64_t len) const {
        double macs = static_cast<double>(batch) * macs_of(w.head);
        for (int l = 0; l < c.num_layers; ++l) {
            const dsv4::LayerWeights& L = w.layers[l];
            double b = 0, m = 0;
            dense_layer(L, &b, &m);
            double per_seq = static_cast<double>(len) * (m + c.experts_per_token * macs_of(L.moe.expert(0)));
            // Attention (scores and values) and the indexer's scoring, position by position.
            for (int64_t p = 0; p < len; ++p) {
                double keys = static_cast<double>(std::min<int64_t>(p + 1, c.window));
                if (c.attn[l] != dsv4::AttnKind::kSliding) {
                    const int64_t entries = (p + 1) / c.compress_ratio[l];
                    if (c.attn[l] == dsv4::AttnKind::kCsa) {
                        keys += static_cast<double>(std::min<int64_t>(entries, c.index_topk));
                        per_seq += static_cast<double>(entries) * c.index_heads * c.index_head_dim;
                    } else {
                        keys += static_cast<double>(entries);
                    }
                }
                per_seq += 2.0 * keys * c.num_heads * c.head_dim;
            }
            macs += static_cast<double>(batch) * per_seq;
        }
        return 2.0 * macs;
    }
};

// A busy op for --hold-ms: the head over `rows` zero rows, rows doubled until it takes at least `ms` (median of 3).
struct HoldOp {
    Tensor x, out;
    int64_t rows = 0;
    double ms = 0;
};

HoldOp make_hold(Backend& be, const LinearWeight& head, double ms) {
    HoldOp h;
    for (h.rows = 128; h.rows <= 65536; h.rows *= 2) {
        h.x = be.alloc(DType::kF32, Shape{h.rows, head.cols});
        h.out = be.alloc(DType::kF32, Shape{h.rows, head.rows});
        const std::vector<float> zeros(static_cast<size_t>(h.rows * head.cols), 0.0f);
        be.upload(h.x, zeros.data());
        std::vector<double> t;
        for (int r = 0; r < 4; ++r) {
            be.synchronize();
            const double s = seconds();
            be.linear(h.out, h.x, head);
            be.synchronize();
            if (r > 0) t.push_back(seconds() - s);
        }
        h.ms = median(t) * 1e3;
        if (h.ms >= ms) break;
    }
    return h;
}

std::vector<int64_t> parse_list(const std::string& s) {
    std::vector<int64_t> out;
    std::stringstream ss(s);
    for (std::string tok; std::getline(ss, tok, ',');) out.push_back(std::stoll(tok));
    return out;
}

std::vector<std::pair<int64_t, int64_t>> parse_shapes(const std::string& s) {
    std::vector<std::pair<int64_t, int64_t>> out;
    std::stringstream ss(s);
    for (std::string tok; std::getline(ss, tok, ',');) {
        const size_t x = tok.find('x');
        DI_CHECK(x != std::string::npos, "prefill shape '", tok, "' is not BATCHxLENGTH");
        out.push_back({std::stoll(tok.substr(0, x)), std::stoll(tok.substr(x + 1))});
    }
    return out;
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, std::mt19937_64& rng) {
    std::uniform_int_distribution<int32_t> pick(2, static_cast<int32_t>(vocab - 1));
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int32_t& v : t) v = pick(rng);
    return t;
}

// A decode step's inputs: token b for sequence b (tokens must outlive them).
std::vector<SequenceInput> decode_inputs(const std::vector<std::unique_ptr<ModelSequence>>& seqs,
                                         const std::vector<int32_t>& tokens) {
    std::vector<SequenceInput> inputs;
    for (size_t b = 0; b < seqs.size(); ++b)
        inputs.push_back({seqs[b].get(), std::span<const int32_t>(&tokens[b], 1), 0});
    return inputs;
}

// One decode step of the sequences (random tokens, untimed) with the model recording its routing: the number of
// distinct routed experts each layer's batch touched.
std::vector<int64_t> routed_experts(dsv4::DeepseekV4Model& model, Backend& backend,
                                    const std::vector<std::unique_ptr<ModelSequence>>& seqs, std::mt19937_64& rng,
                                    int64_t vocab) {
    const std::vector<int32_t> tokens = random_tokens(static_cast<int64_t>(seqs.size()), vocab, rng);
    std::vector<std::vector<int32_t>> ids;
    model.record_routing(&ids);
    model.forward_on_backend(decode_inputs(seqs, tokens));
    model.record_routing(nullptr);
    backend.synchronize();
    std::vector<int64_t> touched;
    for (const std::vector<int32_t>& layer : ids) {
        std::vector<int32_t> sorted = layer;
        std::sort(sorted.begin(), sorted.end());
        touched.push_back(std::unique(sorted.begin(), sorted.end()) - sorted.begin());
    }
    return touched;
}

// The logits of one decode step on fresh forks of `source` with fixed tokens (a function of the batch size only).
std::vector<float> probe_logits(CausalLM& model, ModelSequence& source, int64_t room, int64_t batch, int64_t vocab) {
    std::vector<std::unique_ptr<ModelSequence>> seqs;
    for (int64_t b = 0; b < batch; ++b) seqs.push_back(model.fork_sequence(source, room));
    std::mt19937_64 fixed(7919 + static_cast<uint64_t>(batch));
    const std::vector<int32_t> tokens = random_tokens(batch, vocab, fixed);
    const Tensor logits = model.forward(decode_inputs(seqs, tokens));
    return std::vector<float>(logits.f32(), logits.f32() + logits.numel());
}

// got against ref ([rows, vocab] each): the relative L2 difference and the rows whose largest logit is at the same
// index (the first one of equals).
struct Agreement {
    double rel_l2;
    int64_t argmax_same, rows;
};
Agreement agreement(const std::vector<float>& got, const std::vector<float>& ref, int64_t vocab) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        num += (static_cast<double>(got[i]) - ref[i]) * (static_cast<double>(got[i]) - ref[i]);
        den += static_cast<double>(ref[i]) * ref[i];
    }
    Agreement a{den > 0 ? std::sqrt(num / den) : std::sqrt(num), 0, static_cast<int64_t>(ref.size()) / vocab};
    for (int64_t r = 0; r < a.rows; ++r) {
        const auto row = [&](const std::vector<float>& v) { return v.begin() + r * vocab; };
        a.argmax_same += std::max_element(row(got), row(got) + vocab) - row(got) ==
                         std::max_element(row(ref), row(ref) + vocab) - row(ref);
    }
    return a;
}

// A per-op time table (Backend::take_profile) of the `steps` timed steps (the warm-ups' ops are dropped: a rare op's
// first call, with its kernels' first launch, would weigh in its average), if the backend profiles.
void print_profile(const std::string& table, const std::string& what, int64_t steps) {
    if (table.empty()) return;
    std::printf("  per-op device time, %s, %lld timed steps:\n", what.c_str(), static_cast<long long>(steps));
    std::istringstream lines(table);
    for (std::string line; std::getline(lines, line);) std::printf("    %s\n", line.c_str());
}

// A named set of environment variables (--variants).
struct Variant {
    std::string name;
    std::vector<std::pair<std::string, std::string>> env;
};

// "NAME:VAR=V,VAR=V;NAME:..." (a variant may set nothing: "base:").
std::vector<Variant> parse_variants(const std::string& s) {
    std::vector<Variant> out;
    std::stringstream ss(s);
    for (std::string tok; std::getline(ss, tok, ';');) {
        if (tok.empty()) continue;
        const size_t colon = tok.find(':');
        DI_CHECK(colon != std::string::npos && colon > 0, "variant '", tok, "' is not NAME:VAR=V,...");
        Variant v{tok.substr(0, colon), {}};
        std::stringstream vars(tok.substr(colon + 1));
        for (std::string kv; std::getline(vars, kv, ',');) {
            const size_t eq = kv.find('=');
            DI_CHECK(eq != std::string::npos && eq > 0, "variant ", v.name, ": '", kv, "' is not VAR=VALUE");
            v.env.push_back({kv.substr(0, eq), kv.substr(eq + 1)});
        }
        out.push_back(std::move(v));
    }
    return out;
}

// Sets `v`'s variables and puts back, as they were at start, those the other variants name and `v` does not.
void apply_variant(const Variant& v, const std::map<std::string, std::optional<std::string>>& original) {
    for (const auto& [name, value] : original) {
        const auto set = std::find_if(v.env.begin(), v.env.end(), [&](const auto& kv) { return kv.first == name; });
        if (set != v.env.end())
            setenv(name.c_str(), set->second.c_str(), 1);
        else if (value)
            setenv(name.c_str(), value->c_str(), 1);
        else
            unsetenv(name.c_str());
    }
}

}  // namespace

int main(int argc, char** argv) try {
    if (argc < 2) {
        std::fprintf(stderr,
                     "usage: step_bench MODEL_DIR [--device cuda] [--load-format random] [--context N] "
                     "[--decode-batches a,b] [--decode-steps N] [--prefill BxL,...] [--repeats R] "
                     "[--bandwidth-gbs X] [--matmul-tflops X] [--threads N] [--json FILE] [--hold-ms MS] "
                     "[--variants NAME:VAR=V,...;NAME:...] [--rounds R]\n");
        return 2;
    }
    std::string device = "cpu", json_path;
    LoadOptions load;
    int64_t context = 4096, decode_steps = 10;
    int repeats = 3, threads = 0;
    double bandwidth_gbs = 4300, matmul_tflops = 790;  // H200 copy bandwidth and bf16 GEMM rate measured here
    double hold_ms = 0;                                // --hold-ms: 0 runs no held steps
    std::vector<Variant> variants;                     // --variants: none runs the environment as it is
    int rounds = 1;
    std::vector<int64_t> batches = {1, 8, 32, 128};
    std::vector<std::pair<int64_t, int64_t>> prefills = {{1, 4096}, {8, 2048}};
    for (int i = 2; i + 1 < argc; i += 2) {
        const std::string flag = argv[i], v = argv[i + 1];
        if (flag == "--device") device = v;
        else if (flag == "--load-format") load.format = v;
        else if (flag == "--seed") load.seed = std::stoull(v);
        else if (flag == "--context") context = std::stoll(v);
        else if (flag == "--decode-batches") batches = parse_list(v);
        else if (flag == "--decode-steps") decode_steps = std::stoll(v);
        else if (flag == "--prefill") prefills = v.empty() ? decltype(prefills){} : parse_shapes(v);
        else if (flag == "--repeats") repeats = std::stoi(v);
        else if (flag == "--bandwidth-gbs") bandwidth_gbs = std::stod(v);
        else if (flag == "--matmul-tflops") matmul_tflops = std::stod(v);
        else if (flag == "--threads") threads = std::stoi(v);
        else if (flag == "--json") json_path = v;
        else if (flag == "--hold-ms") hold_ms = std::stod(v);
        else if (flag == "--variants")
            variants = parse_variants(v);
        else if (flag == "--rounds")
            rounds = std::stoi(v);
        else DI_THROW("unknown flag ", flag);
    }

    auto backend = create_backend(device, threads);
    double t0 = seconds();
    auto model = load_model(argv[1], *backend, load);
    auto* v4 = dynamic_cast<dsv4::DeepseekV4Model*>(model.get());
    DI_CHECK(v4, "step_bench counts FLOPs and bytes for DeepSeek-V4 models only");
    std::printf("model: %s (%s weights), %.2f GB stored; loaded in %.1f s on %s\n",
                model->info().description.c_str(), load.format.c_str(), model->info().weight_bytes / 1e9,
                seconds() - t0, backend->name().c_str());
    const Floors floors{v4->config(), v4->weights()};
    const int64_t vocab = model->info().vocab_size;
    std::mt19937_64 rng(1234);
    nlohmann::json results = {{"device", backend->name()},
                              {"model", model->info().description},
                              {"bandwidth_gbs", bandwidth_gbs},
                              {"matmul_tflops", matmul_tflops},
                              {"context", context}};

    // One context, prefilled in chunks, forked into every decode sequence.
    const int64_t room = context + (hold_ms > 0 ? 2 : 1) * (decode_steps + 2) + 8;
    std::unique_ptr<ModelSequence> source;
    HoldOp hold;
    if (!batches.empty()) {
        source = model->new_sequence(room);
        const std::vector<int32_t> prompt = random_tokens(context, vocab, rng);
        t0 = seconds();
        for (int64_t p = 0; p < context; p += 2048) {
            const int64_t n = std::min<int64_t>(2048, context - p);
            SequenceInput in{source.get(), std::span<const int32_t>(prompt.data() + p, n), n - 1};
            model->forward(std::span<const SequenceInput>(&in, 1));
        }
        std::printf("context of %lld tokens prefilled in %.2f s\n", static_cast<long long>(context), seconds() - t0);
        if (hold_ms > 0) {
            hold = make_hold(*backend, v4->weights().head, hold_ms);
            std::printf("hold: the head over %lld rows, %.3f ms\n", static_cast<long long>(hold.rows), hold.ms);
        }
    }

    // With variants: each variant's probe logits (probe_logits) from its first round, by batch; later rounds are
    // compared with them as they come, the variants with the first one at the end.
    std::map<int64_t, std::map<std::string, std::vector<float>>> probes;
    const auto probe = [&](int64_t batch, const std::string& variant) {
        std::vector<float> logits = probe_logits(*model, *source, room, batch, vocab);
        auto& first = probes[batch];
        if (const auto at = first.find(variant); at != first.end()) {
            const bool same = at->second == logits;
            std::printf("         probe: %s, a later round's logits %s its first round's\n", variant.c_str(),
                        same ? "bitwise equal to" : "differ from");
            results["agreement"].push_back({{"batch", batch}, {"variant", variant}, {"bitwise_as_before", same}});
        } else {
            first.emplace(variant, std::move(logits));
        }
    };

    // The decode batches' and the prefill shapes' measurements, their JSON records tagged with `variant` if any.
    const auto measure_decode = [&](const std::string& variant) {
        // host ms: the time to issue a step (the forward's host work and launches), of which the GPU waits for
        // whatever exceeds its own time.
        std::printf("%-8s %12s %12s %12s %10s %10s %14s %10s  %s\n", "batch", "step ms", "floor ms", "floor GB",
                    "x floor", "host ms", "routed floor", "x routed", "experts touched by layer");
        for (int64_t batch : batches) {
            std::vector<std::unique_ptr<ModelSequence>> seqs;
            for (int64_t b = 0; b < batch; ++b) seqs.push_back(model->fork_sequence(*source, room));
            backend->take_profile();  // drop the prefill's and the forks' ops
            std::vector<double> times, host_times, device_times;
            for (int64_t step = 0; step < decode_steps + 2; ++step) {
                for (const bool held : {false, true}) {
                    if (held && hold_ms <= 0) continue;
                    const std::vector<int32_t> tokens = random_tokens(batch, vocab, rng);
                    const std::vector<SequenceInput> inputs = decode_inputs(seqs, tokens);
                    backend->synchronize();
                    const double s = seconds();
                    if (held) backend->linear(hold.out, hold.x, v4->weights().head);
                    // As the engine runs an all-greedy step: logits stay in device memory, the ids come back.
                    Tensor logits = model->forward_on_backend(inputs);
                    Tensor ids = backend->alloc(DType::kI32, Shape{batch});
                    backend->argmax_rows(ids, logits);
                    const double issued = seconds();
                    std::vector<int32_t> picked(batch);
                    backend->download(picked.data(), ids);  // the step has finished
                    if (step < 2) continue;                 // two warm-up steps
                    if (held) {
                        device_times.push_back(seconds() - s - hold.ms * 1e-3);
                    } else {
                        times.push_back(seconds() - s);
                        host_times.push_back(issued - s);
                    }
                }
                if (step == 1) backend->take_profile();  // drop the warm-ups' ops
            }
            const double ms = median(times) * 1e3, host_ms = median(host_times) * 1e3;
            const double bytes = floors.decode_bytes(batch, context), floor_ms = bytes / (bandwidth_gbs * 1e9) * 1e3;
            // One more, untimed step records the routing: the experts each layer's batch touched. The floor counts
            // uniformly routed tokens; a model whose router sends the batch to fewer experts reads less (the
            // "routed floor"). Random weights do that in score-routed layers (see bench/results).
            const std::string profile = backend->take_profile();  // the timed steps' ops only
            const std::vector<int64_t> touched = routed_experts(*v4, *backend, seqs, rng, vocab);
            backend->take_profile();
            const double routed_bytes = floors.decode_bytes(batch, context, &touched);
            const double routed_ms = routed_bytes / (bandwidth_gbs * 1e9) * 1e3;
            std::string per_layer;
            for (int64_t t : touched) per_layer += (per_layer.empty() ? "" : "/") + std::to_string(t);
            std::printf("%-8lld %12.3f %12.3f %12.3f %10.1f %10.3f %14.3f %10.1f  %s\n", static_cast<long long>(batch),
                        ms, floor_ms, bytes / 1e9, ms / floor_ms, host_ms, routed_ms, ms / routed_ms,
                        per_layer.c_str());
            if (hold_ms > 0)
                std::printf("         device ms %.3f (%.1f x floor): behind the hold, the host out of the way\n",
                            median(device_times) * 1e3, median(device_times) * 1e3 / floor_ms);
            std::fflush(stdout);
            results["decode"].push_back({{"batch", batch},
                                         {"step_ms", ms},
                                         {"host_ms", host_ms},
                                         {"floor_ms", floor_ms},
                                         {"bytes", bytes},
                                         {"routed_floor_ms", routed_ms},
                                         {"experts_touched", touched},
                                         {"steps", times.size()}});
            if (hold_ms > 0) results["decode"].back()["device_ms"] = median(device_times) * 1e3;
            if (!variant.empty()) results["decode"].back()["variant"] = variant;
            print_profile(profile, "decode batch " + std::to_string(batch), decode_steps);
            if (!variant.empty()) probe(batch, variant);
        }
    };

    const auto measure_prefill = [&](const std::string& variant) {
        std::printf("%-10s %12s %14s %12s %12s %10s\n", "prefill", "ms", "tokens/s", "floor ms", "TFLOP", "x floor");
        for (const auto& [batch, len] : prefills) {
            backend->take_profile();
            std::vector<double> times;
            for (int r = 0; r < repeats + 1; ++r) {
                std::vector<std::unique_ptr<ModelSequence>> seqs;
                std::vector<std::vector<int32_t>> prompts;
                std::vector<SequenceInput> inputs;
                for (int64_t b = 0; b < batch; ++b) {
                    seqs.push_back(model->new_sequence(len));
                    prompts.push_back(random_tokens(len, vocab, rng));
                }
                for (int64_t b = 0; b < batch; ++b) inputs.push_back({seqs[b].get(), prompts[b], len - 1});
                backend->synchronize();
                const double s = seconds();
                model->forward(inputs);
                if (r > 0) times.push_back(seconds() - s);  // the first is a warm-up
                if (r == 0) backend->take_profile();        // and its ops are dropped
            }
            const double ms = median(times) * 1e3, flops = floors.prefill_flops(batch, len);
            const double floor_ms = flops / (matmul_tflops * 1e12) * 1e3;
            const double tps = static_cast<double>(batch * len) / (ms / 1e3);
            std::printf("%-10s %12.2f %14.0f %12.3f %12.2f %10.1f\n",
                        (std::to_string(batch) + "x" + std::to_string(len)).c_str(), ms, tps, floor_ms, flops / 1e12,
                        ms / floor_ms);
            std::fflush(stdout);
            results["prefill"].push_back({{"batch", batch},
                                          {"length", len},
                                          {"ms", ms},
                                          {"tokens_per_s", tps},
                                          {"floor_ms", floor_ms},
                                          {"flops", flops}});
            if (!variant.empty()) results["prefill"].back()["variant"] = variant;
            print_profile(backend->take_profile(), "prefill " + std::to_string(batch) + "x" + std::to_string(len),
                          repeats);
        }
    };

    std::map<std::string, std::optional<std::string>> original;  // every variable a variant names, as it was
    for (const Variant& v : variants)
        for (const auto& kv : v.env) {
            const char* now = std::getenv(kv.first.c_str());
            original.emplace(kv.first, now ? std::optional<std::string>(now) : std::nullopt);
        }
    const std::vector<Variant> runs = variants.empty() ? std::vector<Variant>{Variant{}} : variants;
    for (int round = 0; round < rounds; ++round)
        for (const Variant& v : runs) {
            if (!v.name.empty()) {
                apply_variant(v, original);
                std::printf("variant %s (round %d):", v.name.c_str(), round + 1);
                for (const auto& [name, value] : v.env) std::printf(" %s=%s", name.c_str(), value.c_str());
                std::printf("\n");
            }
            if (!batches.empty()) measure_decode(v.name);
            if (!prefills.empty()) measure_prefill(v.name);
        }
    for (const auto& [batch, by_variant] : probes) {  // every variant against the first
        const std::string& first = variants.front().name;
        for (size_t i = 1; i < variants.size(); ++i) {
            const Agreement a = agreement(by_variant.at(variants[i].name), by_variant.at(first), vocab);
            std::printf(
                "probe, decode batch %lld: %s against %s: logits within %.2e (relative L2), argmax %lld / %lld "
                "rows the same\n",
                static_cast<long long>(batch), variants[i].name.c_str(), first.c_str(), a.rel_l2,
                static_cast<long long>(a.argmax_same), static_cast<long long>(a.rows));
            results["agreement"].push_back({{"batch", batch},
                                            {"variant", variants[i].name},
                                            {"against", first},
                                            {"rel_l2", a.rel_l2},
                                            {"argmax_same", a.argmax_same},
                                            {"rows", a.rows}});
        }
    }
    if (!json_path.empty()) std::ofstream(json_path) << results.dump(2) << "\n";
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "step_bench: error: %s\n", e.what());
    return 1;
}
