#!/usr/bin/env python3
"""The reference side of step_bench, on the same GPU in the same run: the card's copy bandwidth and bf16
matrix rate (the floors' denominators), then transformers' DeepseekV4ForCausalLM in bf16 with eager
attention, random weights, on the same config.json: prefill of BxL prompts (logits for the last token) and
decode steps at several batch sizes over a common context (one prefilled cache repeated along the batch).

  python3 hf_step_bench.py CONFIG_DIR --out results.json [--context 4096] [--decode-batches 1,8,32,128]
          [--decode-steps 10] [--prefill 1x4096,8x2048] [--repeats 3] [--skip-model] [--tid2eid random|zeros]

transformers initialises the hash-routing tables to zeros; by default they are drawn like step_bench's (k distinct
random experts per token id), so both engines' hash layers touch the same number of experts.

Every figure is written to --out as soon as it is measured; a failing measurement records its error and the
rest go on.
"""
import argparse
import json
import time
import traceback

import torch


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def timed(fn, repeats, warmup=1):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return median(times)


def copy_bandwidth_gbs():
    """Device-to-device copy of 4 GiB, counting bytes read and written."""
    n = 1 << 31  # bf16 elements = 4 GiB
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    s = timed(lambda: dst.copy_(src), 10, warmup=3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n * 2 / s / 1e9


def matmul_tflops():
    """8192^3 bf16 products on random data."""
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    s = timed(lambda: a @ b, 10, warmup=3)
    del a, b
    torch.cuda.empty_cache()
    return 2 * 8192**3 / s / 1e12


def expand_cache(cache, batch):
    """Repeats every batch-1 tensor the cache holds along the batch: `batch` sequences with one history."""
    if batch == 1:
        return cache
    seen = set()

    def rep(t):
        return t.repeat(batch, *([1] * (t.dim() - 1)))

    def walk(obj, depth):
        if id(obj) in seen or depth > 6 or isinstance(obj, torch.nn.Module):
            return
        seen.add(id(obj))
        if isinstance(obj, list):
            for i, x in enumerate(obj):
                if torch.is_tensor(x):
                    if x.dim() > 0 and x.shape[0] == 1:
                        obj[i] = rep(x)
                else:
                    walk(x, depth + 1)
            return
        if isinstance(obj, dict):
            for k, x in list(obj.items()):
                if torch.is_tensor(x):
                    if x.dim() > 0 and x.shape[0] == 1:
                        obj[k] = rep(x)
                else:
                    walk(x, depth + 1)
            return
        if not hasattr(obj, "__dict__"):
            return
        for k, x in list(vars(obj).items()):
            if torch.is_tensor(x):
                if x.dim() > 0 and x.shape[0] == 1:
                    setattr(obj, k, rep(x))
            else:
                walk(x, depth + 1)

    walk(cache, 0)
    return cache


def randomize_tid2eid(model, seed=2):
    """transformers initialises the hash-routed layers' tid2eid to zeros (every token on expert 0, six times);
    step_bench's random weights draw k distinct experts per token id. Draws them the same way here, so that both
    engines' hash layers touch the experts uniformly routed tokens would. Returns the number of tables drawn."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    drawn = 0
    with torch.no_grad():
        for name, buf in list(model.named_buffers()) + list(model.named_parameters()):
            if name.split(".")[-1] != "tid2eid":
                continue
            vocab, k = buf.shape
            experts = model.config.n_routed_experts
            for r0 in range(0, vocab, 16384):  # k distinct of E per row: the top k of random keys
                n = min(16384, vocab - r0)
                keys = torch.rand(n, experts, device=buf.device, generator=gen)
                buf[r0:r0 + n] = keys.topk(k, dim=1).indices.to(buf.dtype)
            drawn += 1
    return drawn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config_dir")
    ap.add_argument("--out", required=True)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--decode-batches", default="1,8,32,128")
    ap.add_argument("--decode-steps", type=int, default=10)
    ap.add_argument("--prefill", default="1x4096,8x2048")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-model", action="store_true", help="measure the card only")
    ap.add_argument("--tid2eid", choices=["random", "zeros"], default="random",
                    help="hash-routing tables: k distinct random experts per token (as step_bench's random "
                         "weights), or transformers' initial zeros (runs up to 14)")
    args = ap.parse_args()

    res = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}

    def save():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=2)

    res["bandwidth_gbs"] = copy_bandwidth_gbs()
    res["matmul_tflops"] = matmul_tflops()
    print(f"card: copy {res['bandwidth_gbs']:.0f} GB/s, bf16 matmul {res['matmul_tflops']:.0f} TFLOP/s", flush=True)
    save()
    if args.skip_model:
        return

    import transformers
    from transformers import AutoConfig, DeepseekV4ForCausalLM

    res["transformers"] = transformers.__version__
    config = AutoConfig.from_pretrained(args.config_dir)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    t0 = time.perf_counter()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device("cuda"):
        model = DeepseekV4ForCausalLM(config)
    model.eval()
    torch.set_default_dtype(torch.float32)
    res["tid2eid"] = args.tid2eid
    if args.tid2eid == "random":
        res["tid2eid_tables"] = randomize_tid2eid(model)
    torch.cuda.synchronize()
    res["load_s"] = time.perf_counter() - t0
    res["params"] = sum(p.numel() for p in model.parameters())
    print(f"transformers {transformers.__version__}: {res['params'] / 1e9:.2f} B params in bf16, "
          f"built in {res['load_s']:.1f} s", flush=True)
    save()
    vocab = config.vocab_size
    gen = torch.Generator(device="cuda").manual_seed(1)

    def tokens(b, n):
        return torch.randint(2, vocab, (b, n), device="cuda", generator=gen)

    res["prefill"] = []
    for shape in [s for s in args.prefill.split(",") if s]:
        b, n = (int(x) for x in shape.split("x"))
        entry = {"batch": b, "length": n}
        try:
            ids = tokens(b, n)
            with torch.no_grad():
                s = timed(lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1), args.repeats)
            entry.update(ms=s * 1e3, tokens_per_s=b * n / s)
            print(f"prefill {shape}: {s * 1e3:.1f} ms", flush=True)
        except Exception as e:  # noqa: BLE001 - recorded, the other shapes still run
            entry["error"] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        torch.cuda.empty_cache()
        res["prefill"].append(entry)
        save()

    res["decode"] = []
    for b in [int(x) for x in args.decode_batches.split(",") if x]:
        entry = {"batch": b, "context": args.context}
        try:
            with torch.no_grad():
                out = model(input_ids=tokens(1, args.context), use_cache=True, logits_to_keep=1)
                cache = expand_cache(out.past_key_values, b)
                del out
                times = []
                for step in range(args.decode_steps + 2):
                    ids = tokens(b, 1)
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
                    torch.cuda.synchronize()
                    if step >= 2:
                        times.append(time.perf_counter() - t0)
                    cache = out.past_key_values
                    assert out.logits.shape[0] == b, f"logits batch {out.logits.shape[0]} != {b}"
            entry["step_ms"] = median(times) * 1e3
            print(f"decode batch {b}: {entry['step_ms']:.2f} ms/step", flush=True)
        except Exception as e:  # noqa: BLE001
            entry["error"] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        cache = out = None
        torch.cuda.empty_cache()
        res["decode"].append(entry)
        save()


if __name__ == "__main__":
    main()
