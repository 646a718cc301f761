#!/usr/bin/env python3
"""Hugging Face tokenizers on the same corpus as bench_tokenizer, in the same run, and the comparison.

    python3 bench/tokenizer/hf_bench.py --tokenizer tests/data/tokenizer/deepseek_v4/tokenizer.json.gz \
        --corpus corpus.jsonl --ours ours.json --out bench_results.json

Measures encode(doc, add_special_tokens=False) one document at a time on one thread (best of --repeat), and
encode_batch over all documents on all cores; hashes each document's ids as bench_tokenizer does and counts
documents whose ids differ. Prints a Markdown table.
"""
import argparse
import gzip
import hashlib
import json
import os
import platform
import time


def fnv_ids(ids):
    h = 0xCBF29CE484222325
    for i in ids:
        u = i & 0xFFFFFFFF
        for k in range(4):
            h ^= (u >> (8 * k)) & 0xFF
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--ours", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    import tokenizers
    from tokenizers import Tokenizer

    with open(args.corpus, "rb") as f:
        raw = f.read()
    docs = [json.loads(line) for line in raw.decode("utf-8").split("\n") if line]
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    mb = nbytes / 1e6
    t0 = time.perf_counter()
    opener = gzip.open if args.tokenizer.endswith(".gz") else open
    with opener(args.tokenizer, "rt", encoding="utf-8") as f:
        tok = Tokenizer.from_str(f.read())
    load_s = time.perf_counter() - t0

    best_single, ids_all = 1e30, None
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        out = [tok.encode(d, add_special_tokens=False).ids for d in docs]
        best_single = min(best_single, time.perf_counter() - t0)
        ids_all = out
    best_batch = 1e30
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        tok.encode_batch(docs, add_special_tokens=False)
        best_batch = min(best_batch, time.perf_counter() - t0)
    hashes = [fnv_ids(ids) for ids in ids_all]
    with open(args.ours) as f:
        ours = json.load(f)
    mismatch = [i for i, (a, b) in enumerate(zip(hashes, ours["hashes"])) if a != b]
    if len(ours["hashes"]) != len(hashes):
        mismatch.append(-1)
    res = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "corpus_sha256": hashlib.sha256(raw).hexdigest(),
        "docs": len(docs), "bytes": nbytes, "tokens": sum(len(x) for x in ids_all),
        "hf": {"version": tokenizers.__version__, "load_s": load_s, "single_s": best_single,
               "single_mb_s": mb / best_single, "batch_s": best_batch, "batch_mb_s": mb / best_batch},
        "deepinfer": {k: v for k, v in ours.items() if k != "hashes"},
        "mismatched_docs": len(mismatch),
        "mismatch_examples": [{"doc": i, "text": docs[i], "hf_ids": ids_all[i]} for i in mismatch[:5] if i >= 0],
    }
    res["single_ratio"] = res["deepinfer"]["single_mb_s"] / res["hf"]["single_mb_s"]
    res["batch_ratio"] = res["deepinfer"]["batch_mb_s"] / res["hf"]["batch_mb_s"]
    with open(args.out, "w") as f:
        json.dump(res, f, ensure_ascii=False, indent=1)
    d, h = res["deepinfer"], res["hf"]
    print(f"corpus: {len(docs)} docs, {mb:.2f} MB, sha256 {res['corpus_sha256'][:16]}; machine: {res['machine']}")
    print("| implementation | single-thread MB/s | batch MB/s (threads) | load s |")
    print("| --- | --- | --- | --- |")
    print(f"| HF tokenizers {h['version']} | {h['single_mb_s']:.2f} | {h['batch_mb_s']:.2f} ({os.cpu_count()}) | "
          f"{h['load_s']:.2f} |")
    print(f"| deepinfer | {d['single_mb_s']:.2f} | {d['batch_mb_s']:.2f} ({d['batch_threads']}) | {d['load_s']:.2f} |")
    print(f"| ratio | {res['single_ratio']:.2f}x | {res['batch_ratio']:.2f}x | |")
    print(f"documents whose ids differ: {res['mismatched_docs']}")


if __name__ == "__main__":
    main()
