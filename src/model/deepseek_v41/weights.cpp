#include "model/deepseek_v41/weights.h"

#include <algorithm>
#include <string>

#include "model/safetensors.h"
#include "model/weight_loader.h"

namespace deepinfer::dsv41 {

using dsv4::load_hc;

DeepseekV41Weights load_deepseek_v41_weights(Checkpoint& ckpt, const DeepseekV41Config& c) {
    WeightLoader w(ckpt, {{"embed.weight", "embed_tokens.weight"}, {"head.weight", "lm_head.weight"}});
    w.set_fp8_block(c.fp8_block_rows, c.fp8_block_cols);
    const int64_t D = c.hidden_size, V = c.vocab_size, n = c.hc_mult;
    DeepseekV41Weights m;
    m.embed = w.linear("embed", V, D);
    m.head = w.linear("head", V, D);
    m.norm = w.f32("norm.weight", Shape{D});
    for (int l = 0; l < c.num_layers; ++l) {
        const std::string p = "layers." + std::to_string(l) + ".", a = p + "attn.";
        LayerWeights L;
        L.hc_attn = load_hc(w, p + "hc_attn_", static_cast<int>((2 + n) * n), n * D, 3);
        L.hc_ffn = load_hc(w, p + "hc_ffn_", static_cast<int>((2 + n) * n), n * D, 3);
        L.attn_norm = w.f32(p + "attn_norm.weight", Shape{D});
        L.ffn_norm = w.f32(p + "ffn_norm.weight", Shape{D});
        const int64_t hd = static_cast<int64_t>(c.num_heads) * c.head_dim;
        L.wq_a = w.linear(a + "wq_a", c.q_lora_rank, D);
        L.q_norm = w.f32(a + "q_norm.weight", Shape{c.q_lora_rank});
        L.wq_b = w.linear(a + "wq_b", hd, c.q_lora_rank);
        L.wkv = w.linear(a + "wkv", c.head_dim, D);
        L.kv_norm = w.f32(a + "kv_norm.weight", Shape{c.head_dim});
        L.wo_a = w.linear(a + "wo_a", static_cast<int64_t>(c.o_groups) * c.o_lora_rank, hd / c.o_groups);
        L.wo_b = w.linear(a + "wo_b", D, static_cast<int64_t>(c.o_groups) * c.o_lora_rank);
        L.attn_sink = w.f32(a + "attn_sink", Shape{c.num_heads});
        if (c.is_kv_source(l)) {
            L.compressor_wkv = w.linear(a + "compressor.wkv", c.head_dim, D);
            if (c.compress_ratio[l] > 1) L.compressor_wgate = w.linear(a + "compressor.wgate", c.head_dim, D);
            L.compressor_norm = w.f32(a + "compressor.norm.weight", Shape{c.head_dim});
            L.index_wk = w.linear(a + "indexer.wk", c.index_head_dim, c.head_dim);
            L.index_k_norm = w.f32(a + "indexer.k_norm.weight", Shape{c.index_head_dim});
        }
        if (c.is_index_source(l)) {
            L.index_wq_b = w.linear(a + "indexer.wq_b", static_cast<int64_t>(c.index_heads) * c.index_head_dim,
                                    c.q_lora_rank);
            L.index_weights_proj = w.linear(a + "indexer.weights_proj", c.index_heads, D);
        }
        L.moe = load_moe(w, p + "ffn.", c.moe, D, false, V);
        const auto& eng = c.engram.layer_ids;
        const auto it = std::find(eng.begin(), eng.end(), l);
        if (it != eng.end()) {
            const size_t e = static_cast<size_t>(it - eng.begin());
            const int64_t cols = static_cast<int64_t>(c.engram.max_ngram - 1) * c.engram.n_heads;
            L.has_engram = true;
            // Table rows are FP8 with one E8M0 scale per 32 values: blocks of 1 x 32.
            w.set_fp8_block(1, 32);
            L.engram.table = w.linear(p + "engram.embed", c.engram.num_embeddings[e], c.engram.head_dim);
            w.set_fp8_block(c.fp8_block_rows, c.fp8_block_cols);
            L.engram.wkv = w.linear(p + "engram.wkv", (n + 1) * D, cols * c.engram.head_dim);
            const Tensor q = w.f32(p + "engram.q_weight", Shape{n, D}), k = w.f32(p + "engram.k_weight", Shape{n, D});
            L.engram.qk_weight = Tensor::f32(Shape{n, D});
            for (int64_t i = 0; i < n * D; ++i) L.engram.qk_weight.f32()[i] = q.f32()[i] * k.f32()[i];
        }
        m.layers.push_back(std::move(L));
    }
    for (const std::string& name : w.used())
        if (const TensorInfo* t = ckpt.find(name)) m.stored_bytes += t->end - t->begin;
    return m;
}

}  // namespace deepinfer::dsv41
