#!/usr/bin/env python3
"""Builds the tokenizer benchmark corpus: JSONL, one document (a JSON string of about 4 KB) per line.

    python3 bench/tokenizer/make_corpus.py --out .carry/tok_corpus.jsonl [--mb 6]

Mix (by bytes): ~45% English documentation (Debian's /usr/share/doc, licenses, man-page sources), ~30% source
code (C++ headers, Python standard library), ~25% multilingual text (the golden fixture strings: Chinese,
Japanese, Korean, Arabic, Hindi, emoji, JSON, ...). Files are read in sorted order, so the corpus is the same
on any Debian 12 machine with the same packages; the benchmark prints its SHA-256.
"""
import argparse
import glob
import gzip
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tools", "golden"))
import make_tokenizer_golden as golden  # noqa: E402

DOC_BYTES = 4096


def read_text(path):
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                data = f.read()
        else:
            with open(path, "rb") as f:
                data = f.read()
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError):
        return None


def collect(patterns, budget):
    out, total = [], 0
    for pattern in patterns:
        for path in sorted(glob.glob(pattern, recursive=True)):
            if total >= budget:
                return out
            if not os.path.isfile(path) or os.path.getsize(path) > 2_000_000:
                continue
            text = read_text(path)
            if text and "\x00" not in text:
                out.append(text)
                total += len(text.encode("utf-8"))
    return out


def chunk(texts):
    docs = []
    for t in texts:
        b = 0
        while b < len(t):
            e = min(len(t), b + DOC_BYTES)
            nl = t.rfind("\n", b + DOC_BYTES // 2, e)
            if e < len(t) and nl > b:
                e = nl + 1
            docs.append(t[b:e])
            b = e
    return docs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--mb", type=float, default=6.0)
    args = ap.parse_args()
    total = int(args.mb * 1e6)
    english = collect(["/usr/share/common-licenses/*", "/usr/share/doc/**/*.md", "/usr/share/doc/**/README*",
                       "/usr/share/doc/**/*.txt", "/usr/share/doc/**/changelog*"], total * 0.45)
    code = collect(["/usr/include/c++/12/bits/*.h", "/usr/include/c++/12/*", "/usr/lib/python3.11/*.py"],
                   total * 0.30)
    multi = []
    size = 0
    rep = 0
    while size < total * 0.25:
        for name in golden.MAIN:
            text = "\n".join(golden.make_strings([], 400, seed=golden.hash_name(name) + rep))
            multi.append(text)
            size += len(text.encode("utf-8"))
        rep += 1
    docs = chunk(english) + chunk(code) + chunk(multi)
    with open(args.out, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    print(f"{len(docs)} documents, {nbytes / 1e6:.2f} MB -> {args.out}")


if __name__ == "__main__":
    main()
