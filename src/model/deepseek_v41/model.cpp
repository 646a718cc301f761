#include "model/deepseek_v41/model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>

#include "backend/backend.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "model/debug_dump.h"
#include "model/state_sequence.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::dsv41 {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

using V41Sequence =
    StateSequence<DeepseekV41Config, SequenceState, bind_state, truncate_state, copy_progress, kMaxRollback>;

// Indices of the k largest finite values of scores[0..n) (ties to the lower index).
void top_k_finite(const float* scores, int64_t n, int64_t k, std::vector<int32_t>& order, std::vector<int32_t>& out) {
    order.clear();
    for (int64_t i = 0; i < n; ++i)
        if (scores[i] != kNegInf) order.push_back(static_cast<int32_t>(i));
    const auto better = [&](int32_t a, int32_t b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a < b); };
    if (static_cast<int64_t>(order.size()) > k) {
        std::partial_sort(order.begin(), order.begin() + k, order.end(), better);
        order.resize(k);
    }
    out.assign(order.begin(), order.end());
}

}  // namespace

PrefillTruncation PrefillTruncation::from_env() {
    PrefillTruncation t;
    if (const char* mode = std::getenv("DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE"); mode && *mode) {
        const std::string m = mode;
        DI_CHECK(m == "compact" || m == "off", "DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE must be compact or off, not '",
                 m, "'");
        t.mode = m == "compact" ? Mode::kCompact : Mode::kOff;
    }
    if (const char* keep = std::getenv("DEEPINFER_YOCO_PREFILL_KEEP_TOKENS"); keep && *keep) {
        char* end = nullptr;
        const long long v = std::strtoll(keep, &end, 10);
        DI_CHECK(end && *end == '\0' && v > 0, "DEEPINFER_YOCO_PREFILL_KEEP_TOKENS must be a positive integer, not '",
                 keep, "'");
        t.keep_tokens = v;
    }
    return t;
}

// The batch as flat rows (see deepseek_v4/model.cpp); window_floor: the first position whose window row the
// late layers hold for this sequence.
struct DeepseekV41Model::Rows {
    struct Seq {
        SequenceState* state;
        int64_t row0, n, pos0, window_floor;
    };
    int64_t total = 0;
    std::vector<int32_t> tokens, positions;
    std::vector<Seq> seqs;
};

// What index sources hand to the layers after them within one forward: each row's chosen compressed
// entries, and the candidate-source's block mask.
struct DeepseekV41Model::Selections {
    std::vector<std::vector<int32_t>> topk;        // per row: entry indices
    std::vector<std::vector<uint8_t>> candidates;  // per row: kept blocks (empty until the candidate source ran)
};

DeepseekV41Model::DeepseekV41Model(const std::string& dir, const std::string& config_json, Backend& backend,
                                 const LoadOptions& options)
    : config_(parse_deepseek_v41_config(config_json, path_join(dir, "config.json"))),
      checkpoint_(open_checkpoint(dir, options)),
      weights_(load_deepseek_v41_weights(checkpoint_, config_)),
      backend_(backend),
      truncation_(PrefillTruncation::from_env()) {
    DI_CHECK(backend.is_host(), "DeepSeek-V4.1 runs on the CPU backend in this version (device '", backend.name(),
             "' is not supported for it yet)");
    info_.model_type = "deepseek_v41";
    info_.dir = dir;
    info_.vocab_size = config_.vocab_size;
    info_.max_positions = config_.max_positions;
    info_.bos_token_id = config_.bos_token_id;
    info_.eos_token_ids = config_.eos_token_ids;
    info_.weight_bytes = weights_.stored_bytes;
    info_.description = config_.describe();
    state_spec_ = dsv41::state_spec(config_);
    main_inv_freq_ = dsv4::rope_inv_freq(config_.main_rope);
    compress_inv_freq_ = dsv4::rope_inv_freq(config_.compress_rope);
    if (config_.has_vision) DI_LOG(kWarn, dir, ": this checkpoint has a vision tower; DeepInfer loads its text path only (image tokens are rejected)");
    if (!config_.engram.layer_ids.empty()) {
        // Engram hashes a compressed vocabulary built from the checkpoint's own tokenizer.
        const std::string tok_path = path_join(dir, "tokenizer.json");
        DI_CHECK(file_exists(tok_path), dir, ": Engram layers need tokenizer.json to build their token map");
        const Tokenizer tokenizer = Tokenizer::from_file(tok_path);
        DI_CHECK(tokenizer.vocab_size() <= config_.vocab_size, tok_path, ": the tokenizer has ",
                 tokenizer.vocab_size(), " tokens, more than the model's vocab_size ", config_.vocab_size);
        int32_t compressed = 0;
        token_map_ = build_engram_token_map(tokenizer, &compressed);
        DI_CHECK(config_.engram.compressed_vocab_size == 0 || compressed == config_.engram.compressed_vocab_size,
                 tok_path, ": the Engram token map has ", compressed, " compressed ids, config.json says ",
                 config_.engram.compressed_vocab_size);
        DI_CHECK(config_.engram.pad_token_id >= 0 && config_.engram.pad_token_id < static_cast<int>(token_map_.size()),
                 "engram_pad_token_id is outside the tokenizer's vocabulary");
        token_map_.resize(config_.vocab_size, token_map_[config_.engram.pad_token_id]);
        engram_layout_ = make_engram_layout(config_.engram, compressed);
    }
}

std::unique_ptr<ModelSequence> DeepseekV41Model::new_sequence(int64_t max_tokens) {
    return std::make_unique<V41Sequence>(config_, state_spec_, max_tokens, backend_);
}

std::unique_ptr<ModelSequence> DeepseekV41Model::fork_sequence(ModelSequence& src, int64_t max_tokens) {
    return V41Sequence::fork(src, config_, state_spec_, max_tokens, backend_);
}

std::unique_ptr<ModelSequence> DeepseekV41Model::new_sequence(SequenceMemory memory) {
    return std::make_unique<V41Sequence>(config_, state_spec_, std::move(memory));
}

Tensor DeepseekV41Model::forward(std::span<const SequenceInput> batch) {
    const DeepseekV41Config& c = config_;
    Backend& be = backend_;
    const int64_t D = c.hidden_size, n = c.hc_mult;

    // Validate everything before touching any state; decide which sequences truncate their late layers.
    Rows rows;
    std::vector<int64_t> logit_rows, tail(batch.size());
    std::set<const ModelSequence*> seen;
    for (size_t i = 0; i < batch.size(); ++i) {
        const SequenceInput& in = batch[i];
        auto* seq = dynamic_cast<V41Sequence*>(in.seq);
        DI_CHECK(seq, "forward: sequence does not belong to a DeepSeek-V4.1 model");
        DI_CHECK(seen.insert(in.seq).second, "forward: a sequence appears twice in one batch");
        SequenceState& st = seq->state();
        const int64_t len = static_cast<int64_t>(in.tokens.size());
        DI_CHECK(st.num_tokens + len <= st.capacity(), "sequence capacity exceeded: ", st.num_tokens, " + ", len,
                 " tokens > ", st.capacity());
        DI_CHECK(in.logits_from >= 0 && in.logits_from <= len, "forward: logits_from out of range");
        for (int32_t t : in.tokens) {
            DI_CHECK(t >= 0 && t < c.vocab_size, "token id ", t, " is outside the vocabulary [0, ", c.vocab_size, ")");
            DI_CHECK(t != c.image_token_id, "image tokens need the vision tower, which DeepInfer does not load");
        }
        const bool truncate = truncation_.mode == PrefillTruncation::Mode::kCompact &&
                              len > truncation_.keep_tokens && in.logits_from >= len - truncation_.keep_tokens;
        tail[i] = truncate ? truncation_.keep_tokens : len;
        rows.seqs.push_back({&st, rows.total, len, st.num_tokens, st.late_window_floor});
        for (int64_t j = 0; j < len; ++j) {
            rows.tokens.push_back(in.tokens[j]);
            rows.positions.push_back(static_cast<int32_t>(st.num_tokens + j));
            if (j >= in.logits_from) logit_rows.push_back(rows.total + j);
        }
        rows.total += len;
    }
    Tensor logits = Tensor::f32(Shape{static_cast<int64_t>(logit_rows.size()), c.vocab_size});
    if (rows.total == 0) return logits;

    // Engram table rows for every row, from the token history and this chunk.
    const int max_ngram = c.engram.max_ngram;
    std::vector<std::vector<int64_t>> table_rows(c.engram.layer_ids.size());
    if (!c.engram.layer_ids.empty()) {
        const int64_t pad = token_map_[c.engram.pad_token_id];
        for (auto& tr : table_rows) tr.resize(rows.total * engram_layout_.columns);
        std::vector<int64_t> history(max_ngram);
        for (const Rows::Seq& s : rows.seqs) {
            const int64_t ring = s.state->token_history.dim(0);
            for (int64_t t = 0; t < s.n; ++t) {
                const int64_t p = s.pos0 + t;
                const int available = static_cast<int>(std::min<int64_t>(max_ngram, p + 1));
                for (int i = 0; i < available; ++i) {
                    const int64_t q = p - i;
                    const int32_t token = q >= s.pos0 ? rows.tokens[s.row0 + q - s.pos0]
                                                      : static_cast<int32_t>(s.state->token_history.f32()[q % ring]);
                    history[i] = token_map_[token];
                }
                for (size_t e = 0; e < table_rows.size(); ++e)
                    engram_rows(engram_layout_, static_cast<int>(e), history.data(), available, pad,
                                table_rows[e].data() + (s.row0 + t) * engram_layout_.columns);
            }
        }
    }

    int64_t T = rows.total;
    Tensor x = Tensor::f32(Shape{T, D});
    be.embedding(x, weights_.embed, rows.tokens.data());
    Tensor streams = Tensor::f32(Shape{T, n, D}), next = Tensor::f32(Shape{T, n, D});
    for (int64_t r = 0; r < T; ++r)
        for (int64_t j = 0; j < n; ++j) std::memcpy(streams.f32() + (r * n + j) * D, x.f32() + r * D, D * 4);
    // The pre-mix the first attention collapses with: stream 0 alone.
    Tensor pre_in = Tensor::f32(Shape{T, n});
    for (int64_t r = 0; r < T; ++r) pre_in.f32()[r * n] = 1.0f;

    Selections sel;
    sel.topk.resize(T);
    std::vector<int64_t> row_of(T);  // original row -> current row (after truncation), or -1
    std::iota(row_of.begin(), row_of.end(), 0);
    std::vector<int64_t> orig_of(row_of);  // current row -> original row
    const int late_start = c.last_kv_source() + 1;
    auto hc = [&](const HcWeights& w) {
        return HcParams{w.fn.f32(), w.base.f32(), w.scale.f32(), static_cast<int>(n), c.hc_sinkhorn_iters, c.hc_eps,
                        c.rms_eps};
    };
    for (int l = 0; l < c.num_layers; ++l) {
        if (l == late_start) {
            // Prefill truncation: keep only each truncated sequence's last rows from here on.
            bool shrink = false;
            for (size_t i = 0; i < rows.seqs.size(); ++i) shrink |= tail[i] < rows.seqs[i].n;
            if (shrink) {
                Rows kept;
                std::vector<int64_t> keep_rows;
                for (size_t i = 0; i < rows.seqs.size(); ++i) {
                    const Rows::Seq& s = rows.seqs[i];
                    const int64_t drop = s.n - tail[i];
                    kept.seqs.push_back({s.state, kept.total, tail[i], s.pos0 + drop,
                                         drop > 0 ? s.pos0 + drop : s.window_floor});
                    for (int64_t j = drop; j < s.n; ++j) {
                        keep_rows.push_back(s.row0 + j);
                        kept.tokens.push_back(rows.tokens[s.row0 + j]);
                        kept.positions.push_back(rows.positions[s.row0 + j]);
                    }
                    kept.total += tail[i];
                }
                const int64_t K = kept.total;
                Tensor s2 = Tensor::f32(Shape{K, n, D}), p2 = Tensor::f32(Shape{K, n});
                Selections sel2;
                std::fill(row_of.begin(), row_of.end(), -1);
                for (int64_t k = 0; k < K; ++k) {
                    std::memcpy(s2.f32() + k * n * D, streams.f32() + keep_rows[k] * n * D, n * D * 4);
                    std::memcpy(p2.f32() + k * n, pre_in.f32() + keep_rows[k] * n, n * 4);
                    sel2.topk.push_back(std::move(sel.topk[keep_rows[k]]));
                    if (!sel.candidates.empty()) sel2.candidates.push_back(std::move(sel.candidates[keep_rows[k]]));
                    row_of[keep_rows[k]] = k;
                }
                orig_of = keep_rows;
                rows = std::move(kept);
                streams = std::move(s2);
                pre_in = std::move(p2);
                sel = std::move(sel2);
                T = K;
                next = Tensor::f32(Shape{T, n, D});
                x = Tensor::f32(Shape{T, D});
            }
        }
        const LayerWeights& L = weights_.layers[l];
        if (L.has_engram) {
            const auto it = std::find(c.engram.layer_ids.begin(), c.engram.layer_ids.end(), l);
            const std::vector<int64_t>& all = table_rows[it - c.engram.layer_ids.begin()];
            const int64_t cols = engram_layout_.columns;
            std::vector<int64_t> current(T * cols);
            for (int64_t r = 0; r < T; ++r)
                std::copy_n(all.begin() + orig_of[r] * cols, cols, current.begin() + r * cols);
            engram(l, current, streams);
        }
        Tensor pre_a = Tensor::f32(Shape{T, n}), post = Tensor::f32(Shape{T, n}), comb = Tensor::f32(Shape{T, n, n});
        Tensor xn = Tensor::f32(Shape{T, D}), y = Tensor::f32(Shape{T, D});
        // Attention collapses with the previous sublayer's pre; its own pre serves the FFN.
        be.hc_mix(pre_a, post, comb, streams, hc(L.hc_attn));
        be.hc_collapse(x, streams, pre_in);
        be.rms_norm(xn, x, L.attn_norm.f32(), c.rms_eps);
        attention(l, rows, xn, y, sel);
        debug_dump("l" + std::to_string(l) + ".attn", y);
        be.hc_post(next, y, post, comb, streams);
        std::swap(streams, next);

        Tensor pre_f = Tensor::f32(Shape{T, n});
        be.hc_mix(pre_f, post, comb, streams, hc(L.hc_ffn));
        be.hc_collapse(x, streams, pre_a);
        be.rms_norm(xn, x, L.ffn_norm.f32(), c.rms_eps);
        moe_forward(be, L.moe, c.moe, xn, TensorView(rows.tokens.data(), DType::kI32, Shape{static_cast<int64_t>(rows.tokens.size())}), y);
        debug_dump("l" + std::to_string(l) + ".mlp", y);
        be.hc_post(next, y, post, comb, streams);
        std::swap(streams, next);
        pre_in = std::move(pre_f);
    }
    last_late_rows_ = T;

    // Head: collapse with the last FFN's pre, norm, project the requested rows.
    be.hc_collapse(x, streams, pre_in);
    Tensor selected = Tensor::f32(Shape{static_cast<int64_t>(logit_rows.size()), D});
    for (size_t i = 0; i < logit_rows.size(); ++i) {
        const int64_t r = row_of[logit_rows[i]];
        DI_ICHECK(r >= 0, "a requested logit row was truncated");
        std::memcpy(selected.f32() + i * D, x.f32() + r * D, D * 4);
    }
    be.rms_norm(selected, selected, weights_.norm.f32(), c.rms_eps);
    be.linear(logits, selected, weights_.head);

    for (size_t i = 0; i < batch.size(); ++i) {
        SequenceState& st = *rows.seqs[i].state;
        const int64_t len = static_cast<int64_t>(batch[i].tokens.size());
        if (!st.token_history.empty()) {
            const int64_t ring = st.token_history.dim(0);
            for (int64_t j = std::max<int64_t>(0, len - ring); j < len; ++j)
                st.token_history.f32()[(st.num_tokens + j) % ring] = static_cast<float>(batch[i].tokens[j]);
        }
        st.late_window_floor = rows.seqs[i].window_floor;
        st.num_tokens += len;
    }
    return logits;
}

// Engram: the n-gram table rows of every row (table_rows [T, columns]) gated into each mHC stream.
void DeepseekV41Model::engram(int layer, const std::vector<int64_t>& table_rows, Tensor& streams) {
    const DeepseekV41Config& c = config_;
    const EngramWeights& w = weights_.layers[layer].engram;
    const int64_t T = streams.dim(0), n = c.hc_mult, D = c.hidden_size, cols = engram_layout_.columns,
                  hd = c.engram.head_dim;
    Tensor fetched = Tensor::f32(Shape{T, cols * hd});  // [T, columns * head_dim]
    for (int64_t i = 0; i < T * cols; ++i)
        dequantize_rows(w.table, table_rows[i], table_rows[i] + 1, fetched.f32() + i * hd);
    Tensor kv = Tensor::f32(Shape{T, (n + 1) * D});
    backend_.linear(kv, fetched, w.wkv);
    const float inv_sqrt_d = 1.0f / std::sqrt(static_cast<float>(D));
    const float eps = c.rms_eps;
    backend_.pool().parallel_for(T, 4, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
            const float* value = kv.f32() + r * (n + 1) * D + n * D;
            for (int64_t j = 0; j < n; ++j) {
                float* h = streams.f32() + (r * n + j) * D;
                const float* key = kv.f32() + r * (n + 1) * D + j * D;
                const float* qk = w.qk_weight.f32() + j * D;
                float hh = 0, kk = 0, dot = 0;
                for (int64_t d = 0; d < D; ++d) {
                    hh += h[d] * h[d];
                    kk += key[d] * key[d];
                    dot += h[d] * qk[d] * key[d];
                }
                const float rstd = (1.0f / std::sqrt(hh / static_cast<float>(D) + eps)) *
                                   (1.0f / std::sqrt(kk / static_cast<float>(D) + eps));
                dot = dot * rstd * inv_sqrt_d;
                const float mag = std::sqrt(std::max(std::fabs(dot), 1e-6f));
                const float gate = 1.0f / (1.0f + std::exp(dot < 0 ? mag : -mag));
                for (int64_t d = 0; d < D; ++d) h[d] += gate * value[d];
            }
        }
    });
}

// Latents (pre-RoPE) of the groups that close in this chunk for one sequence of a kv-source layer;
// `latent_rows` holds the layer's per-row projections ([T, 2d]: kv | score for ratio 2, [T, d] for ratio 1).
void DeepseekV41Model::compress(int layer, const Rows& rows, size_t seq, TensorView latent_rows,
                                std::vector<int32_t>* groups, Tensor* latents) {
    const DeepseekV41Config& c = config_;
    const Rows::Seq& s = rows.seqs[seq];
    const LayerWeights& L = weights_.layers[layer];
    const int64_t ratio = c.compress_ratio[layer], d = c.head_dim, p0 = s.pos0, end = s.pos0 + s.n;
    const int64_t first = p0 / ratio, last = end / ratio;
    groups->clear();
    for (int64_t g = first; g < last; ++g) groups->push_back(static_cast<int32_t>(g));
    *latents = Tensor::f32(Shape{last - first, 1, d});
    if (ratio == 1) {
        std::memcpy(latents->f32(), latent_rows.f32() + s.row0 * d, s.n * d * 4);
        return;  // already normalised per row
    }
    // Ratio 2: pool each group's rows with a softmax gate; inputs of earlier chunks come from the ring.
    const TensorView ring = s.state->layers[layer].compressor_inputs;
    const int64_t ring_rows = ring.dim(0), width = 2 * d;
    auto row_at = [&](int64_t pos) {
        return pos >= p0 ? latent_rows.f32() + (s.row0 + pos - p0) * width : ring.f32() + (pos % ring_rows) * width;
    };
    if (last > first) {
        Tensor kv = Tensor::f32(Shape{last - first, ratio, d}), gate = Tensor::f32(Shape{last - first, ratio, d});
        for (int64_t g = first; g < last; ++g)
            for (int64_t j = 0; j < ratio; ++j) {
                const float* src = row_at(g * ratio + j);
                std::memcpy(kv.f32() + ((g - first) * ratio + j) * d, src, d * 4);
                std::memcpy(gate.f32() + ((g - first) * ratio + j) * d, src + d, d * 4);
            }
        backend_.gated_pool(*latents, kv, gate);
        backend_.rms_norm(*latents, *latents, L.compressor_norm.f32(), c.rms_eps);
    }
    for (int64_t pos = std::max(p0, end - ring_rows); pos < end; ++pos)
        std::memcpy(ring.f32() + (pos % ring_rows) * width, latent_rows.f32() + (s.row0 + pos - p0) * width, width * 4);
}

// Lightning indexer of an index-source layer: each row's top-k compressed entries (two-level when a
// candidate source precedes it), written into sel.topk.
void DeepseekV41Model::select(int layer, const Rows& rows, TensorView cq, TensorView xn, Selections& sel) {
    const DeepseekV41Config& c = config_;
    Backend& be = backend_;
    const LayerWeights& L = weights_.layers[layer];
    const int64_t T = rows.total, hi = c.index_heads, di = c.index_head_dim, ratio = c.compress_ratio[layer];
    const bool candidate_source = layer == c.candidate_source;
    const bool use_candidates = c.candidate_source >= 0 && c.candidate_source < layer;
    const int64_t bs = c.candidate_block_size;

    Tensor q = Tensor::f32(Shape{T, hi, di});
    be.linear(q.view().reshape(Shape{T, hi * di}), cq, L.index_wq_b);
    be.rope(q, rows.positions.data(), compress_inv_freq_.data(), c.compress_rope.dim,
            static_cast<float>(c.compress_rope.attention_factor), false);
    be.fake_quantize(q, QuantSim::kFp4Ue8m0, 32);
    Tensor w = Tensor::f32(Shape{T, hi});
    be.linear(w, xn, L.index_weights_proj);
    const float scale = 1.0f / (std::sqrt(static_cast<float>(di)) * std::sqrt(static_cast<float>(hi)));
    for (int64_t i = 0; i < T * hi; ++i) w.f32()[i] *= scale;
    if (candidate_source) sel.candidates.assign(T, {});

    std::vector<int32_t> order;
    for (const Rows::Seq& s : rows.seqs) {
        const int64_t nb = (s.pos0 + s.n) / ratio;
        if (nb == 0) {
            for (int64_t t = 0; t < s.n; ++t) sel.topk[s.row0 + t].clear();
            continue;
        }
        const PagedRows& keys_src = *s.state->layers[c.key_owner[layer]].index_keys;
        Tensor keys = Tensor::f32(Shape{nb, di});
        for (int64_t e = 0; e < nb; ++e) std::memcpy(keys.f32() + e * di, keys_src.row(e), di * 4);
        Tensor scores = Tensor::f32(Shape{s.n, nb});
        be.indexer_scores(scores, q.view().slice_rows(s.row0, s.row0 + s.n), keys,
                          w.view().slice_rows(s.row0, s.row0 + s.n), 1.0f);
        for (int64_t t = 0; t < s.n; ++t) {
            float* sc = scores.f32() + t * nb;
            const int64_t visible = (s.pos0 + t + 1) / ratio;
            for (int64_t e = visible; e < nb; ++e) sc[e] = kNegInf;
            const int64_t row = s.row0 + t;
            if (candidate_source) {
                // Level one: blocks of `bs` entries scored by their best entry; the block holding the newest
                // visible entry is always kept.
                const int64_t blocks = (nb + bs - 1) / bs;
                std::vector<float> best(blocks, kNegInf);
                for (int64_t e = 0; e < nb; ++e) best[e / bs] = std::max(best[e / bs], sc[e]);
                if (visible > 0) best[(visible - 1) / bs] = std::numeric_limits<float>::infinity();
                std::vector<int32_t> kept;
                top_k_finite(best.data(), blocks, std::min<int64_t>(c.candidate_topk_blocks, blocks), order, kept);
                sel.candidates[row].assign(blocks, 0);
                for (int32_t b : kept) sel.candidates[row][b] = 1;
            } else if (use_candidates && !sel.candidates.empty() && !sel.candidates[row].empty()) {
                const std::vector<uint8_t>& keep = sel.candidates[row];
                for (int64_t e = 0; e < nb; ++e)
                    if (e / bs >= static_cast<int64_t>(keep.size()) || !keep[e / bs]) sc[e] = kNegInf;
            }
            top_k_finite(sc, nb, std::min<int64_t>(c.index_topk, nb), order, sel.topk[row]);
        }
    }
    if (debug_dump_enabled()) {
        std::vector<int32_t> picks;
        for (int64_t r = 0; r < T; ++r) {
            std::vector<int32_t> p = sel.topk[r];
            std::sort(p.begin(), p.end());
            p.resize(c.index_topk, -1);
            picks.insert(picks.end(), p.begin(), p.end());
        }
        debug_dump("l" + std::to_string(layer) + ".topk", picks, c.index_topk);
    }
}

void DeepseekV41Model::attention(int layer, const Rows& rows, TensorView xn, TensorView out, Selections& sel) {
    const DeepseekV41Config& c = config_;
    Backend& be = backend_;
    const LayerWeights& L = weights_.layers[layer];
    const int64_t T = rows.total, H = c.num_heads, d = c.head_dim, W = c.window, ratio = c.compress_ratio[layer];
    const RopeSpec& rope = c.rope_for_layer(layer);
    const float* inv_freq = ratio ? compress_inv_freq_.data() : main_inv_freq_.data();
    const float af = static_cast<float>(rope.attention_factor);
    const int32_t* pos = rows.positions.data();
    const bool late = layer > c.last_kv_source();

    // Queries (no per-head normalisation in V4.1) and the window K=V row, simulated FP8 over all dims.
    Tensor cq = Tensor::f32(Shape{T, c.q_lora_rank});
    be.linear(cq, xn, L.wq_a);
    be.rms_norm(cq, cq, L.q_norm.f32(), c.rms_eps);
    Tensor q = Tensor::f32(Shape{T, H, d});
    be.linear(q.view().reshape(Shape{T, H * d}), cq, L.wq_b);
    be.rope(q, pos, inv_freq, rope.dim, af, false);
    Tensor kv = Tensor::f32(Shape{T, 1, d});
    be.linear(kv.view().reshape(Shape{T, d}), xn, L.wkv);
    be.rms_norm(kv, kv, L.kv_norm.f32(), c.rms_eps);
    be.rope(kv, pos, inv_freq, rope.dim, af, false);
    be.fake_quantize(kv, QuantSim::kFp8Ue8m0, 32);

    if (ratio && c.is_kv_source(layer)) {
        // The compressor's latents feed the index keys (pre-RoPE) and, rotated and FP4-simulated, the cache.
        Tensor proj;
        if (ratio == 1) {
            proj = Tensor::f32(Shape{T, d});
            be.linear(proj, xn, L.compressor_wkv);
            be.rms_norm(proj, proj, L.compressor_norm.f32(), c.rms_eps);
        } else {
            Tensor kvp = Tensor::f32(Shape{T, d}), score = Tensor::f32(Shape{T, d});
            be.linear(kvp, xn, L.compressor_wkv);
            be.linear(score, xn, L.compressor_wgate);
            proj = Tensor::f32(Shape{T, 2 * d});
            for (int64_t r = 0; r < T; ++r) {
                std::memcpy(proj.f32() + r * 2 * d, kvp.f32() + r * d, d * 4);
                std::memcpy(proj.f32() + r * 2 * d + d, score.f32() + r * d, d * 4);
            }
        }
        std::vector<int32_t> groups, group_pos;
        for (size_t si = 0; si < rows.seqs.size(); ++si) {
            Tensor latents;
            compress(layer, rows, si, proj, &groups, &latents);
            if (groups.empty()) continue;
            const int64_t g = static_cast<int64_t>(groups.size());
            group_pos.resize(g);
            for (int64_t i = 0; i < g; ++i) group_pos[i] = static_cast<int32_t>(groups[i] * ratio);
            LayerState& st = rows.seqs[si].state->layers[layer];
            Tensor keys = Tensor::f32(Shape{g, 1, c.index_head_dim});
            be.linear(keys.view().reshape(Shape{g, c.index_head_dim}), latents.view().reshape(Shape{g, d}), L.index_wk);
            be.rms_norm(keys, keys, L.index_k_norm.f32(), c.rms_eps);
            be.rope(keys, group_pos.data(), compress_inv_freq_.data(), c.compress_rope.dim, af, false);
            be.fake_quantize(keys, QuantSim::kFp4Ue8m0, 32);
            be.rope(latents, group_pos.data(), compress_inv_freq_.data(), c.compress_rope.dim, af, false);
            be.fake_quantize(latents, QuantSim::kFp4E4m3, 16);
            for (int64_t i = 0; i < g; ++i) {
                std::memcpy(st.index_keys->row(groups[i]), keys.f32() + i * c.index_head_dim, c.index_head_dim * 4);
                std::memcpy(st.compressed->row(groups[i]), latents.f32() + i * d, d * 4);
            }
        }
    }
    if (ratio && c.is_index_source(layer)) select(layer, rows, cq, xn, sel);

    Tensor o = Tensor::f32(Shape{T, H, d});
    for (const Rows::Seq& s : rows.seqs) {
        if (s.n == 0) continue;
        LayerState& st = s.state->layers[layer];
        const int64_t p0 = s.pos0, end = s.pos0 + s.n;
        // Key table: window rows before the chunk (from the late-layer floor on), the chunk's rows, then the
        // kv source's compressed entries.
        const int64_t floor = late ? s.window_floor : 0;
        const int64_t first_prev = std::max<int64_t>(std::max<int64_t>(0, p0 - (W - 1)), floor);
        const int64_t prev = p0 - first_prev;
        const int64_t entries = ratio ? end / ratio : 0;
        Tensor keys = Tensor::f32(Shape{prev + s.n + entries, d});
        const int64_t ring = st.window.dim(0);
        for (int64_t p = first_prev; p < p0; ++p)
            std::memcpy(keys.f32() + (p - first_prev) * d, st.window.f32() + (p % ring) * d, d * 4);
        std::memcpy(keys.f32() + prev * d, kv.f32() + s.row0 * d, s.n * d * 4);
        if (entries) {
            const PagedRows& src = *s.state->layers[c.kv_source[layer]].compressed;
            for (int64_t e = 0; e < entries; ++e) std::memcpy(keys.f32() + (prev + s.n + e) * d, src.row(e), d * 4);
        }
        std::vector<int32_t> offsets(s.n + 1, 0), indices;
        for (int64_t t = 0; t < s.n; ++t) {
            const int64_t p = p0 + t;
            for (int64_t kp = std::max(std::max<int64_t>(0, p - W + 1), std::max(floor, first_prev)); kp <= p; ++kp)
                indices.push_back(static_cast<int32_t>(kp < p0 ? kp - first_prev : prev + kp - p0));
            if (ratio)
                for (int32_t e : sel.topk[s.row0 + t]) indices.push_back(static_cast<int32_t>(prev + s.n + e));
            offsets[t + 1] = static_cast<int32_t>(indices.size());
        }
        be.sparse_attention(o.view().slice_rows(s.row0, s.row0 + s.n), q.view().slice_rows(s.row0, s.row0 + s.n), keys,
                            offsets.data(), indices.data(), L.attn_sink.f32(), 1.0f / std::sqrt(static_cast<float>(d)));
        for (int64_t p = std::max(p0, end - ring); p < end; ++p)
            std::memcpy(st.window.f32() + (p % ring) * d, kv.f32() + (s.row0 + p - p0) * d, d * 4);
    }

    be.rope(o, pos, inv_freq, rope.dim, af, true);
    Tensor z = Tensor::f32(Shape{T, static_cast<int64_t>(c.o_groups) * c.o_lora_rank});
    be.grouped_linear(z, o.view().reshape(Shape{T, H * d}), L.wo_a, c.o_groups);
    be.linear(out, z, L.wo_b);
}

}  // namespace deepinfer::dsv41
