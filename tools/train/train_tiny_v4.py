#!/usr/bin/env python3
"""Trains DeepInfer's default model: a small DeepSeek-V4 (every V4 feature on) on Python's sources and docs.

Runs transformers' `DeepseekV4ForCausalLM` (the reference implementation, so the checkpoint format is right by
construction; needs torch, transformers >= 5.17 and tokenizers, and a CUDA GPU) in stages:

  tokenizer  byte-level BPE of --vocab tokens trained with HF tokenizers on the training documents, with
             DeepSeek-V4's pre-tokenizer and its 29 named special tokens (ids 0..28, bos 0, eos 1); skipped
             when --tokenizer names an existing tokenizer.json
  train      AdamW on random 512-token windows of the token stream (documents as [bos] text [eos]), bf16
             autocast, for --minutes of wall time; the schedule's length is fixed from the measured step time
             (warm-up, then cosine to 10%); resumable from WORK/ckpt.pt: --resume continues an interrupted
             schedule, or trains --minutes more at the final learning rate once it has ended
  export     DeepSeek's release format: FP8 e4m3 linears with E8M0 128x128 block scales, packed FP4 experts
             with E8M0 scales per 32 inputs, bf16 embeddings/norms/compressors, fp32 mHC; legacy config keys;
             written as two safetensors shards with an index, beside the tokenizer
  eval       held-out perplexity computed by transformers in fp32 (TF32 off), for the trained weights and for the
             shipped (dequantized) weights, over --eval-text: ids = [bos] + encode(text), windows of
             --eval-context tokens each predicting the next token (every token once, fresh context per window)

Usage (on the GPU machine):
  python3 tools/train/train_tiny_v4.py --corpus CORPUS_DIR --work WORK --out OUT \
      --eval-text models/deepinfer-tiny-v4/heldout.txt [--tokenizer models/deepinfer-tiny-v4/tokenizer.json] \
      [--minutes 8] [--resume] [--smoke]
CORPUS_DIR comes from tools/train/make_corpus.py. OUT receives the model directory's files, the loss log
(train_log.csv) and reference.json (the reference perplexities and per-window losses).
"""
import argparse
import csv
import gzip
import hashlib
import json
import lzma
import math
import os
import shutil
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "tools", "golden"))

from transformers import DeepseekV4Config, DeepseekV4ForCausalLM  # noqa: E402

from make_v4_golden import release_tensors, write_sharded  # noqa: E402

# ----------------------------------------------------------------------------------------------
# The model: every DeepSeek-V4 feature at small width. Sizes keep the release-format files near 20 MB.

VOCAB = 8192
SEQ_LEN = 512
NATIVE_CONFIG = dict(
    vocab_size=VOCAB, hidden_size=256, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=1,
    head_dim=128, q_lora_rank=128, o_groups=2, o_lora_rank=128, sliding_window=128,
    layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                 "compressed_sparse_attention", "heavily_compressed_attention", "compressed_sparse_attention"],
    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 128},
    rope_parameters={
        "main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        "compress": {"rope_type": "default", "rope_theta": 160000.0, "partial_rotary_factor": 0.25}},
    partial_rotary_factor=0.25, rope_theta=10000.0, compress_rope_theta=160000.0, max_position_embeddings=4096,
    index_n_heads=8, index_head_dim=64, index_topk=64,
    n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, moe_intermediate_size=256,
    mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe", "moe"], scoring_func="sqrtsoftplus",
    norm_topk_prob=True, routed_scaling_factor=1.5, swiglu_limit=10.0,
    hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, rms_norm_eps=1e-6,
    num_nextn_predict_layers=0, hidden_act="silu", tie_word_embeddings=False,
    bos_token_id=0, eos_token_id=1, pad_token_id=2, router_aux_loss_coef=0.01, initializer_range=0.02)


def legacy_config(n):
    """The same model in DeepSeek's release keys (what the shipped config.json holds)."""
    ratio = {"sliding_attention": 0, "compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
    keys = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "head_dim", "q_lora_rank", "o_groups", "o_lora_rank", "sliding_window", "compress_rope_theta",
            "rope_theta", "max_position_embeddings", "index_n_heads", "index_head_dim", "index_topk",
            "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size", "scoring_func",
            "norm_topk_prob", "routed_scaling_factor", "swiglu_limit", "hc_mult", "hc_sinkhorn_iters", "hc_eps",
            "rms_norm_eps", "num_nextn_predict_layers", "hidden_act", "tie_word_embeddings", "bos_token_id",
            "eos_token_id")
    c = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4"}
    c.update({k: n[k] for k in keys})
    c["qk_rope_head_dim"] = int(n["head_dim"] * n["partial_rotary_factor"])
    c["compress_ratios"] = [ratio[t] for t in n["layer_types"]]
    c["num_hash_layers"] = sum(1 for t in n["mlp_layer_types"] if t == "hash_moe")
    c["topk_method"] = "noaux_tc"
    c["torch_dtype"] = "bfloat16"
    c["expert_dtype"] = "fp4"
    c["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}
    return c


# ----------------------------------------------------------------------------------------------
# Corpus and tokenizer


def read_docs(path):
    with lzma.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def deepseek_special_tokens():
    """DeepSeek-V4's named added tokens (not the placeholders), in id order, with their flags."""
    path = os.path.join(REPO, "tests", "data", "tokenizer", "deepseek_v4", "tokenizer.json.gz")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        added = json.load(f)["added_tokens"]
    return [a for a in added if "place▁holder" not in a["content"]]


def train_tokenizer(docs, vocab_size, out_dir):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = deepseek_special_tokens()
    tok = Tokenizer(models.BPE())
    # DeepSeek-V4's pre-tokenizer: digits in threes, CJK runs, then words / punctuation / whitespace.
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}{1,3}"), "isolated"),
        pre_tokenizers.Split(Regex("[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"), "isolated"),
        pre_tokenizers.Split(Regex(
            r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|"
            r" ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=[s["content"] for s in specials],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(docs, trainer=trainer)
    path = os.path.join(out_dir, "tokenizer.json")
    tok.save(path)
    # The flags of DeepSeek's added tokens (<｜User｜> and the tool markers are not "special").
    with open(path, encoding="utf-8") as f:
        t = json.load(f)
    flags = {s["content"]: s for s in specials}
    for a in t["added_tokens"]:
        s = flags[a["content"]]
        for key in ("single_word", "lstrip", "rstrip", "normalized", "special"):
            a[key] = s[key]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(t, f, ensure_ascii=False, indent=None, separators=(",", ":"))
    write_tokenizer_config(out_dir)
    return path


def write_tokenizer_config(out_dir):
    cfg_path = os.path.join(REPO, "tests", "data", "tokenizer", "deepseek_v4", "tokenizer_config.json")
    with open(cfg_path, encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["model_max_length"] = NATIVE_CONFIG["max_position_embeddings"]
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)


def load_tokenizer(path):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(path)
    assert tok.token_to_id("<｜begin▁of▁sentence｜>") == 0 and tok.token_to_id("<｜end▁of▁sentence｜>") == 1
    return tok


def encode_corpus(tok, docs):
    """Documents -> one uint16 stream of [bos] ids [eos] per document."""
    parts = []
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        parts.append(np.concatenate([[0], np.asarray(enc.ids, dtype=np.int64), [1]]))
    return np.concatenate(parts).astype(np.uint16)


def eval_ids(tok, text):
    return [0] + tok.encode(text, add_special_tokens=False).ids


def windows(ids, context):
    """(inputs, targets) pairs: every id after the first is predicted once, each window from fresh context."""
    out = []
    for start in range(0, len(ids) - 1, context):
        x = ids[start:start + context]
        y = ids[start + 1:start + context + 1]
        out.append((x[:len(y)], y))
    return out


# ----------------------------------------------------------------------------------------------
# Model


def make_model(device, seed):
    torch.manual_seed(seed)
    cfg = DeepseekV4Config(**NATIVE_CONFIG)
    model = DeepseekV4ForCausalLM(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, buf in model.named_buffers():
            if name.endswith("tid2eid"):  # hash routing: a fixed random set of distinct experts per token
                rows = [torch.randperm(cfg.n_routed_experts, generator=g)[:cfg.num_experts_per_tok]
                        for _ in range(buf.shape[0])]
                buf.copy_(torch.stack(rows).to(buf.dtype))
    return model.to(device)


@torch.no_grad()
def nll_per_window(model, ids, context, device, batch=16, max_windows=None):
    """Sum of -log p(target) and token count per window, fp32, no cache (the full-forward reference)."""
    model.eval()
    ws = windows(ids, context)[:max_windows]
    results = []
    i = 0
    while i < len(ws):
        n = len(ws[i][0])
        group = [w for w in ws[i:i + batch] if len(w[0]) == n]
        x = torch.tensor([w[0] for w in group], device=device)
        y = torch.tensor([w[1] for w in group], device=device)
        logits = model(input_ids=x, use_cache=False).logits.float()
        lp = torch.log_softmax(logits, dim=-1).gather(-1, y.unsqueeze(-1)).squeeze(-1)
        for row in lp:
            results.append((float(-row.double().sum()), int(row.numel())))
        i += len(group)
    return results


def perplexity(results):
    total = sum(r[0] for r in results)
    count = sum(r[1] for r in results)
    return math.exp(total / count), count


# ----------------------------------------------------------------------------------------------
# Training


def train(args, model, stream, eval_stream, device, log_path):
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    ckpt_path = os.path.join(args.work, "ckpt.pt")
    state = {"step": 0, "total_steps": None, "elapsed": 0.0, "tokens": 0}
    if args.resume and os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path, map_location=device, weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        state = ck["state"]
        # The saved plan stands: an interrupted run continues its schedule; a finished one trains --minutes more
        # at the final learning rate.
        print(f"resumed at step {state['step']} of {state['total_steps']}", flush=True)
    gen = torch.Generator().manual_seed(1234 + state["step"])
    warmup = args.warmup
    budget = args.minutes * 60.0
    rows = args.batch
    tokens_per_step = rows * SEQ_LEN
    n = len(stream) - SEQ_LEN  # window starts: [0, n) keeps start + SEQ_LEN inside the stream
    if n < 1:
        raise SystemExit(f"the corpus has {len(stream)} tokens, fewer than one window of {SEQ_LEN + 1}")
    stream_t = torch.from_numpy(stream.astype(np.int64))
    new_log = not os.path.exists(log_path) or not args.resume
    log_f = open(log_path, "w" if new_log else "a", newline="")
    log = csv.writer(log_f)
    if new_log:
        log.writerow(["step", "tokens", "seconds", "lr", "train_loss", "heldout_loss"])
    t_start = time.time()
    last_save = t_start
    step_times = []  # wall time per iteration (batch, forward, backward, optimizer, logging)
    t_iter = None
    first_step = state["step"]
    ema = None
    model.train()
    while True:
        now = time.time()
        if t_iter is not None:
            step_times.append(now - t_iter)
        t_iter = now
        run_elapsed = now - t_start
        if state["total_steps"] is None and len(step_times) >= 10:
            per_step = float(np.median(step_times[-10:]))
            left = budget - run_elapsed - 30.0  # leave time for the final save
            # 5% slack for held-out evaluations and checkpoint saves between the measured iterations.
            state["total_steps"] = state["step"] + max(1, int(0.95 * left / per_step))
            print(f"step time {per_step * 1000:.1f} ms: planning {state['total_steps']} steps", flush=True)
        if state["total_steps"] is not None and state["step"] >= state["total_steps"]:
            break
        if run_elapsed > budget:
            break
        total = state["total_steps"] or 10 ** 9
        s = state["step"]
        if s < warmup:
            lr = args.lr * (s + 1) / warmup
        else:
            progress = min(1.0, (s - warmup) / max(1, total - warmup))
            lr = args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for group in opt.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, n, (rows,), generator=gen)
        idx = starts[:, None] + torch.arange(SEQ_LEN + 1)[None, :]
        batch = stream_t[idx].to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=batch[:, :-1], use_cache=False, output_router_logits=True)
        # Next-token loss over all SEQ_LEN positions, plus the router balance loss of the score-routed layers.
        lm_loss = torch.nn.functional.cross_entropy(out.logits.float().reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        loss = lm_loss + model.config.router_aux_loss_coef * out.aux_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lv = float(lm_loss.detach())
        if not math.isfinite(lv):
            raise RuntimeError(f"loss is {lv} at step {s}")
        state["step"] += 1
        state["tokens"] += tokens_per_step
        ema = lv if ema is None else 0.98 * ema + 0.02 * lv
        held = ""
        if state["step"] % args.eval_every == 0 or state["step"] == first_step + 1:
            res = nll_per_window(model, eval_stream, SEQ_LEN, device, max_windows=8)
            held = f"{math.log(perplexity(res)[0]):.4f}"
            model.train()
            print(f"step {state['step']} loss {ema:.3f} heldout {held} lr {lr:.2e} "
                  f"{state['elapsed'] + time.time() - t_start:.0f}s", flush=True)
        if held or state["step"] % args.log_every == 0:
            log.writerow([state["step"], state["tokens"], f"{state['elapsed'] + time.time() - t_start:.1f}",
                          f"{lr:.3e}", f"{lv:.4f}", held])
        if time.time() - last_save > args.save_every:
            save_ckpt(ckpt_path, model, opt, state, time.time() - t_start)
            last_save = time.time()
    state["elapsed"] += time.time() - t_start
    save_ckpt(ckpt_path, model, opt, dict(state, elapsed=state["elapsed"]), 0.0)
    log_f.close()
    return state


def save_ckpt(path, model, opt, state, run_elapsed):
    st = dict(state)
    st["elapsed"] = state["elapsed"] + run_elapsed
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "state": st}, path + ".tmp")
    os.replace(path + ".tmp", path)


# ----------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--eval-text", required=True)
    ap.add_argument("--tokenizer", help="an existing tokenizer.json to use instead of training one")
    ap.add_argument("--minutes", type=float, default=8.0)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="a few steps of every stage, to check the pipeline")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--log-every", type=int, default=20, help="steps between rows of train_log.csv (evaluations always)")
    ap.add_argument("--save-every", type=float, default=120.0)
    ap.add_argument("--eval-context", type=int, default=SEQ_LEN)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    device = "cuda"
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    timings = {}

    t = time.time()
    train_docs = read_docs(os.path.join(args.corpus, "train.jsonl.xz"))
    out_tokenizer = os.path.join(args.out, "tokenizer.json")
    if args.resume and not args.tokenizer and os.path.exists(out_tokenizer):
        args.tokenizer = out_tokenizer  # the tokenizer the cached token stream was made with
    if args.tokenizer:
        tok_path = out_tokenizer
        if os.path.abspath(args.tokenizer) != os.path.abspath(tok_path):
            shutil.copyfile(args.tokenizer, tok_path)
        write_tokenizer_config(args.out)
    else:
        tok_path = train_tokenizer(train_docs, VOCAB, args.out)
    timings["tokenizer_s"] = time.time() - t
    tok = load_tokenizer(tok_path)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()

    t = time.time()
    stream_path = os.path.join(args.work, "train_ids.npy")
    with open(tok_path, "rb") as f:
        tok_hash = hashlib.sha256(f.read()).hexdigest()
    hash_path = stream_path + ".tokenizer-sha256"
    cached = args.resume and os.path.exists(stream_path) and os.path.exists(hash_path)
    if cached and open(hash_path).read().strip() == tok_hash:
        stream = np.load(stream_path)
    else:
        stream = encode_corpus(tok, train_docs)
        np.save(stream_path, stream)
        with open(hash_path, "w") as f:
            f.write(tok_hash + "\n")
    with open(args.eval_text, encoding="utf-8") as f:
        eval_text = f.read()
    held_ids = eval_ids(tok, eval_text)
    timings["tokenize_s"] = time.time() - t
    corpus_bytes = sum(len(d.encode()) for d in train_docs)
    print(f"corpus: {len(train_docs)} documents, {corpus_bytes / 1e6:.2f} MB, {len(stream)} tokens "
          f"({corpus_bytes / len(stream):.2f} bytes/token); held-out text {len(held_ids)} tokens", flush=True)

    model = make_model(device, args.seed)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"parameters: {n_params / 1e6:.2f} M", flush=True)
    if args.smoke:
        args.minutes, args.eval_every, args.warmup = min(args.minutes, 0.75), 10, 5
    t = time.time()
    state = train(args, model, stream, held_ids, device, os.path.join(args.out, "train_log.csv"))
    timings["train_s"] = time.time() - t
    print(f"trained {state['step']} steps, {state['tokens'] / 1e6:.1f} M tokens, {state['elapsed']:.0f} s", flush=True)

    # Export in the release format; the reference evaluates the weights the engine will load.
    t = time.time()
    model = model.float().cpu()
    tensors, ref = release_tensors(model)
    tensors = {k: v for k, v in tensors.items() if not k.startswith("mtp.")}  # no MTP layers in this model
    write_sharded(args.out, tensors, n_shards=2)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(legacy_config(NATIVE_CONFIG), f, indent=1)
    size = sum(os.path.getsize(os.path.join(args.out, n)) for n in os.listdir(args.out) if n.endswith(".safetensors"))
    timings["export_s"] = time.time() - t

    t = time.time()
    torch.backends.cuda.matmul.allow_tf32 = False  # the reference is plain fp32
    torch.backends.cudnn.allow_tf32 = False
    model = model.to(device)
    max_w = 2 if args.smoke else None
    trained = nll_per_window(model, held_ids, args.eval_context, device, max_windows=max_w)
    shipped_model = make_model(device, args.seed)
    missing, unexpected = shipped_model.load_state_dict({k: v.to(device) for k, v in ref.items()}, strict=False)
    missing = [m for m in missing if "inv_freq" not in m]
    if missing or unexpected:
        raise RuntimeError(f"dequantized state: missing {missing}, unexpected {unexpected}")
    shipped = nll_per_window(shipped_model, held_ids, args.eval_context, device, max_windows=max_w)
    timings["eval_s"] = time.time() - t
    ppl_trained, count = perplexity(trained)
    ppl_shipped, _ = perplexity(shipped)
    ci_windows = 8
    report = {
        "eval_text": os.path.basename(args.eval_text), "eval_context": args.eval_context, "eval_tokens": count,
        "eval_windows": len(shipped), "perplexity_trained_fp32": ppl_trained,
        "perplexity_shipped_reference": ppl_shipped, "uniform_perplexity": VOCAB,
        "ci_windows": ci_windows, "perplexity_shipped_reference_ci_windows": perplexity(shipped[:ci_windows])[0],
        "window_nll_shipped": [r[0] for r in shipped], "window_tokens": [r[1] for r in shipped],
        "heldout_ids_head": held_ids[:64], "heldout_ids_count": len(held_ids),
        "parameters": n_params, "safetensors_bytes": size, "train_steps": state["step"],
        "train_tokens": state["tokens"], "train_seconds": state["elapsed"], "corpus_tokens": int(len(stream)),
        "corpus_bytes": corpus_bytes, "corpus_documents": len(train_docs), "timings": timings, "smoke": args.smoke,
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__,
                     "tokenizers": __import__("tokenizers").__version__},
        "gpu": torch.cuda.get_device_name(0),
    }
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(report, f, indent=1)
    np.save(os.path.join(args.out, "heldout_ids.npy"), np.asarray(held_ids, dtype=np.int32))
    print(json.dumps({k: v for k, v in report.items() if not k.startswith(("window_", "heldout_ids"))}, indent=1))


if __name__ == "__main__":
    main()
