#!/usr/bin/env python3
"""Builds the training corpus of the default model from Python 3.11's own sources and documentation.

Both come from Debian 12 packages and are under the PSF License Version 2 (Debian's copyright file for
the packages lists the few parts with other permissive licenses):
  libpython3.11-stdlib  /usr/lib/python3.11/**.py          the standard library
  libpython3.11-testsuite  /usr/lib/python3.11/test/**.py  its test suite
  python3.11-doc        /usr/share/doc/python3.11/html/_sources/**.rst.txt   the reStructuredText docs

Writes OUT/train.jsonl.xz and OUT/heldout.jsonl.xz, one {"path", "text"} document per line, sorted by
path. A document is held out when the SHA-1 of its path is 0 mod 50 (about 2%), so the split is stable.
Files over 256 KiB (generated tables) and files that are not UTF-8 are skipped. OUT/heldout.txt is the
perplexity text: the first 4 KiB (cut at a line end) of every held-out document, in path order, joined by
blank lines.

Usage: python3 make_corpus.py OUT_DIR [--stdlib DIR] [--docs DIR]
"""
import argparse
import hashlib
import json
import lzma
import os
import sys

MAX_BYTES = 256 * 1024
SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def collect(root, suffix, prefix):
    docs = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            if not name.endswith(suffix):
                continue
            path = os.path.join(dirpath, name)
            if os.path.getsize(path) > MAX_BYTES:
                continue
            try:
                with open(path, encoding="utf-8") as f:
                    text = f.read()
            except UnicodeDecodeError:
                continue
            if text.strip():
                docs.append((prefix + os.path.relpath(path, root), text))
    return docs


def held_out(path):
    return int(hashlib.sha1(path.encode()).hexdigest(), 16) % 50 == 0


def eval_text(docs, per_doc=4096):
    parts = []
    for _, text in docs:
        if len(text.encode()) > per_doc:
            cut = text.encode()[:per_doc].decode("utf-8", errors="ignore")
            text = cut[:cut.rfind("\n") + 1] if "\n" in cut else cut
        parts.append(text.rstrip("\n") + "\n")
    return "\n".join(parts)


def write(path, docs):
    with lzma.open(path, "wt", encoding="utf-8", preset=6) as f:
        for p, text in docs:
            f.write(json.dumps({"path": p, "text": text}, ensure_ascii=False) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--stdlib", default="/usr/lib/python3.11")
    ap.add_argument("--docs", default="/usr/share/doc/python3.11/html/_sources")
    args = ap.parse_args()
    for d in (args.stdlib, args.docs):
        if not os.path.isdir(d):
            sys.exit(f"missing {d}: apt-get install libpython3.11-stdlib libpython3.11-testsuite python3.11-doc")
    docs = collect(args.stdlib, ".py", "Lib/") + collect(args.docs, ".rst.txt", "Doc/")
    docs.sort()
    train = [d for d in docs if not held_out(d[0])]
    held = [d for d in docs if held_out(d[0])]
    os.makedirs(args.out_dir, exist_ok=True)
    write(os.path.join(args.out_dir, "train.jsonl.xz"), train)
    write(os.path.join(args.out_dir, "heldout.jsonl.xz"), held)
    with open(os.path.join(args.out_dir, "heldout.txt"), "w", encoding="utf-8") as f:
        f.write(eval_text(held))
    for name, part in (("train", train), ("heldout", held)):
        print(f"{name}: {len(part)} documents, {sum(len(t.encode()) for _, t in part) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
