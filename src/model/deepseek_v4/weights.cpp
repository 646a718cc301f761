#include "model/deepseek_v4/weights.h"

#include <set>
#include <string>

#include "backend/backend.h"
#include "core/log.h"
#include "model/safetensors.h"
#include "model/weight_loader.h"

namespace deepinfer::dsv4 {

namespace {

// Spellings used by transformers' save_pretrained (with a "model." prefix, added by the loader) and by
// transformers' in-memory modules, mapped from DeepSeek's release names.
const std::vector<std::pair<std::string, std::string>> kAliases = {
    {"embed.weight", "embed_tokens.weight"},
    {"head.weight", "lm_head.weight"},
    {"hc_head_fn", "hc_head.hc_fn"},
    {"hc_head_base", "hc_head.hc_base"},
    {"hc_head_scale", "hc_head.hc_scale"},
    {"attn.kv_norm.weight", "attn.norm.weight"},
    {"ffn.gate.bias", "ffn.gate.e_score_correction_bias"},
};

CompressorWeights load_compressor(WeightLoader& w, const std::string& prefix, int width, int64_t dim, int ratio,
                                  int c) {
    CompressorWeights cw;
    cw.wkv = w.linear(prefix + "wkv", width, dim);
    cw.wgate = w.linear(prefix + "wgate", width, dim);
    cw.ape = w.f32(prefix + "ape", Shape{ratio, width});
    cw.norm = w.f32(prefix + "norm.weight", Shape{c});
    return cw;
}

}  // namespace

HcWeights load_hc(WeightLoader& w, const std::string& prefix, int rows, int64_t cols, int scales) {
    HcWeights hc;
    hc.fn = w.f32(prefix + "fn", Shape{rows, cols});
    hc.base = w.f32(prefix + "base", Shape{rows});
    hc.scale = w.f32(prefix + "scale", Shape{scales});
    return hc;
}

void weights_to_backend(Backend& be, DeepseekV4Weights& m, std::vector<Tensor>* storage) {
    if (be.is_host()) return;
    auto move = [&](Tensor& t) {
        if (t.numel()) t = to_backend(be, t.view());
    };
    auto move_hc = [&](HcWeights& hc) {
        move(hc.fn);
        move(hc.base);
        move(hc.scale);
    };
    auto move_compressor = [&](CompressorWeights& cw) {
        cw.wkv = to_backend(be, cw.wkv, storage);
        cw.wgate = to_backend(be, cw.wgate, storage);
        move(cw.ape);
        move(cw.norm);
    };
    m.embed = to_backend(be, m.embed, storage);
    m.head = to_backend(be, m.head, storage);
    move(m.norm);
    move_hc(m.hc_head);
    for (LayerWeights& L : m.layers) {
        move_hc(L.hc_attn);
        move_hc(L.hc_ffn);
        move(L.attn_norm);
        move(L.ffn_norm);
        move(L.q_norm);
        move(L.kv_norm);
        move(L.attn_sink);
        for (LinearWeight* w : {&L.wq_a, &L.wq_b, &L.wkv, &L.wo_a, &L.wo_b}) *w = to_backend(be, *w, storage);
        if (L.has_compressor) move_compressor(L.compressor);
        if (L.has_indexer) {
            move_compressor(L.indexer.compressor);
            L.indexer.wq_b = to_backend(be, L.indexer.wq_b, storage);
            L.indexer.weights_proj = to_backend(be, L.indexer.weights_proj, storage);
        }
        moe_to_backend(be, L.moe, storage);
    }
}

MoeParams moe_params(const DeepseekV4Config& c, int) {
    MoeParams p;
    p.num_experts = c.n_routed_experts;
    p.experts_per_token = c.experts_per_token;
    p.moe_inter = c.moe_inter;
    p.n_shared_experts = c.n_shared_experts;
    p.scoring = c.scoring;
    p.routed_scaling = c.routed_scaling;
    p.swiglu_limit = c.swiglu_limit;
    return p;
}

DeepseekV4Weights load_deepseek_v4_weights(Checkpoint& ckpt, const DeepseekV4Config& c) {
    WeightLoader w(ckpt, kAliases);
    w.set_fp8_block(c.fp8_block_rows, c.fp8_block_cols);
    const int64_t D = c.hidden_size, V = c.vocab_size;
    const int n = c.hc_mult;
    const int mix = (2 + n) * n;

    DeepseekV4Weights m;
    m.embed = w.linear("embed", V, D);
    m.head = (c.tie_word_embeddings && !w.has("head.weight")) ? m.embed : w.linear("head", V, D);
    m.norm = w.f32("norm.weight", Shape{D});
    m.hc_head.fn = w.f32("hc_head_fn", Shape{n, n * D});
    m.hc_head.base = w.f32("hc_head_base", Shape{n});
    m.hc_head.scale = w.f32("hc_head_scale", Shape{1});

    for (int l = 0; l < c.num_layers; ++l) {
        const std::string p = "layers." + std::to_string(l) + ".";
        LayerWeights L;
        L.hc_attn = load_hc(w, p + "hc_attn_", mix, n * D, 3);
        L.hc_ffn = load_hc(w, p + "hc_ffn_", mix, n * D, 3);
        L.attn_norm = w.f32(p + "attn_norm.weight", Shape{D});
        L.ffn_norm = w.f32(p + "ffn_norm.weight", Shape{D});

        const std::string a = p + "attn.";
        const int64_t hd = static_cast<int64_t>(c.num_heads) * c.head_dim;
        L.wq_a = w.linear(a + "wq_a", c.q_lora_rank, D);
        L.q_norm = w.f32(a + "q_norm.weight", Shape{c.q_lora_rank});
        L.wq_b = w.linear(a + "wq_b", hd, c.q_lora_rank);
        L.wkv = w.linear(a + "wkv", c.head_dim, D);
        L.kv_norm = w.f32(a + "kv_norm.weight", Shape{c.head_dim});
        L.wo_a = w.linear(a + "wo_a", static_cast<int64_t>(c.o_groups) * c.o_lora_rank, hd / c.o_groups);
        L.wo_b = w.linear(a + "wo_b", D, static_cast<int64_t>(c.o_groups) * c.o_lora_rank);
        L.attn_sink = w.f32(a + "attn_sink", Shape{c.num_heads});
        if (c.attn[l] != AttnKind::kSliding) {
            L.has_compressor = true;
            L.compressor = load_compressor(w, a + "compressor.", c.compressor_width(l), D, c.compress_ratio[l],
                                           c.head_dim);
        }
        if (c.attn[l] == AttnKind::kCsa) {
            L.has_indexer = true;
            L.indexer.compressor = load_compressor(w, a + "indexer.compressor.", 2 * c.index_head_dim, D,
                                                   c.compress_ratio[l], c.index_head_dim);
            L.indexer.wq_b = w.linear(a + "indexer.wq_b", static_cast<int64_t>(c.index_heads) * c.index_head_dim,
                                      c.q_lora_rank);
            L.indexer.weights_proj = w.linear(a + "indexer.weights_proj", c.index_heads, D);
        }

        L.moe = load_moe(w, p + "ffn.", moe_params(c, l), D, c.route[l] == RouteKind::kHash, V);
        m.layers.push_back(std::move(L));
    }

    for (const std::string& name : w.used())
        if (const TensorInfo* t = ckpt.find(name)) m.stored_bytes += t->end - t->begin;
    const std::set<std::string> used(w.used().begin(), w.used().end());
    size_t unused = 0;
    for (const std::string& name : ckpt.names())
        if (!used.count(name) && name.rfind("mtp.", 0) != 0 && name.rfind("model.mtp.", 0) != 0) ++unused;
    if (unused) DI_LOG(kInfo, ckpt.dir(), ": ", unused, " tensors not used by the model (MTP layers aside)");
    return m;
}

}  // namespace deepinfer::dsv4
