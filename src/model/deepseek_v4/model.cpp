#include "model/deepseek_v4/model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>

#include "backend/backend.h"
#include "core/thread_pool.h"
#include "model/debug_dump.h"
#include "model/moe.h"
#include "model/state_sequence.h"
#include "model/step_arrays.h"

namespace deepinfer::dsv4 {

namespace {

// A DeepSeek-V4 sequence: its state over memory it owns or memory a KV manager gave it.
using V4Sequence =
    StateSequence<DeepseekV4Config, SequenceState, bind_state, truncate_state, copy_progress, kMaxRollback>;

// Intermediates for DEEPINFER_DEBUG_DUMP (copied to the host first).
void dump(Backend& be, const std::string& name, TensorView t) {
    if (debug_dump_enabled()) debug_dump(name, to_host(be, t));
}

// The indexer's choices per query of a CSA layer for DEEPINFER_DEBUG_DUMP: entry numbers in entry order,
// -1 padded to index_topk. key_list: the attention key lists on the host; starts[t]: where row t's entries begin.
void dump_indexer_picks(int layer, const Tensor& key_list, const std::vector<int32_t>& offsets,
                        const std::vector<int32_t>& starts, int32_t base, int topk) {
    const int32_t* list = key_list.view().as<int32_t>();
    std::vector<int32_t> picks;
    for (size_t t = 0; t < starts.size(); ++t) {
        int n = 0;
        for (int32_t i = starts[t]; i < offsets[t + 1]; ++i, ++n) picks.push_back(list[i] - base);
        for (; n < topk; ++n) picks.push_back(-1);
    }
    debug_dump("l" + std::to_string(layer) + ".indexer", picks, topk);
}

}  // namespace

// The batch as flat rows: row r belongs to one sequence at absolute position positions[r].
struct DeepseekV4Model::Rows {
    struct Seq {
        SequenceState* state;
        int64_t row0, n, pos0;  // rows [row0, row0 + n) hold positions [pos0, pos0 + n)
    };
    int64_t total = 0;
    std::vector<int32_t> tokens, positions;  // host copies
    TensorView positions_d, tokens_d;        // [T] I32, backend memory
    std::vector<Seq> seqs;
};

DeepseekV4Model::DeepseekV4Model(const std::string& dir, const std::string& config_json, Backend& backend,
                                 const LoadOptions& options)
    : config_(parse_deepseek_v4_config(config_json, path_join(dir, "config.json"))),
      checkpoint_(open_checkpoint(dir, options)),
      weights_(load_deepseek_v4_weights(checkpoint_, config_)),
      backend_(backend) {
    info_.model_type = "deepseek_v4";
    info_.dir = dir;
    info_.vocab_size = config_.vocab_size;
    info_.max_positions = config_.max_positions;
    info_.bos_token_id = config_.bos_token_id;
    info_.eos_token_ids = config_.eos_token_ids;
    info_.weight_bytes = weights_.stored_bytes;
    info_.description = config_.describe();
    state_spec_ = dsv4::state_spec(config_);
    for (int l = 0; l < config_.num_layers; ++l) moe_params_.push_back(moe_params(config_, l));
    const std::vector<float> main = rope_inv_freq(config_.main_rope), compress = rope_inv_freq(config_.compress_rope);
    main_inv_freq_ = to_backend(backend_, TensorView(const_cast<float*>(main.data()), DType::kF32,
                                                    Shape{static_cast<int64_t>(main.size())}));
    compress_inv_freq_ = to_backend(backend_, TensorView(const_cast<float*>(compress.data()), DType::kF32,
                                                        Shape{static_cast<int64_t>(compress.size())}));
    weights_to_backend(backend_, weights_, &device_weights_);
    // Constant rows for the compressor's empty slots: value 0, gate -inf.
    const int64_t width = std::max(2 * config_.head_dim, 2 * config_.index_head_dim);
    std::vector<float> zeros(width, 0.0f), neg_inf(width, -std::numeric_limits<float>::infinity());
    zero_row_ = backend_.alloc(DType::kF32, Shape{width});
    neg_inf_row_ = backend_.alloc(DType::kF32, Shape{width});
    backend_.upload(zero_row_, zeros.data());
    backend_.upload(neg_inf_row_, neg_inf.data());
}

std::unique_ptr<ModelSequence> DeepseekV4Model::new_sequence(int64_t max_tokens) {
    return std::make_unique<V4Sequence>(config_, state_spec_, max_tokens, backend_);
}

std::unique_ptr<ModelSequence> DeepseekV4Model::fork_sequence(ModelSequence& src, int64_t max_tokens) {
    return V4Sequence::fork(src, config_, state_spec_, max_tokens, backend_);
}

std::unique_ptr<ModelSequence> DeepseekV4Model::new_sequence(SequenceMemory memory) {
    return std::make_unique<V4Sequence>(config_, state_spec_, std::move(memory));
}

Tensor DeepseekV4Model::forward(std::span<const SequenceInput> batch) { return forward_sequences(batch, false); }

Tensor DeepseekV4Model::forward_on_backend(std::span<const SequenceInput> batch) {
    return forward_sequences(batch, true);
}

Tensor DeepseekV4Model::forward_sequences(std::span<const SequenceInput> batch, bool on_backend) {
    std::vector<StateInput> states;
    for (const SequenceInput& in : batch) {
        auto* seq = dynamic_cast<V4Sequence*>(in.seq);
        DI_CHECK(seq, "forward: sequence does not belong to a DeepSeek-V4 model");
        states.push_back({&seq->state(), in.tokens, in.logits_from});
    }
    return forward_states(states, on_backend);
}

Tensor DeepseekV4Model::forward_states(std::span<const StateInput> batch, bool on_backend) {
    const DeepseekV4Config& c = config_;
    Backend& be = backend_;
    const int64_t D = c.hidden_size, n = c.hc_mult;

    // Validate everything before touching any state.
    Rows rows;
    std::vector<int64_t> logit_rows;
    std::set<const SequenceState*> seen;
    for (const StateInput& in : batch) {
        DI_CHECK(in.state && seen.insert(in.state).second, "forward: a sequence appears twice in one batch");
        const int64_t len = static_cast<int64_t>(in.tokens.size());
        DI_CHECK(in.state->num_tokens + len <= in.state->capacity(), "sequence capacity exceeded: ",
                 in.state->num_tokens, " + ", len, " tokens > ", in.state->capacity());
        DI_CHECK(in.state->layers.size() == static_cast<size_t>(c.num_layers), "forward: state has ",
                 in.state->layers.size(), " layers, model has ", c.num_layers);
        DI_CHECK(in.logits_from >= 0 && in.logits_from <= len, "forward: logits_from out of range");
        for (int32_t t : in.tokens)
            DI_CHECK(t >= 0 && t < c.vocab_size, "token id ", t, " is outside the vocabulary [0, ", c.vocab_size, ")");
        rows.seqs.push_back({in.state, rows.total, len, in.state->num_tokens});
        for (int64_t i = 0; i < len; ++i) {
            rows.tokens.push_back(in.tokens[i]);
            rows.positions.push_back(static_cast<int32_t>(in.state->num_tokens + i));
            if (i >= in.logits_from) logit_rows.push_back(rows.total + i);
        }
        rows.total += len;
    }
    const int64_t T = rows.total;
    const int64_t R = static_cast<int64_t>(logit_rows.size());
    if (T == 0) return Tensor::f32(Shape{R, c.vocab_size});
    StepArrays arrays(be);
    rows.positions_d = arrays.i32(rows.positions);
    rows.tokens_d = arrays.i32(rows.tokens);

    // Residual streams [T, n, D]: the embedding copied into every stream.
    Tensor x = be.alloc(DType::kF32, Shape{T, D});
    be.embedding(x, weights_.embed, rows.tokens_d.as<int32_t>());
    Tensor streams = be.alloc(DType::kF32, Shape{T, n, D}), next = be.alloc(DType::kF32, Shape{T, n, D});
    std::vector<float*> copies(T * n);
    for (int64_t r = 0; r < T; ++r)
        for (int64_t j = 0; j < n; ++j) copies[r * n + j] = x.f32() + r * D;
    be.gather_rows(streams.view().reshape(Shape{T * n, D}), arrays.rows(copies));

    Tensor post = be.alloc(DType::kF32, Shape{T, n}), comb = be.alloc(DType::kF32, Shape{T, n, n});
    Tensor xn = be.alloc(DType::kF32, Shape{T, D}), y = be.alloc(DType::kF32, Shape{T, D});
    auto hc = [&](const HcWeights& w) {
        return HcParams{w.fn.f32(), w.base.f32(), w.scale.f32(), static_cast<int>(n), c.hc_sinkhorn_iters, c.hc_eps,
                        c.rms_eps};
    };
    // One sublayer wrapped in mHC: collapse the streams, norm, run, expand back into the streams.
    auto sublayer = [&](const HcWeights& hc_w, const Tensor& norm, const std::string& name, auto&& body) {
        be.hc_pre(x, post, comb, streams, hc(hc_w));
        be.rms_norm(xn, x, norm.f32(), c.rms_eps);
        body(xn.view(), y.view());
        dump(be, name, y);
        be.hc_post(next, y, post, comb, streams);
        std::swap(streams, next);
    };
    for (int l = 0; l < c.num_layers; ++l) {
        const LayerWeights& L = weights_.layers[l];
        const std::string tag = "l" + std::to_string(l);
        sublayer(L.hc_attn, L.attn_norm, tag + ".attn", [&](TensorView in, TensorView out) { attention(l, rows, in, out); });
        sublayer(L.hc_ffn, L.ffn_norm, tag + ".mlp", [&](TensorView in, TensorView out) {
            moe_forward(be, L.moe, moe_params_[l], in, rows.tokens_d, out);
        });
        dump(be, "hidden." + std::to_string(l + 1), streams);
    }
    for (Rows::Seq& s : rows.seqs) s.state->num_tokens += s.n;

    // Head: collapse the streams, norm, project the requested rows.
    be.hc_head(x, streams, hc(weights_.hc_head));
    Tensor selected = be.alloc(DType::kF32, Shape{R, D});
    std::vector<float*> picked(R);
    for (int64_t i = 0; i < R; ++i) picked[i] = x.f32() + logit_rows[i] * D;
    be.gather_rows(selected, arrays.rows(picked));
    be.rms_norm(selected, selected, weights_.norm.f32(), c.rms_eps);
    Tensor logits = be.alloc(DType::kF32, Shape{R, c.vocab_size});
    be.linear(logits, selected, weights_.head);
    return be.is_host() || on_backend ? std::move(logits) : to_host(be, logits);
}

// Emits the compressed entries whose windows close inside this chunk, then stores the chunk's projections
// in the ring. kv, gate: [T, width] projections of all rows (this sequence's rows are used).
void DeepseekV4Model::compress(int layer, const Rows& rows, size_t seq, bool indexer, TensorView kv, TensorView gate,
                               StepArrays& arrays) {
    const DeepseekV4Config& c = config_;
    Backend& be = backend_;
    const Rows::Seq& s = rows.seqs[seq];
    const LayerWeights& L = weights_.layers[layer];
    const CompressorWeights& w = indexer ? L.indexer.compressor : L.compressor;
    CompressorState& st = indexer ? s.state->layers[layer].indexer : s.state->layers[layer].compressor;
    const bool overlap = c.attn[layer] == AttnKind::kCsa;
    const int64_t m = c.compress_ratio[layer];
    const int64_t cdim = indexer ? c.index_head_dim : c.head_dim;
    const int64_t width = overlap ? 2 * cdim : cdim;
    const int64_t ring = st.rows.dim(0);
    const int64_t p0 = s.pos0, end = s.pos0 + s.n;
    float* ring_rows = st.rows.f32();  // [ring, 2 * width]: kv then gate
    // Address of a position's kv (gate) projection: this chunk's rows, or the ring for earlier positions.
    auto kv_at = [&](int64_t pos) {
        return pos >= p0 ? kv.f32() + (s.row0 + pos - p0) * width : ring_rows + (pos % ring) * 2 * width;
    };
    auto gate_at = [&](int64_t pos) {
        return pos >= p0 ? gate.f32() + (s.row0 + pos - p0) * width : ring_rows + (pos % ring) * 2 * width + width;
    };

    const int64_t first = p0 / m, last = end / m;  // new entries [first, last)
    if (last > first) {
        const int64_t count = last - first, slots = overlap ? 2 * m : m;
        std::vector<float*> kv_src, gate_src, ape_src;
        std::vector<int32_t> entry_pos(count);
        for (int64_t e = 0; e < count; ++e) {
            const int64_t win = first + e;
            entry_pos[e] = static_cast<int32_t>(win * m);
            for (int64_t slot = 0; slot < slots; ++slot) {
                // CSA: slots [0, m) pool the previous window's first series (Ca), [m, 2m) the current
                // window's second (Cb); HCA: the current window's only series.
                const bool previous = overlap && slot < m;
                const int64_t j = previous ? slot : slot - (overlap ? m : 0);
                const int64_t off = overlap && !previous ? cdim : 0;
                if (previous && win == 0) {  // no window before the first: empty slots
                    kv_src.push_back(zero_row_.f32());
                    gate_src.push_back(neg_inf_row_.f32());
                } else {
                    const int64_t pos = (previous ? win - 1 : win) * m + j;
                    kv_src.push_back(kv_at(pos) + off);
                    gate_src.push_back(gate_at(pos) + off);
                }
                ape_src.push_back(w.ape.f32() + j * width + off);
            }
        }
        const Shape slot_shape{count, slots, cdim};
        Tensor slot_kv = be.alloc(DType::kF32, slot_shape), slot_gate = be.alloc(DType::kF32, slot_shape),
               slot_ape = be.alloc(DType::kF32, slot_shape);
        be.gather_rows(slot_kv, arrays.rows(kv_src));
        be.gather_rows(slot_gate, arrays.rows(gate_src));
        be.gather_rows(slot_ape, arrays.rows(ape_src));
        be.add(slot_gate, slot_ape);
        Tensor pooled = be.alloc(DType::kF32, Shape{count, 1, cdim});
        be.gated_pool(pooled, slot_kv, slot_gate);
        be.rms_norm(pooled, pooled, w.norm.f32(), c.rms_eps);
        be.rope(pooled, arrays.i32(entry_pos).as<int32_t>(), compress_inv_freq_.f32(), c.compress_rope.dim,
                static_cast<float>(c.compress_rope.attention_factor), false);
        std::vector<float*> dst(count);
        for (int64_t e = 0; e < count; ++e) dst[e] = st.entries->row(first + e);
        be.scatter_rows(arrays.rows(dst), pooled);
    }
    // Keep the last `ring` positions' projections for later chunks.
    std::vector<float*> kv_dst, gate_dst;
    for (int64_t pos = std::max(p0, end - ring); pos < end; ++pos) {
        kv_dst.push_back(ring_rows + (pos % ring) * 2 * width);
        gate_dst.push_back(ring_rows + (pos % ring) * 2 * width + width);
    }
    if (kv_dst.empty()) return;
    const int64_t keep = static_cast<int64_t>(kv_dst.size()), from = s.row0 + s.n - keep;
    be.scatter_rows(arrays.rows(kv_dst), kv.slice_rows(from, from + keep));
    be.scatter_rows(arrays.rows(gate_dst), gate.slice_rows(from, from + keep));
}

void DeepseekV4Model::attention(int layer, const Rows& rows, TensorView xn, TensorView out) {
    const DeepseekV4Config& c = config_;
    Backend& be = backend_;
    StepArrays arrays(be);
    const LayerWeights& L = weights_.layers[layer];
    const AttnKind kind = c.attn[layer];
    const RopeSpec& rope = c.rope_for_layer(layer);
    const float* inv_freq = kind == AttnKind::kSliding ? main_inv_freq_.f32() : compress_inv_freq_.f32();
    const float af = static_cast<float>(rope.attention_factor);
    const int64_t T = rows.total, H = c.num_heads, d = c.head_dim, W = c.window;
    const int32_t* pos = rows.positions_d.as<int32_t>();
    auto alloc = [&](Shape s) { return be.alloc(DType::kF32, s); };

    // Queries: low-rank, per-head unweighted RMS, RoPE on the last dims.
    Tensor cq = alloc(Shape{T, c.q_lora_rank});
    be.linear(cq, xn, L.wq_a);
    be.rms_norm(cq, cq, L.q_norm.f32(), c.rms_eps);
    Tensor q = alloc(Shape{T, H, d});
    be.linear(q.view().reshape(Shape{T, H * d}), cq, L.wq_b);
    be.rms_norm(q, q, nullptr, c.rms_eps);
    be.rope(q, pos, inv_freq, rope.dim, af, false);
    // The single K=V head.
    Tensor kv = alloc(Shape{T, 1, d});
    be.linear(kv.view().reshape(Shape{T, d}), xn, L.wkv);
    be.rms_norm(kv, kv, L.kv_norm.f32(), c.rms_eps);
    be.rope(kv, pos, inv_freq, rope.dim, af, false);

    Tensor ckv, cgate, ikv, igate, iq, iw;
    if (L.has_compressor) {
        const int64_t width = c.compressor_width(layer);
        ckv = alloc(Shape{T, width});
        cgate = alloc(Shape{T, width});
        be.linear(ckv, xn, L.compressor.wkv);
        be.linear(cgate, xn, L.compressor.wgate);
    }
    if (L.has_indexer) {
        const int64_t hi = c.index_heads, di = c.index_head_dim;
        ikv = alloc(Shape{T, 2 * di});
        igate = alloc(Shape{T, 2 * di});
        be.linear(ikv, xn, L.indexer.compressor.wkv);
        be.linear(igate, xn, L.indexer.compressor.wgate);
        iq = alloc(Shape{T, hi, di});
        be.linear(iq.view().reshape(Shape{T, hi * di}), cq, L.indexer.wq_b);
        be.rope(iq, pos, compress_inv_freq_.f32(), c.compress_rope.dim,
                static_cast<float>(c.compress_rope.attention_factor), false);
        iw = alloc(Shape{T, hi});
        be.linear(iw, xn, L.indexer.weights_proj);
        be.scale(iw, 1.0f / std::sqrt(static_cast<float>(hi)));
    }

    Tensor o = alloc(Shape{T, H, d});
    for (size_t si = 0; si < rows.seqs.size(); ++si) {
        const Rows::Seq& s = rows.seqs[si];
        if (s.n == 0) continue;
        LayerState& st = s.state->layers[layer];
        if (L.has_compressor) compress(layer, rows, si, false, ckv, cgate, arrays);
        if (L.has_indexer) compress(layer, rows, si, true, ikv, igate, arrays);

        // Key table: window rows before the chunk, the chunk's rows, then the compressed entries.
        const int64_t p0 = s.pos0, end = s.pos0 + s.n;
        const int64_t m = c.compress_ratio[layer];
        const int64_t prev = std::min<int64_t>(p0, W - 1);
        const int64_t entries = L.has_compressor ? end / m : 0;
        const int64_t ring = st.window.dim(0);
        std::vector<float*> key_rows;
        for (int64_t p = p0 - prev; p < p0; ++p) key_rows.push_back(st.window.f32() + (p % ring) * d);
        for (int64_t t = 0; t < s.n; ++t) key_rows.push_back(kv.f32() + (s.row0 + t) * d);
        for (int64_t e = 0; e < entries; ++e) key_rows.push_back(st.compressor.entries->row(e));
        Tensor keys = alloc(Shape{prev + s.n + entries, d});
        be.gather_rows(keys, arrays.rows(key_rows));

        // CSA: the indexer scores every entry for every query of the chunk.
        Tensor scores;
        if (L.has_indexer && entries) {
            std::vector<float*> key_src(entries);
            for (int64_t e = 0; e < entries; ++e) key_src[e] = st.indexer.entries->row(e);
            Tensor index_keys = alloc(Shape{entries, c.index_head_dim});
            be.gather_rows(index_keys, arrays.rows(key_src));
            scores = alloc(Shape{s.n, entries});
            be.indexer_scores(scores, iq.view().slice_rows(s.row0, s.row0 + s.n), index_keys,
                              iw.view().slice_rows(s.row0, s.row0 + s.n),
                              1.0f / std::sqrt(static_cast<float>(c.index_head_dim)));
            if (si == 0) dump(be, "l" + std::to_string(layer) + ".index_scores", scores);
        }
        // Each query's key list: its window rows, then the compressed entries it sees (HCA: all of them; CSA:
        // slots that indexer_select fills on the device with the top index_topk, in entry order).
        std::vector<int32_t> offsets(s.n + 1, 0), indices, csa_starts, csa_limits;
        for (int64_t t = 0; t < s.n; ++t) {
            const int64_t p = p0 + t;
            for (int64_t kp = std::max<int64_t>(0, p - W + 1); kp <= p; ++kp)
                indices.push_back(static_cast<int32_t>(kp < p0 ? kp - (p0 - prev) : prev + kp - p0));
            const int64_t visible = L.has_compressor ? (p + 1) / m : 0;
            if (kind == AttnKind::kHca) {
                for (int64_t e = 0; e < visible; ++e) indices.push_back(static_cast<int32_t>(prev + s.n + e));
            } else if (kind == AttnKind::kCsa) {
                csa_starts.push_back(static_cast<int32_t>(indices.size()));
                csa_limits.push_back(static_cast<int32_t>(visible));
                indices.resize(indices.size() + std::min<int64_t>(visible, c.index_topk), -1);
            }
            offsets[t + 1] = static_cast<int32_t>(indices.size());
        }
        const TensorView key_list = arrays.i32(indices);
        if (kind == AttnKind::kCsa && entries) {
            be.indexer_select(key_list, arrays.i32(csa_starts), scores, arrays.i32(csa_limits), c.index_topk,
                              static_cast<int32_t>(prev + s.n));
            if (si == 0 && debug_dump_enabled()) dump_indexer_picks(layer, to_host(be, key_list), offsets, csa_starts,
                                                                     static_cast<int32_t>(prev + s.n), c.index_topk);
        }
        be.sparse_attention(o.view().slice_rows(s.row0, s.row0 + s.n), q.view().slice_rows(s.row0, s.row0 + s.n),
                            keys, arrays.i32(offsets).as<int32_t>(), key_list.as<int32_t>(), L.attn_sink.f32(),
                            1.0f / std::sqrt(static_cast<float>(d)));

        // Remember this chunk's K=V rows.
        std::vector<float*> dst;
        for (int64_t p = std::max(p0, end - ring); p < end; ++p) dst.push_back(st.window.f32() + (p % ring) * d);
        const int64_t keep = static_cast<int64_t>(dst.size());
        be.scatter_rows(arrays.rows(dst), kv.view().reshape(Shape{T, d}).slice_rows(s.row0 + s.n - keep, s.row0 + s.n));
    }

    // Undo the rotation that V (= K) carried into the output, then the grouped low-rank projection.
    be.rope(o, pos, inv_freq, rope.dim, af, true);
    Tensor z = alloc(Shape{T, static_cast<int64_t>(c.o_groups) * c.o_lora_rank});
    be.grouped_linear(z, o.view().reshape(Shape{T, H * d}), L.wo_a, c.o_groups);
    be.linear(out, z, L.wo_b);
}

}  // namespace deepinfer::dsv4
