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
    act_quant_ = ActivationQuant::from_env();
    for (int l = 0; l < config_.num_layers; ++l) {
        moe_params_.push_back(moe_params(config_, l));
        moe_params_.back().act_quant = act_quant_;
    }
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
    // The step's arrays in one upload: positions, tokens, the rows that copy the embedding into every stream
    // and the rows the head reads (x [T, D] holds the embedding, later the collapsed streams).
    Tensor x = be.alloc(DType::kF32, Shape{T, D});
    std::vector<float*> copies(T * n), picked(R);
    for (int64_t r = 0; r < T; ++r)
        for (int64_t j = 0; j < n; ++j) copies[r * n + j] = x.f32() + r * D;
    for (int64_t i = 0; i < R; ++i) picked[i] = x.f32() + logit_rows[i] * D;
    StepArrays arrays(be);
    const StepArrays::Handle positions_h = arrays.stage_i32(rows.positions), tokens_h = arrays.stage_i32(rows.tokens);
    const StepArrays::Handle copies_h = arrays.stage_rows(copies), picked_h = arrays.stage_rows(picked);
    arrays.upload_staged();
    rows.positions_d = arrays.view(positions_h);
    rows.tokens_d = arrays.view(tokens_h);

    // Residual streams [T, n, D]: the embedding copied into every stream.
    be.embedding(x, weights_.embed, rows.tokens_d.as<int32_t>());
    Tensor streams = be.alloc(DType::kF32, Shape{T, n, D}), next = be.alloc(DType::kF32, Shape{T, n, D});
    be.gather_rows(streams.view().reshape(Shape{T * n, D}), arrays.view(copies_h));

    Tensor post = be.alloc(DType::kF32, Shape{T, n}), comb = be.alloc(DType::kF32, Shape{T, n, n});
    Tensor xn = be.alloc(DType::kF32, Shape{T, D}), y = be.alloc(DType::kF32, Shape{T, D});
    auto hc = [&](const HcWeights& w) {
        return HcParams{w.fn.f32(), w.base.f32(), w.scale.f32(), static_cast<int>(n), c.hc_sinkhorn_iters, c.hc_eps,
                        c.rms_eps};
    };
    // One sublayer wrapped in mHC: collapse the streams, norm, run, expand back into the streams. The expand and the
    // next sublayer's collapse (its hc weights and norm: `then`, null after the last) go to the backend as one op.
    struct Collapse {
        const HcWeights* hc;
        const Tensor* norm;
    };
    bool collapsed = false;  // xn, post and comb already hold this sublayer's collapse
    auto sublayer = [&](const HcWeights& hc_w, const Tensor& norm, const Collapse& then, const std::string& name,
                        auto&& body) {
        if (!collapsed) be.hc_pre_norm(xn, post, comb, streams, hc(hc_w), norm.f32(), c.rms_eps);
        body(xn.view(), y.view());
        dump(be, name, y);
        if (then.hc) {
            be.hc_post_pre_norm(next, y, post, comb, streams, xn, hc(*then.hc), then.norm->f32(), c.rms_eps);
        } else {
            be.hc_post(next, y, post, comb, streams);
        }
        collapsed = then.hc != nullptr;
        std::swap(streams, next);
    };
    if (routing_sink_) routing_sink_->resize(static_cast<size_t>(c.num_layers));
    for (int l = 0; l < c.num_layers; ++l) {
        const LayerWeights& L = weights_.layers[l];
        const std::string tag = "l" + std::to_string(l);
        const bool last = l + 1 == c.num_layers;
        const Collapse ffn{&L.hc_ffn, &L.ffn_norm};
        const Collapse next_attn = last ? Collapse{nullptr, nullptr}
                                        : Collapse{&weights_.layers[l + 1].hc_attn, &weights_.layers[l + 1].attn_norm};
        sublayer(L.hc_attn, L.attn_norm, ffn, tag + ".attn",
                 [&](TensorView in, TensorView out) { attention(l, rows, in, out); });
        sublayer(L.hc_ffn, L.ffn_norm, next_attn, tag + ".mlp", [&](TensorView in, TensorView out) {
            moe_forward(be, L.moe, moe_params_[l], in, rows.tokens_d, out,
                        routing_sink_ ? &(*routing_sink_)[static_cast<size_t>(l)] : nullptr);
        });
        dump(be, "hidden." + std::to_string(l + 1), streams);
    }
    for (Rows::Seq& s : rows.seqs) s.state->num_tokens += s.n;

    // Head: collapse the streams, norm, project the requested rows.
    be.hc_head(x, streams, hc(weights_.hc_head));
    Tensor selected = be.alloc(DType::kF32, Shape{R, D});
    be.gather_rows(selected, arrays.view(picked_h));
    be.rms_norm(selected, selected, weights_.norm.f32(), c.rms_eps);
    Tensor logits = be.alloc(DType::kF32, Shape{R, c.vocab_size});
    be.linear(logits, selected, weights_.head);
    return be.is_host() || on_backend ? std::move(logits) : to_host(be, logits);
}

// Rows of the step's tensors that the sequences keep (the window's K=V rows, the compressors' ring rows): each
// copied from its address in a step tensor to its ring row, all of a layer's in one Backend::copy_rows after the
// attention (nothing in the step reads the rings after their pooling, and the window's ring rows of earlier positions
// are read by the attention itself).
struct DeepseekV4Model::RowCopies {
    std::vector<float*> src, dst;
    std::vector<int32_t> cols;
    void add(const float* from, float* to, int64_t width) {
        src.push_back(const_cast<float*>(from));
        dst.push_back(to);
        cols.push_back(static_cast<int32_t>(width));
    }
};

// The compressor's work for one step, over every sequence of the batch: the entries whose windows close
// inside the step (their pooling slots' rows, gathered by address), and the projections kept in the rings.
struct DeepseekV4Model::CompressPlan {
    int64_t count = 0, slots = 0;  // new entries (all sequences), pooling slots per entry
    StepArrays::Handle kv_src, gate_src, ape_src;  // [count * slots] row addresses
    StepArrays::Handle entry_pos, entry_dst;       // [count] entry positions (for RoPE), entry row addresses
};

// Host side: the slot rows of the entries that close in this step, for every sequence, and the ring rows to keep
// (added to `keep`). kv, gate: [T, width] projections of all rows.
DeepseekV4Model::CompressPlan DeepseekV4Model::plan_compress(int layer, const Rows& rows, bool indexer, TensorView kv,
                                                             TensorView gate, StepArrays& arrays, RowCopies& keep) {
    const DeepseekV4Config& c = config_;
    const LayerWeights& L = weights_.layers[layer];
    const CompressorWeights& w = indexer ? L.indexer.compressor : L.compressor;
    const bool overlap = c.attn[layer] == AttnKind::kCsa;
    const int64_t m = c.compress_ratio[layer];
    const int64_t cdim = indexer ? c.index_head_dim : c.head_dim;
    const int64_t width = overlap ? 2 * cdim : cdim;
    CompressPlan plan;
    plan.slots = overlap ? 2 * m : m;
    std::vector<float*> kv_src, gate_src, ape_src, entry_dst;
    std::vector<int32_t> entry_pos;
    for (const Rows::Seq& s : rows.seqs) {
        if (s.n == 0) continue;
        CompressorState& st = indexer ? s.state->layers[layer].indexer : s.state->layers[layer].compressor;
        const int64_t ring = st.rows.dim(0);
        const int64_t p0 = s.pos0, end = s.pos0 + s.n;
        float* ring_rows = st.rows.f32();  // [ring, 2 * width]: kv then gate
        // Address of a position's kv (gate) projection: this step's rows, or the ring for earlier positions.
        auto kv_at = [&](int64_t pos) {
            return pos >= p0 ? kv.f32() + (s.row0 + pos - p0) * width : ring_rows + (pos % ring) * 2 * width;
        };
        auto gate_at = [&](int64_t pos) {
            return pos >= p0 ? gate.f32() + (s.row0 + pos - p0) * width : ring_rows + (pos % ring) * 2 * width + width;
        };
        for (int64_t win = p0 / m; win < end / m; ++win) {  // the windows that close in this step
            entry_pos.push_back(static_cast<int32_t>(win * m));
            entry_dst.push_back(st.entries->row(win));
            for (int64_t slot = 0; slot < plan.slots; ++slot) {
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
        // Keep the last `ring` positions' projections for later steps.
        for (int64_t pos = std::max(p0, end - ring); pos < end; ++pos) {
            keep.add(kv_at(pos), ring_rows + (pos % ring) * 2 * width, width);
            keep.add(gate_at(pos), ring_rows + (pos % ring) * 2 * width + width, width);
        }
    }
    plan.count = static_cast<int64_t>(entry_pos.size());
    if (plan.count) {
        plan.kv_src = arrays.stage_rows(kv_src);
        plan.gate_src = arrays.stage_rows(gate_src);
        plan.ape_src = arrays.stage_rows(ape_src);
        plan.entry_pos = arrays.stage_i32(entry_pos);
        plan.entry_dst = arrays.stage_rows(entry_dst);
    }
    return plan;
}

// Device side: pools, normalises and rotates the new entries into their rows (the kept projections go into the rings
// later, with the layer's RowCopies: the pooling may read ring rows that this step overwrites).
void DeepseekV4Model::run_compress(int layer, const CompressPlan& plan, bool indexer, StepArrays& arrays) {
    const DeepseekV4Config& c = config_;
    Backend& be = backend_;
    const LayerWeights& L = weights_.layers[layer];
    const CompressorWeights& w = indexer ? L.indexer.compressor : L.compressor;
    const int64_t cdim = indexer ? c.index_head_dim : c.head_dim;
    if (plan.count) {
        const Shape slot_shape{plan.count, plan.slots, cdim};
        Tensor slot_kv = be.alloc(DType::kF32, slot_shape), slot_gate = be.alloc(DType::kF32, slot_shape),
               slot_ape = be.alloc(DType::kF32, slot_shape);
        be.gather_rows(slot_kv, arrays.view(plan.kv_src));
        be.gather_rows(slot_gate, arrays.view(plan.gate_src));
        be.gather_rows(slot_ape, arrays.view(plan.ape_src));
        be.add(slot_gate, slot_ape);
        Tensor pooled = be.alloc(DType::kF32, Shape{plan.count, 1, cdim});
        be.gated_pool(pooled, slot_kv, slot_gate);
        be.rms_norm(pooled, pooled, w.norm.f32(), c.rms_eps);
        be.rope(pooled, arrays.view(plan.entry_pos).as<int32_t>(), compress_inv_freq_.f32(), c.compress_rope.dim,
                static_cast<float>(c.compress_rope.attention_factor), false);
        be.scatter_rows(arrays.view(plan.entry_dst), pooled);
    }
}

void DeepseekV4Model::attention(int layer, const Rows& rows, TensorView xn, TensorView out) {
    const DeepseekV4Config& c = config_;
    Backend& be = backend_;
    const LayerWeights& L = weights_.layers[layer];
    const AttnKind kind = c.attn[layer];
    const RopeSpec& rope = c.rope_for_layer(layer);
    const float* inv_freq = kind == AttnKind::kSliding ? main_inv_freq_.f32() : compress_inv_freq_.f32();
    const float af = static_cast<float>(rope.attention_factor);
    const int64_t T = rows.total, H = c.num_heads, d = c.head_dim, W = c.window;
    const int32_t* pos = rows.positions_d.as<int32_t>();
    auto alloc = [&](Shape s) { return be.alloc(DType::kF32, s); };

    // Every projection of the normed input, then those of the query's low-rank latent: two calls, so device
    // backends stream the small weights together.
    Tensor cq = alloc(Shape{T, c.q_lora_rank});
    Tensor kv = alloc(Shape{T, 1, d});  // the single K=V head
    Tensor ckv, cgate, ikv, igate, iq, iw;
    std::vector<Backend::Projection> from_x = {{cq, &L.wq_a}, {kv.view().reshape(Shape{T, d}), &L.wkv}};
    if (L.has_compressor) {
        const int64_t width = c.compressor_width(layer);
        ckv = alloc(Shape{T, width});
        cgate = alloc(Shape{T, width});
        from_x.push_back({ckv, &L.compressor.wkv});
        from_x.push_back({cgate, &L.compressor.wgate});
    }
    const int64_t hi = c.index_heads, di = c.index_head_dim;
    if (L.has_indexer) {
        ikv = alloc(Shape{T, 2 * di});
        igate = alloc(Shape{T, 2 * di});
        iw = alloc(Shape{T, hi});
        from_x.push_back({ikv, &L.indexer.compressor.wkv});
        from_x.push_back({igate, &L.indexer.compressor.wgate});
        from_x.push_back({iw, &L.indexer.weights_proj});
    }
    act_quant_.linears(be, xn, from_x);

    // The queries on the side queue: nothing until the indexer's scores (or the attention) reads them, so their
    // projection overlaps the K=V row, the compressors and the key lists below. `side` is declared after the
    // tensors its ops use, so it joins before they are freed.
    // Where the backend's attention norms and rotates the queries itself (prefill on CUDA), q goes to it as projected,
    // in bf16 where wq_b's product can write it so: half the bytes, and the projection rounded to bf16 before the
    // per-head norm as well as after it (the attention multiplies bf16 queries; transformers' bf16 model holds q in
    // bf16 there too).
    const bool rope_in_attention = be.attention_applies_rope(T, H, d, rope.dim);
    // The dtype of the attention's queries and output: bf16 where the product on the other side (wq_b, wo_a) takes
    // bf16 and the attention (its rotations inside) reads or writes it so; f32 for FP8 activations' quantization.
    auto attention_io = [&](const LinearWeight& w) {
        return rope_in_attention && !act_quant_.quantizes(w) && be.takes_bf16_inputs(T, w) ? DType::kBF16 : DType::kF32;
    };
    Tensor q = be.alloc(attention_io(L.wq_b), Shape{T, H, d});
    if (L.has_indexer) iq = alloc(Shape{T, hi, di});
    SideQueue side(be);
    side.begin();
    be.rms_norm(cq, cq, L.q_norm.f32(), c.rms_eps);
    // Queries: from the normed latent, per-head unweighted RMS, RoPE on the last dims (here, or in the attention).
    std::vector<Backend::Projection> from_cq = {{q.view().reshape(Shape{T, H * d}), &L.wq_b}};
    if (L.has_indexer) from_cq.push_back({iq.view().reshape(Shape{T, hi * di}), &L.indexer.wq_b});
    act_quant_.linears(be, cq, from_cq);
    if (!rope_in_attention) be.rms_norm_rope(q, nullptr, c.rms_eps, pos, inv_freq, rope.dim, af);
    if (L.has_indexer) {
        be.rope(iq, pos, compress_inv_freq_.f32(), c.compress_rope.dim,
                static_cast<float>(c.compress_rope.attention_factor), false);
        be.scale(iw, 1.0f / std::sqrt(static_cast<float>(hi)));
    }
    side.end();
    be.rms_norm_rope(kv, L.kv_norm.f32(), c.rms_eps, pos, inv_freq, rope.dim, af);

    // Host side, for every sequence at once (one upload for the layer): the compressors' plans, each query's
    // key list over one key table that concatenates the sequences' tables (window rows before the step, the
    // step's rows, then the compressed entries), and the rows the window ring keeps.
    StepArrays arrays(be);
    CompressPlan main_plan, index_plan;
    RowCopies keep;  // the rings' and the window's rows of this step
    if (L.has_compressor) main_plan = plan_compress(layer, rows, false, ckv, cgate, arrays, keep);
    if (L.has_indexer) index_plan = plan_compress(layer, rows, true, ikv, igate, arrays, keep);
    struct CsaSeq {  // a sequence whose queries pick compressed entries with the indexer
        int64_t row0, n, entries, index_key0;
        int32_t base;  // its first entry's index in the key table
    };
    std::vector<CsaSeq> csa;
    // The key table's rows (and for CSA layers the indexer keys' rows) as runs of equally spaced rows, expanded
    // into addresses on the backend (fill_row_addresses): a sequence's window is at most two runs of its ring,
    // the step's rows one, its entries one a page, so the host's work and upload do not grow with the context.
    RowRuns key_runs_of_rows, index_runs_of_rows;
    // Each query's key list is at most two runs of consecutive key-table indices (its window, then HCA's
    // entries) plus CSA's slots: staged as (at, first, count, first, count) per query and written on the
    // backend (fill_index_ranges), a few bytes a query instead of up to window + index_topk indices.
    std::vector<int32_t> offsets{0}, key_runs;
    int64_t list_size = 0;
    // Per row of the step (CSA layers): where its picks go in the key lists, how many entries it sees, the
    // key-table index of its sequence's first entry, and its sequence's indexer keys (a row without entries
    // has limit and count 0).
    std::vector<int32_t> csa_starts, csa_limits, csa_bases, index_begin, index_count;
    const int64_t m = c.compress_ratio[layer];
    for (const Rows::Seq& s : rows.seqs) {
        if (s.n == 0) continue;
        LayerState& st = s.state->layers[layer];
        const int64_t p0 = s.pos0, end = s.pos0 + s.n;
        const int64_t prev = std::min<int64_t>(p0, W - 1);
        const int64_t entries = L.has_compressor ? end / m : 0;
        const int64_t ring = st.window.dim(0);
        const int32_t key0 = static_cast<int32_t>(key_runs_of_rows.rows);  // this sequence's table in the key table
        // Window positions [p0 - prev, p0) are ring rows (p % ring): one run, or two where the ring wraps.
        const int64_t w0 = (p0 - prev) % ring, head = std::min(prev, ring - w0);
        key_runs_of_rows.add(st.window.f32() + w0 * d, head, d);
        key_runs_of_rows.add(st.window.f32(), prev - head, d);
        key_runs_of_rows.add(kv.f32() + s.row0 * d, s.n, d);
        if (entries) key_runs_of_rows.add_paged(*st.compressor.entries, entries);
        const int32_t entry0 = static_cast<int32_t>(key0 + prev + s.n);
        const int64_t index_key0 = index_runs_of_rows.rows;
        if (kind == AttnKind::kCsa && entries) {
            csa.push_back({s.row0, s.n, entries, index_key0, entry0});
            index_runs_of_rows.add_paged(*st.indexer.entries, entries);
        }
        // Each query's key list: its window rows (positions kp in the sequence's table at key0 + kp - (p0 - prev),
        // one run), then the compressed entries it sees (HCA: all of them, a second run; CSA: slots that
        // indexer_select fills on the device with the top index_topk, in entry order).
        for (int64_t t = 0; t < s.n; ++t) {
            const int64_t p = p0 + t, first = std::max<int64_t>(0, p - W + 1);
            const int64_t visible = L.has_compressor ? (p + 1) / m : 0;
            const int64_t hca = kind == AttnKind::kHca ? visible : 0;
            key_runs.insert(key_runs.end(), {static_cast<int32_t>(list_size),
                                             static_cast<int32_t>(key0 + first - (p0 - prev)),
                                             static_cast<int32_t>(p - first + 1), entry0, static_cast<int32_t>(hca)});
            list_size += p - first + 1 + hca;
            if (kind == AttnKind::kCsa) {
                csa_starts.push_back(static_cast<int32_t>(list_size));
                csa_limits.push_back(static_cast<int32_t>(visible));
                csa_bases.push_back(entry0);
                index_begin.push_back(static_cast<int32_t>(index_key0));
                index_count.push_back(static_cast<int32_t>(entries));
                list_size += std::min<int64_t>(visible, c.index_topk);
            }
            DI_CHECK(list_size <= INT32_MAX, "attention: the step's key lists exceed 2^31 entries");
            offsets.push_back(static_cast<int32_t>(list_size));
        }
        // Remember this step's K=V rows.
        for (int64_t p = std::max(p0, end - ring); p < end; ++p)
            keep.add(kv.f32() + (s.row0 + p - p0) * d, st.window.f32() + (p % ring) * d, d);
    }
    // The key rows are whole rows of d floats in buffers the backend allocated: 16-byte aligned when d % 4 == 0, as
    // sparse_attention_rows requires.
    DI_ICHECK(d % 4 != 0 || key_runs_of_rows.aligned(16), "attention: a key row is not 16-byte aligned");
    const int64_t nk = key_runs_of_rows.rows, ni = index_runs_of_rows.rows;
    const StepArrays::Handle row_runs_h = arrays.stage_i64(key_runs_of_rows.concat(index_runs_of_rows));
    const StepArrays::Handle row_addresses_h = arrays.reserve_rows(nk + ni);  // the key rows, then the indexer's
    const StepArrays::Handle offsets_h = arrays.stage_i32(offsets), key_runs_h = arrays.stage_i32(key_runs);
    const StepArrays::Handle starts_h = arrays.stage_i32(csa_starts), limits_h = arrays.stage_i32(csa_limits);
    const StepArrays::Handle bases_h = arrays.stage_i32(csa_bases), index_begin_h = arrays.stage_i32(index_begin);
    const StepArrays::Handle index_count_h = arrays.stage_i32(index_count);
    const StepArrays::Handle key_lists_h = arrays.reserve_i32(list_size);  // written by fill_index_ranges
    const StepArrays::Handle keep_src_h = arrays.stage_rows(keep.src), keep_dst_h = arrays.stage_rows(keep.dst);
    const StepArrays::Handle keep_cols_h = arrays.stage_i32(keep.cols);
    arrays.upload_staged();

    // Device side: new compressed entries first (the key table reads them), then keys, selection, attention.
    if (L.has_compressor) run_compress(layer, main_plan, false, arrays);
    if (L.has_indexer) run_compress(layer, index_plan, true, arrays);
    const TensorView key_list = arrays.view(key_lists_h);
    be.fill_index_ranges(key_list, arrays.view(key_runs_h).reshape(Shape{T, 5}));
    const TensorView row_addresses = arrays.view(row_addresses_h), row_runs = arrays.view(row_runs_h);
    be.fill_row_addresses(row_addresses, row_runs.reshape(Shape{row_runs.numel() / 4, 4}));
    const TensorView key_rows = row_addresses.slice_rows(0, nk);
    side.join();  // the queries
    if (!csa.empty()) {
        // The indexer scores each sequence's entries for its queries and fills their CSA slots with the top ones:
        // one call each over every row of the step, or for a single sequence the calls whose kernels stage each
        // key tile once for many rows (prefill).
        Tensor index_keys = alloc(Shape{ni, c.index_head_dim});
        be.gather_rows(index_keys, row_addresses.slice_rows(nk, nk + ni));
        const TensorView starts = arrays.view(starts_h), limits = arrays.view(limits_h);
        const float scale = 1.0f / std::sqrt(static_cast<float>(c.index_head_dim));
        Tensor scores;
        if (csa.size() == 1) {
            const CsaSeq& q = csa[0];
            scores = alloc(Shape{q.n, q.entries});
            be.indexer_scores(scores, iq.view().slice_rows(q.row0, q.row0 + q.n),
                              index_keys.view().slice_rows(q.index_key0, q.index_key0 + q.entries),
                              iw.view().slice_rows(q.row0, q.row0 + q.n), scale);
            be.indexer_select(key_list, starts.slice_rows(q.row0, q.row0 + q.n), scores,
                              limits.slice_rows(q.row0, q.row0 + q.n), c.index_topk, q.base);
        } else {
            int64_t widest = 0;
            for (const CsaSeq& q : csa) widest = std::max(widest, q.entries);
            scores = alloc(Shape{T, widest});
            be.indexer_scores_rows(scores, iq, index_keys, iw, arrays.view(index_begin_h), arrays.view(index_count_h),
                                   scale);
            be.indexer_select_rows(key_list, starts, scores, limits, arrays.view(bases_h), c.index_topk);
        }
        const CsaSeq& first = csa[0];
        if (first.row0 == 0 && debug_dump_enabled()) {  // the batch's first sequence: its [n, entries] scores
            const Tensor all = to_host(be, scores);
            Tensor own = Tensor::f32(Shape{first.n, first.entries});
            for (int64_t r = 0; r < first.n; ++r)
                std::memcpy(own.f32() + r * first.entries, all.f32() + r * all.dim(1), first.entries * sizeof(float));
            debug_dump("l" + std::to_string(layer) + ".index_scores", own);
            dump_indexer_picks(layer, to_host(be, key_list), offsets,
                               std::vector<int32_t>(csa_starts.begin(), csa_starts.begin() + first.n), first.base,
                               c.index_topk);
        }
    }
    // o in bf16 where wo_a's products round their input to bf16 anyway: the same products, without o's fp32 copy and
    // its conversion.
    Tensor o = be.alloc(attention_io(L.wo_a), Shape{T, H, d});
    // The attention, and the output rotated back (V = K carried the rotation into it); the queries' norm and
    // rotation too where the backend applies them inside.
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    if (rope_in_attention) {
        be.rotary_attention_rows(o, q, key_rows, arrays.view(offsets_h).as<int32_t>(), key_list.as<int32_t>(),
                                 L.attn_sink.f32(), scale, {pos, inv_freq, rope.dim, af, c.rms_eps});
    } else {
        be.sparse_attention_rows(o, q, key_rows, arrays.view(offsets_h).as<int32_t>(), key_list.as<int32_t>(),
                                 L.attn_sink.f32(), scale);
        be.rope(o, pos, inv_freq, rope.dim, af, true);
    }
    be.copy_rows(arrays.view(keep_dst_h), arrays.view(keep_src_h), arrays.view(keep_cols_h));

    // The grouped low-rank projection.
    Tensor z = alloc(Shape{T, static_cast<int64_t>(c.o_groups) * c.o_lora_rank});
    const TensorView o_rows = o.view().reshape(Shape{T, H * d});
    act_quant_.grouped_linear(be, z, o_rows, L.wo_a, c.o_groups);
    act_quant_.linear(be, out, z, L.wo_b);
}

}  // namespace deepinfer::dsv4
