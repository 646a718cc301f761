#!/usr/bin/env python3
"""Golden fixtures for DeepSeek-V4, made by the reference implementation.

Runs transformers' `DeepseekV4ForCausalLM` (the reference; needs torch and transformers >= 5.17) on
tiny random checkpoints and writes, per case, into OUT/<case>/:
  config.json, model.safetensors (or shards + index), ids.npy (int32 [T]),
  logits.npy (float32 [T, V], full forward, no cache; for the bf16 case also logits_fp32.npy and
  gen_fp32.npy, the same weights computed in fp32), gen.npy (int32 [N], greedy continuation made
  with the reference's own cache), gen_logits.npy (float32 [N, V], the logits each greedy token was
  picked from), meta.json (what the case covers, versions, self-consistency figures, RoPE tables).

Cases (together they cover every layer type, hash and score routing, default and YaRN RoPE, window
eviction, more CSA entries than index_topk, HCA windows closing, fp32 and bf16 weights):
  v4_tiny_a       fp32, transformers' save_pretrained names, the tiny config of the design doc
  v4_tiny_b_bf16  bf16 weights, reference computed in bf16 (and in fp32), hc_mult 3, HCA rate 16, default RoPE
  v4_tiny_c       bf16-stored weights with an fp32 reference, 16 experts all score-routed, HCA rate 32,
                  YaRN factor 4, topk 16
  v4_wide_attn    V4-Flash's attention shape (64 heads x 512) in a small model with a 300-token prompt: the case
                  that reaches the GPU's prefill attention kernel
  v4_tiny_fp8     DeepSeek release format: legacy config keys, release tensor names, FP8 e4m3
                  linears with E8M0 128x128 block scales, packed FP4 experts with E8M0 scales per
                  32 inputs, int32 tid2eid, two shards with an index, plus MTP tensors to ignore.
                  Reference logits are computed in fp32 from the dequantized weights.

Usage: python3 make_v4_golden.py OUT_DIR [--debug-dir DIR] [--cases a,b]
The parameters transformers initialises to constants (sinks, position biases, mHC bases and scales,
router bias, tid2eid) are randomised so that every one of them matters.
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch

import transformers
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

# ----------------------------------------------------------------------------------------------
# Case definitions (transformers-native config keys; the fp8 case also writes the legacy form)


def rope_params(rope_dim, head_dim, main_theta, compress_theta, yarn=None):
    factor = rope_dim / head_dim
    main = {"rope_type": "default", "rope_theta": main_theta, "partial_rotary_factor": factor}
    compress = {"rope_type": "default", "rope_theta": compress_theta, "partial_rotary_factor": factor}
    if yarn:
        compress.update({"rope_type": "yarn", "attention_factor": 1.0, **yarn})
    return {"main": main, "compress": compress}


CASES = {
    "v4_tiny_a": dict(
        desc="sliding, CSA, HCA(128), CSA; 2 hash layers; YaRN factor 16; window 8; transformers' names",
        dtype="float32", prompt_len=300, gen_len=40, seed=1,
        config=dict(
            vocab_size=256, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1,
            head_dim=32, q_lora_rank=32, o_groups=2, o_lora_rank=16, sliding_window=8,
            layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                         "compressed_sparse_attention"],
            compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
            rope_parameters=rope_params(16, 32, 10000.0, 160000.0,
                                        dict(factor=16.0, original_max_position_embeddings=64, beta_fast=32,
                                             beta_slow=1)),
            partial_rotary_factor=0.5,
            rope_theta=10000.0, compress_rope_theta=160000.0, max_position_embeddings=1024,
            index_n_heads=16, index_head_dim=32, index_topk=4,
            n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=16,
            mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"], scoring_func="sqrtsoftplus",
            norm_topk_prob=True, routed_scaling_factor=1.5, swiglu_limit=10.0,
            hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6,
            num_nextn_predict_layers=1, hidden_act="silu", tie_word_embeddings=False,
            bos_token_id=0, eos_token_id=1),
        # The same model in DeepSeek's legacy keys (compress_ratios has one extra entry for MTP).
        legacy_config=dict(
            architectures=["DeepseekV4ForCausalLM"], model_type="deepseek_v4",
            vocab_size=256, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1,
            head_dim=32, qk_rope_head_dim=16, q_lora_rank=32, o_groups=2, o_lora_rank=16, sliding_window=8,
            compress_ratios=[0, 4, 128, 4, 0], compress_rope_theta=160000.0, rope_theta=10000.0,
            rope_scaling={"type": "yarn", "factor": 16, "original_max_position_embeddings": 64,
                          "beta_fast": 32, "beta_slow": 1},
            max_position_embeddings=1024, index_n_heads=16, index_head_dim=32, index_topk=4,
            n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=16,
            num_hash_layers=2, scoring_func="sqrtsoftplus", topk_method="noaux_tc", norm_topk_prob=True,
            routed_scaling_factor=1.5, swiglu_limit=10.0, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6,
            rms_norm_eps=1e-6, num_nextn_predict_layers=1, hidden_act="silu", tie_word_embeddings=False,
            bos_token_id=0, eos_token_id=1, torch_dtype="float32"),
    ),
    "v4_tiny_b_bf16": dict(
        desc="bf16 weights, reference in bf16: hc_mult 3, HCA rate 16, default RoPE everywhere, swiglu clamp 1.5, "
             "window 16, 3 heads in 3 output groups. Built to be well-conditioned in bf16: hash routing only and "
             "index_topk above the entry count, so no discrete choice flips under bf16 rounding (the fp32 cases "
             "test the selections exactly); logits_fp32.npy holds the same weights computed in fp32",
        dtype="bfloat16", prompt_len=400, gen_len=40, seed=2,
        config=dict(
            vocab_size=256, hidden_size=48, num_hidden_layers=3, num_attention_heads=3, num_key_value_heads=1,
            head_dim=32, q_lora_rank=32, o_groups=3, o_lora_rank=16, sliding_window=16,
            layer_types=["compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"],
            compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
            rope_parameters=rope_params(16, 32, 10000.0, 40000.0), partial_rotary_factor=0.5,
            rope_theta=10000.0, compress_rope_theta=40000.0, max_position_embeddings=2048,
            index_n_heads=16, index_head_dim=32, index_topk=128,
            n_routed_experts=6, n_shared_experts=1, num_experts_per_tok=3, moe_intermediate_size=24,
            mlp_layer_types=["hash_moe"] * 3, scoring_func="sqrtsoftplus",
            norm_topk_prob=True, routed_scaling_factor=2.5, swiglu_limit=1.5,
            hc_mult=3, hc_sinkhorn_iters=10, hc_eps=1e-5, rms_norm_eps=1e-5,
            num_nextn_predict_layers=0, hidden_act="silu", tie_word_embeddings=False,
            bos_token_id=0, eos_token_id=1),
    ),
    "v4_tiny_c": dict(
        desc="bf16-stored weights, reference in fp32 from them: 16 experts top-4 all score-routed, HCA rate 32, "
             "YaRN factor 4 (orig 128, beta 16/2), index_topk 16 with 100 CSA entries, window 32, rope dim 32",
        dtype="bf16_storage", prompt_len=400, gen_len=48, seed=3,
        config=dict(
            vocab_size=256, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1,
            head_dim=48, q_lora_rank=32, o_groups=2, o_lora_rank=24, sliding_window=32,
            layer_types=["sliding_attention", "heavily_compressed_attention", "compressed_sparse_attention",
                         "compressed_sparse_attention"],
            compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 32},
            rope_parameters=rope_params(32, 48, 20000.0, 160000.0,
                                        dict(factor=4.0, original_max_position_embeddings=128, beta_fast=16,
                                             beta_slow=2)),
            partial_rotary_factor=2.0 / 3.0,
            rope_theta=20000.0, compress_rope_theta=160000.0, max_position_embeddings=512,
            index_n_heads=16, index_head_dim=48, index_topk=16,
            n_routed_experts=16, n_shared_experts=1, num_experts_per_tok=4, moe_intermediate_size=8,
            mlp_layer_types=["moe"] * 4, scoring_func="sqrtsoftplus",
            norm_topk_prob=True, routed_scaling_factor=1.5, swiglu_limit=10.0,
            hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6,
            num_nextn_predict_layers=1, hidden_act="silu", tie_word_embeddings=False,
            bos_token_id=0, eos_token_id=1),
    ),
    "v4_wide_attn": dict(
        desc="V4-Flash's attention shape (64 heads x 512, rope dim 64, 8 output groups) in a small model, with a "
             "300-token prompt: enough rows for the GPU's prefill attention kernel (a 64-head group a row per SM), "
             "its fused query norm and rotations and its bf16 queries and output, which the tiny cases do not "
             "reach; sliding and CSA layers, hash routing and index_topk above the entry count (no discrete "
             "choice for bf16 rounding to flip); bf16-stored weights, reference in fp32",
        dtype="bf16_storage", prompt_len=300, gen_len=16, seed=5,
        config=dict(
            vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=64, num_key_value_heads=1,
            head_dim=512, q_lora_rank=32, o_groups=8, o_lora_rank=16, sliding_window=64,
            layer_types=["sliding_attention", "compressed_sparse_attention"],
            compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},  # HCA's unused
            rope_parameters=rope_params(64, 512, 10000.0, 160000.0), partial_rotary_factor=0.125,
            rope_theta=10000.0, compress_rope_theta=160000.0, max_position_embeddings=1024,
            index_n_heads=16, index_head_dim=64, index_topk=128,
            n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=32,
            mlp_layer_types=["hash_moe", "hash_moe"], scoring_func="sqrtsoftplus",
            norm_topk_prob=True, routed_scaling_factor=1.5, swiglu_limit=10.0,
            hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6,
            num_nextn_predict_layers=0, hidden_act="silu", tie_word_embeddings=False,
            bos_token_id=0, eos_token_id=1),
    ),
    "v4_tiny_fp8": dict(
        desc="release format: legacy keys, release names, FP8 e4m3 + E8M0 128x128 scales (several and partial "
             "blocks), FP4 experts, int32 tid2eid, 2 shards, MTP tensors present; reference in fp32 from "
             "dequantized weights",
        dtype="release", prompt_len=320, gen_len=40, seed=4,
        config=dict(
            vocab_size=256, hidden_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1,
            head_dim=64, q_lora_rank=96, o_groups=1, o_lora_rank=80, sliding_window=8,
            layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
            compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
            rope_parameters=rope_params(16, 64, 10000.0, 160000.0,
                                        dict(factor=16.0, original_max_position_embeddings=64, beta_fast=32,
                                             beta_slow=1)),
            partial_rotary_factor=0.25,
            rope_theta=10000.0, compress_rope_theta=160000.0, max_position_embeddings=1024,
            index_n_heads=16, index_head_dim=32, index_topk=4,
            n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=64,
            mlp_layer_types=["hash_moe", "moe", "moe"], scoring_func="sqrtsoftplus",
            norm_topk_prob=True, routed_scaling_factor=1.5, swiglu_limit=10.0,
            hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6,
            num_nextn_predict_layers=1, hidden_act="silu", tie_word_embeddings=False,
            bos_token_id=0, eos_token_id=1),
        legacy_config=dict(
            architectures=["DeepseekV4ForCausalLM"], model_type="deepseek_v4",
            vocab_size=256, hidden_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1,
            head_dim=64, qk_rope_head_dim=16, q_lora_rank=96, o_groups=1, o_lora_rank=80, sliding_window=8,
            compress_ratios=[0, 4, 128, 0], compress_rope_theta=160000.0, rope_theta=10000.0,
            rope_scaling={"type": "yarn", "factor": 16, "original_max_position_embeddings": 64,
                          "beta_fast": 32, "beta_slow": 1},
            max_position_embeddings=1024, index_n_heads=16, index_head_dim=32, index_topk=4,
            n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=64,
            num_hash_layers=1, scoring_func="sqrtsoftplus", topk_method="noaux_tc", norm_topk_prob=True,
            routed_scaling_factor=1.5, swiglu_limit=10.0, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6,
            rms_norm_eps=1e-6, num_nextn_predict_layers=1, hidden_act="silu", tie_word_embeddings=False,
            bos_token_id=0, eos_token_id=1, torch_dtype="bfloat16", expert_dtype="fp4",
            quantization_config={"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                 "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}),
    ),
}

# ----------------------------------------------------------------------------------------------
# Randomisation


def randomize(model, seed):
    """Draws every parameter so that activations stay O(1) and every parameter matters."""
    g = torch.Generator().manual_seed(seed)
    cfg = model.config

    def normal(shape, std):
        return torch.randn(shape, generator=g, dtype=torch.float32) * std

    handled = set()
    with torch.no_grad():
        for name, p in list(model.named_parameters()) + list(model.named_buffers()):
            if "inv_freq" in name:
                continue
            leaf = name.split(".")[-1]
            shape = tuple(p.shape)
            if leaf == "tid2eid":
                rows = [torch.randperm(cfg.n_routed_experts, generator=g)[: cfg.num_experts_per_tok]
                        for _ in range(shape[0])]
                val = torch.stack(rows).to(p.dtype)
            elif leaf == "e_score_correction_bias":
                val = normal(shape, 0.3)
            elif leaf == "sinks":
                val = normal(shape, 1.0)
            elif leaf == "position_bias":
                val = normal(shape, 0.5)
            elif leaf in ("base", "hc_base"):
                val = normal(shape, 0.5)
            elif leaf in ("scale", "hc_scale"):
                val = 0.5 + torch.rand(shape, generator=g)
            elif leaf in ("fn", "hc_fn"):
                val = normal(shape, 1.0 / math.sqrt(shape[1]))
            elif "norm" in name and leaf == "weight" and len(shape) == 1:
                val = 1.0 + normal(shape, 0.1)
            elif "embed_tokens" in name:
                val = normal(shape, 1.0)
            elif "lm_head" in name:
                val = normal(shape, 2.0 / math.sqrt(shape[1]))
            elif leaf in ("gate_up_proj", "down_proj") and len(shape) == 3:
                val = normal(shape, 1.0 / math.sqrt(shape[2]))
            elif leaf == "weight" and len(shape) == 2:
                val = normal(shape, 1.0 / math.sqrt(shape[1]))
            else:
                raise RuntimeError(f"randomize: no rule for {name} {shape}")
            p.copy_(val.to(p.dtype))
            handled.add(name)
    return handled


# ----------------------------------------------------------------------------------------------
# Release-format export (FP8 / FP4 quantization and DeepSeek's tensor names)

FP4_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def quantize_fp8_block(w, block=128):
    """w [N, K] fp32 -> (codes uint8 [N, K], e8m0 uint8 [ceil(N/b), ceil(K/b)], dequantized fp32)."""
    n, k = w.shape
    nb, kb = (n + block - 1) // block, (k + block - 1) // block
    exps = torch.zeros(nb, kb, dtype=torch.uint8)
    deq = torch.zeros_like(w)
    codes = torch.zeros(n, k, dtype=torch.uint8)
    for i in range(nb):
        for j in range(kb):
            tile = w[i * block:(i + 1) * block, j * block:(j + 1) * block]
            amax = tile.abs().max().clamp(min=1e-12).item()
            e = math.ceil(math.log2(amax / 448.0))
            scale = 2.0 ** e
            q = (tile / scale).to(torch.float8_e4m3fn)
            codes[i * block:(i + 1) * block, j * block:(j + 1) * block] = q.view(torch.uint8)
            deq[i * block:(i + 1) * block, j * block:(j + 1) * block] = q.to(torch.float32) * scale
            exps[i, j] = e + 127
    return codes, exps, deq


def quantize_fp4_group(w, group=32):
    """w [N, K] fp32 -> (packed int8 [N, K/2], e8m0 uint8 [N, K/32], dequantized fp32)."""
    n, k = w.shape
    wg = w.reshape(n, k // group, group)
    amax = wg.abs().amax(dim=-1).clamp(min=1e-12)
    e = torch.ceil(torch.log2(amax / 6.0))
    scale = torch.pow(2.0, e)
    v = wg / scale[..., None]
    idx = (v.abs()[..., None] - FP4_GRID).abs().argmin(dim=-1)  # nearest magnitude
    sign = (v < 0) & (idx > 0)
    code = (idx + 8 * sign.to(torch.int64)).to(torch.uint8).reshape(n, k)
    deq = (FP4_GRID[idx] * torch.where(sign, -1.0, 1.0) * scale[..., None]).reshape(n, k)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8).view(torch.int8)
    return packed, (e + 127).to(torch.uint8), deq


def bf16_round(t):
    return t.to(torch.bfloat16).to(torch.float32)


def release_tensors(model):
    """HF module state -> {release_name: (safetensors dtype, numpy array)} and {hf_name: values the
    reference must use} (dequantized / bf16-rounded)."""
    cfg = model.config
    out = {}
    ref = {}
    sd = {k: v.detach().float() if v.is_floating_point() else v.detach() for k, v in model.state_dict().items()}
    fp8_leaves = ("q_a_proj", "q_b_proj", "kv_proj", "o_a_proj", "o_b_proj")

    def put(name, dtype, arr):
        out[name] = (dtype, arr)

    def fp8_linear(hf_name, rel_prefix):
        codes, exps, deq = quantize_fp8_block(sd[hf_name])
        put(rel_prefix + ".weight", "F8_E4M3", codes.numpy())
        put(rel_prefix + ".scale", "F8_E8M0", exps.numpy())
        ref[hf_name] = deq

    def bf16(hf_name, rel_name):
        t = bf16_round(sd[hf_name])
        put(rel_name, "BF16", t.to(torch.bfloat16).view(torch.int16).numpy())
        ref[hf_name] = t

    def f32(hf_name, rel_name):
        put(rel_name, "F32", sd[hf_name].numpy().astype(np.float32))
        ref[hf_name] = sd[hf_name]

    bf16("model.embed_tokens.weight", "embed.weight")
    bf16("lm_head.weight", "head.weight")
    bf16("model.norm.weight", "norm.weight")
    for leaf in ("fn", "base", "scale"):
        f32(f"model.hc_head.hc_{leaf}", f"hc_head_{leaf}")
    for li in range(cfg.num_hidden_layers):
        h, r = f"model.layers.{li}.", f"layers.{li}."
        bf16(h + "input_layernorm.weight", r + "attn_norm.weight")
        bf16(h + "post_attention_layernorm.weight", r + "ffn_norm.weight")
        for leaf in ("fn", "base", "scale"):
            f32(h + f"attn_hc.{leaf}", r + f"hc_attn_{leaf}")
            f32(h + f"ffn_hc.{leaf}", r + f"hc_ffn_{leaf}")
        a, ra = h + "self_attn.", r + "attn."
        fp8_linear(a + "q_a_proj.weight", ra + "wq_a")
        bf16(a + "q_a_norm.weight", ra + "q_norm.weight")
        fp8_linear(a + "q_b_proj.weight", ra + "wq_b")
        fp8_linear(a + "kv_proj.weight", ra + "wkv")
        bf16(a + "kv_norm.weight", ra + "kv_norm.weight")
        fp8_linear(a + "o_a_proj.weight", ra + "wo_a")
        fp8_linear(a + "o_b_proj.weight", ra + "wo_b")
        f32(a + "sinks", ra + "attn_sink")
        c = a + "compressor."
        if c + "kv_proj.weight" in sd:
            bf16(c + "kv_proj.weight", ra + "compressor.wkv.weight")
            bf16(c + "gate_proj.weight", ra + "compressor.wgate.weight")
            f32(c + "position_bias", ra + "compressor.ape")
            bf16(c + "kv_norm.weight", ra + "compressor.norm.weight")
            ix = c + "indexer."
            if ix + "kv_proj.weight" in sd:
                bf16(ix + "kv_proj.weight", ra + "indexer.compressor.wkv.weight")
                bf16(ix + "gate_proj.weight", ra + "indexer.compressor.wgate.weight")
                f32(ix + "position_bias", ra + "indexer.compressor.ape")
                bf16(ix + "kv_norm.weight", ra + "indexer.compressor.norm.weight")
                fp8_linear(ix + "q_b_proj.weight", ra + "indexer.wq_b")
                bf16(ix + "scorer.weights_proj.weight", ra + "indexer.weights_proj.weight")
        m, rm = h + "mlp.", r + "ffn."
        bf16(m + "gate.weight", rm + "gate.weight")
        if m + "gate.tid2eid" in sd:
            put(rm + "gate.tid2eid", "I32", sd[m + "gate.tid2eid"].numpy().astype(np.int32))
            ref[m + "gate.tid2eid"] = sd[m + "gate.tid2eid"]
        if m + "gate.e_score_correction_bias" in sd:
            f32(m + "gate.e_score_correction_bias", rm + "gate.bias")
        fp8_linear(m + "shared_experts.gate_proj.weight", rm + "shared_experts.w1")
        fp8_linear(m + "shared_experts.down_proj.weight", rm + "shared_experts.w2")
        fp8_linear(m + "shared_experts.up_proj.weight", rm + "shared_experts.w3")
        gate_up, down = sd[m + "experts.gate_up_proj"], sd[m + "experts.down_proj"]
        inter = cfg.moe_intermediate_size
        gu_deq, dn_deq = torch.zeros_like(gate_up), torch.zeros_like(down)
        for e in range(cfg.n_routed_experts):
            for wname, w, rows in (("w1", gate_up[e], slice(0, inter)), ("w3", gate_up[e], slice(inter, 2 * inter)),
                                   ("w2", down[e], slice(None))):
                packed, exps, deq = quantize_fp4_group(w[rows])
                put(rm + f"experts.{e}.{wname}.weight", "I8", packed.numpy())
                put(rm + f"experts.{e}.{wname}.scale", "F8_E8M0", exps.numpy())
                (dn_deq[e] if wname == "w2" else gu_deq[e])[rows] = deq
        ref[m + "experts.gate_up_proj"] = gu_deq
        ref[m + "experts.down_proj"] = dn_deq
    missing = [k for k in sd if k not in ref and "inv_freq" not in k]
    if missing:
        raise RuntimeError(f"release export does not cover: {missing}")
    # MTP weights exist in release checkpoints; the engine must load past them.
    d = cfg.hidden_size
    put("mtp.0.enorm.weight", "BF16", torch.ones(d).to(torch.bfloat16).view(torch.int16).numpy())
    put("mtp.0.hnorm.weight", "BF16", torch.ones(d).to(torch.bfloat16).view(torch.int16).numpy())
    put("mtp.0.hc_head_base", "F32", np.zeros(cfg.hc_mult, np.float32))
    return out, ref


def write_safetensors(path, tensors):
    """tensors: {name: (dtype string, numpy array)} written in sorted name order."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        dtype, arr = tensors[name]
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def write_sharded(out_dir, tensors, n_shards=2):
    names = sorted(tensors)
    per = (len(names) + n_shards - 1) // n_shards
    weight_map, total = {}, 0
    for s in range(n_shards):
        fname = f"model-{s + 1:05d}-of-{n_shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s * per:(s + 1) * per]}
        write_safetensors(os.path.join(out_dir, fname), part)
        for n, (_, arr) in part.items():
            weight_map[n] = fname
            total += arr.nbytes
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)


# ----------------------------------------------------------------------------------------------
# Reference runs


def restore_fp32_rope_tables(model):
    """`model.to(bfloat16)` also casts the rotary inv_freq buffers, which would rotate by bf16-rounded
    frequencies (an artifact of the cast, not of the model: a bf16 load computes them in fp32)."""
    for module in model.modules():
        if isinstance(module, transformers.models.deepseek_v4.modeling_deepseek_v4.DeepseekV4RotaryEmbedding):
            fresh = type(module)(model.config)
            for k in module.layer_types:
                for attr in (f"{k}_inv_freq", f"{k}_original_inv_freq"):
                    setattr(module, attr, getattr(fresh, attr).float())


def indexer_boundary_ties(model, ids):
    """Rows where the lightning indexer's k-th and (k+1)-th best visible scores are equal. The choice
    among tied entries is implementation-defined (torch.topk), so fixtures should have none."""
    cfg, found, hooks = model.config, {}, []
    for li, layer in enumerate(model.model.layers):
        comp = layer.self_attn.compressor
        if comp is None or not hasattr(comp, "indexer"):
            continue
        def hook(_m, _inp, out, li=li):
            found[li] = out.detach().float()[0]
        hooks.append(comp.indexer.scorer.register_forward_hook(hook))
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]), use_cache=False)
    for h in hooks:
        h.remove()
    m, k, ties = cfg.compress_rates["compressed_sparse_attention"], cfg.index_topk, {}
    for li, scores in found.items():
        rows = []
        for t in range(scores.shape[0]):
            visible = (t + 1) // m
            if visible > k:
                top = torch.sort(scores[t, :visible], descending=True).values
                if top[k - 1] == top[k]:
                    rows.append(t)
        ties[li] = rows
    return ties


def full_forward_logits(model, ids):
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), use_cache=False)
    return out.logits[0].float().numpy()


def cached_greedy(model, ids, n_new):
    """Prefill with the reference's cache, then greedy decode token by token."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), use_cache=True)
        cache = out.past_key_values
        prefill_logits = out.logits[0].float().numpy()
        step_logits = [out.logits[0, -1].float().numpy()]
        tokens = [int(np.argmax(step_logits[-1]))]
        for _ in range(n_new - 1):
            out = model(input_ids=torch.tensor([[tokens[-1]]]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            step_logits.append(out.logits[0, -1].float().numpy())
            tokens.append(int(np.argmax(step_logits[-1])))
    return prefill_logits, np.array(tokens, np.int32), np.stack(step_logits).astype(np.float32)


def debug_capture(model, ids):
    """Per-layer intermediates of the full forward over the first 160 ids, for debugging (not committed)."""
    ids = ids[:160]
    rec, hooks = {}, []
    for li, layer in enumerate(model.model.layers):
        def save(key):
            def hook(_m, _inp, out):
                if isinstance(out, tuple):
                    for i, o in enumerate(out):
                        if torch.is_tensor(o):
                            rec[f"{key}.{i}"] = o.detach().float().numpy()
                elif torch.is_tensor(out):
                    rec[key] = out.detach().float().numpy()
            return hook
        hooks.append(layer.self_attn.register_forward_hook(save(f"l{li}.attn")))
        hooks.append(layer.mlp.register_forward_hook(save(f"l{li}.mlp")))
        hooks.append(layer.attn_hc.register_forward_hook(save(f"l{li}.attn_hc")))
        hooks.append(layer.ffn_hc.register_forward_hook(save(f"l{li}.ffn_hc")))
        comp = layer.self_attn.compressor
        if comp is not None:
            hooks.append(comp.register_forward_hook(save(f"l{li}.compressor")))
            if hasattr(comp, "indexer"):
                hooks.append(comp.indexer.register_forward_hook(save(f"l{li}.indexer")))
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), use_cache=False, output_hidden_states=True)
    for h in hooks:
        h.remove()
    for i, hs in enumerate(out.hidden_states or []):
        rec[f"hidden.{i}"] = hs.detach().float().numpy()
    return rec


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def rope_tables(model):
    emb = model.model.rotary_emb
    return {k: getattr(emb, f"{k}_inv_freq").float().tolist() for k in emb.layer_types}


def make_case(name, spec, out_root, debug_dir):
    t0 = time.time()
    torch.manual_seed(spec["seed"])
    out_dir = os.path.join(out_root, name)
    os.makedirs(out_dir, exist_ok=True)
    cfg = DeepseekV4Config(**spec["config"])
    print(f"[{name}] layer_types={cfg.layer_types} mlp={cfg.mlp_layer_types} rope={cfg.rope_parameters}",
          flush=True)
    model = DeepseekV4ForCausalLM(cfg).float().eval()
    randomize(model, spec["seed"])
    meta = {"case": name, "description": spec["desc"], "transformers": transformers.__version__,
            "torch": torch.__version__, "weights": spec["dtype"]}

    if "legacy_config" in spec:
        try:
            legacy = DeepseekV4Config(**{k: v for k, v in spec["legacy_config"].items()
                                         if k not in ("architectures", "model_type", "quantization_config",
                                                      "expert_dtype", "torch_dtype", "topk_method")})
            same = (legacy.layer_types == cfg.layer_types and legacy.mlp_layer_types == cfg.mlp_layer_types
                    and legacy.qk_rope_head_dim == cfg.qk_rope_head_dim)
            meta["hf_reads_legacy_config_as"] = {"layer_types": legacy.layer_types,
                                                 "mlp_layer_types": legacy.mlp_layer_types,
                                                 "rope_parameters": legacy.rope_parameters,
                                                 "same_structure": same}
            print(f"[{name}] legacy config as read by HF: rope={legacy.rope_parameters} same_structure={same}",
                  flush=True)
        except Exception as e:
            meta["hf_reads_legacy_config_as"] = {"error": repr(e)}
            print(f"[{name}] HF could not read the legacy config: {e!r}", flush=True)

    if spec["dtype"] == "release":
        tensors, ref = release_tensors(model)
        with torch.no_grad():
            sd = model.state_dict()
            for k, v in ref.items():
                sd[k].copy_(v.to(sd[k].dtype))
        write_sharded(out_dir, tensors)
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(spec["legacy_config"], f, indent=1)
        meta["tensor_dtypes"] = sorted({d for d, _ in tensors.values()})
    elif spec["dtype"] == "bf16_storage":
        # Weights rounded to bf16 and stored as bf16; the reference computes in fp32 from those exact values.
        with torch.no_grad():
            for pname, p in list(model.named_parameters()) + list(model.named_buffers()):
                if p.is_floating_point() and "inv_freq" not in pname:
                    p.copy_(p.to(torch.bfloat16).to(torch.float32))
        import copy
        stored = copy.deepcopy(model).to(torch.bfloat16)
        stored.save_pretrained(out_dir, safe_serialization=True)
        del stored
        meta["bf16_mode"] = "weights stored in bf16, reference computed in fp32"
    else:
        if spec["dtype"] == "bfloat16":
            # Cast as transformers does for a bf16 load: modules named in _keep_in_fp32_modules_strict stay fp32.
            keep = list(getattr(model, "_keep_in_fp32_modules_strict", []) or [])
            with torch.no_grad():
                for pname, p in list(model.named_parameters()) + list(model.named_buffers()):
                    if not p.is_floating_point() or "inv_freq" in pname:
                        continue
                    if not any(k in pname for k in keep):
                        p.data = p.data.to(torch.bfloat16)
            meta["fp32_kept_modules"] = keep
            try:
                full_forward_logits(model, [0, 5, 7])
                meta["bf16_mode"] = "transformers keep_in_fp32 rule"
            except Exception as e:  # mixed dtypes rejected: fall back to an all-bf16 model
                print(f"[{name}] mixed-dtype forward failed ({e}); casting everything to bf16", flush=True)
                model = model.to(torch.bfloat16)
                meta["bf16_mode"] = "all bf16 (RoPE inv_freq tables kept in fp32)"
            restore_fp32_rope_tables(model)
        model.save_pretrained(out_dir, safe_serialization=True)
        with open(os.path.join(out_dir, "config.json")) as f:
            saved_cfg = json.load(f)
        meta["saved_config_keys"] = sorted(saved_cfg)
        if "legacy_config" in spec:
            with open(os.path.join(out_dir, "config.legacy.json"), "w") as f:
                json.dump(spec["legacy_config"], f, indent=1)
        # What save_pretrained wrote, and whether it round-trips through from_pretrained.
        from safetensors import safe_open
        files = [f for f in os.listdir(out_dir) if f.endswith(".safetensors")]
        saved = {}
        for fn in files:
            with safe_open(os.path.join(out_dir, fn), "pt") as sf:
                for k in sf.keys():
                    saved[k] = (str(sf.get_slice(k).get_dtype()), list(sf.get_slice(k).get_shape()))
        meta["saved_tensors"] = saved
        try:
            reloaded = DeepseekV4ForCausalLM.from_pretrained(out_dir, dtype=next(model.parameters()).dtype)
            a, b = model.state_dict(), reloaded.state_dict()
            diff = [k for k in a if "inv_freq" not in k and (k not in b or not torch.equal(a[k].float(), b[k].float()))]
            meta["from_pretrained_mismatches"] = diff
            print(f"[{name}] from_pretrained round trip mismatches: {diff}", flush=True)
        except Exception as e:
            meta["from_pretrained_error"] = repr(e)

    def prompt(seed):
        rng = np.random.default_rng(seed)
        return [cfg.bos_token_id] + rng.integers(2, cfg.vocab_size, spec["prompt_len"] - 1).tolist()

    ids = prompt(spec["seed"])
    model32 = None
    if spec["dtype"] == "bfloat16":
        # A bf16 reference's greedy path flips wherever two logits are closer than bf16 rounding. Use a
        # prompt on which the reference's bf16 and fp32 greedy continuations agree, so that the fixture
        # tests the engine rather than rounding luck (the attempts are recorded).
        import copy
        model32 = copy.deepcopy(model).float()
        restore_fp32_rope_tables(model32)
        attempts = []
        for prompt_seed in range(spec["seed"], spec["seed"] + 20):
            ids = prompt(prompt_seed)
            _, gen16, _ = cached_greedy(model, ids, spec["gen_len"])
            _, gen32, _ = cached_greedy(model32, ids, spec["gen_len"])
            agree = int(np.argmax(np.append(gen16 != gen32, True)))
            attempts.append({"prompt_seed": prompt_seed, "bf16_vs_fp32_greedy_prefix": agree})
            if agree == spec["gen_len"]:
                break
        meta["prompt_attempts"] = attempts
        np.save(os.path.join(out_dir, "gen_fp32.npy"), gen32)
    logits = full_forward_logits(model, ids)
    prefill, gen, gen_logits = cached_greedy(model, ids, spec["gen_len"])
    ties = indexer_boundary_ties(model, ids)
    meta.update({
        "prompt_len": len(ids), "gen_len": int(len(gen)),
        "ref_cached_prefill_vs_full": rel_err(prefill, logits),
        "ref_gen_first_vs_full_last": rel_err(gen_logits[0], logits[-1]),
        "logit_absmax": float(np.abs(logits).max()),
        "indexer_boundary_ties": {str(k): v for k, v in ties.items()},
        "rope_inv_freq": rope_tables(model),
        "seconds": round(time.time() - t0, 1),
    })
    if model32 is not None:
        # The same bf16 weights computed in fp32: checks weight handling at the fp32 bound.
        logits32 = full_forward_logits(model32, ids)
        np.save(os.path.join(out_dir, "logits_fp32.npy"), logits32.astype(np.float32))
        meta["fp32_vs_bf16_reference"] = rel_err(logits, logits32)
        meta["indexer_boundary_ties_fp32"] = {str(k): v for k, v in indexer_boundary_ties(model32, ids).items()}
    np.save(os.path.join(out_dir, "ids.npy"), np.array(ids, np.int32))
    np.save(os.path.join(out_dir, "logits.npy"), logits.astype(np.float32))
    np.save(os.path.join(out_dir, "gen.npy"), gen)
    np.save(os.path.join(out_dir, "gen_logits.npy"), gen_logits)
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"[{name}] T={len(ids)} cached-vs-full={meta['ref_cached_prefill_vs_full']:.2e} "
          f"gen={gen[:12].tolist()}... ties={sum(len(v) for v in ties.values())} "
          f"({meta['seconds']} s)", flush=True)
    if debug_dir and name in ("v4_tiny_a", "v4_tiny_c"):
        try:
            rec = debug_capture(model, ids)
            np.savez_compressed(os.path.join(debug_dir, f"{name}_debug.npz"), ids=np.array(ids), **rec)
        except Exception as e:
            print(f"[{name}] debug capture failed: {e!r}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--debug-dir")
    ap.add_argument("--cases", default=",".join(CASES))
    args = ap.parse_args()
    torch.set_num_threads(min(16, os.cpu_count() or 1))
    os.makedirs(args.out_dir, exist_ok=True)
    if args.debug_dir:
        os.makedirs(args.debug_dir, exist_ok=True)
    failed = []
    for name in args.cases.split(","):
        try:
            make_case(name, CASES[name], args.out_dir, args.debug_dir)
        except Exception as e:  # keep going: one broken case must not hide the others' results
            import traceback
            traceback.print_exc()
            failed.append(name)
    if failed:
        print(f"FAILED cases: {failed}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
