#!/usr/bin/env python3
"""Golden tokenizer fixtures from Hugging Face `tokenizers` (run on the GPU machine, where it is installed).

    python3 tools/golden/make_tokenizer_golden.py --data tests/data/tokenizer --out $OUT

For every tokenizer in tests/data/tokenizer/<name>/ (and every variant in variants.json) it writes
<out>/golden_<name>.json.gz (variants together in golden_variants.json.gz):
    {"tokenizer": name, "tokenizers_version": "...", "cases": [
        {"text": str, "ids": [...],                 # encode(text, add_special_tokens=False)
         "ids_special": [...],                      # encode(text, add_special_tokens=True) (first cases only)
         "decoded": str,                            # decode(ids) when it differs from text
         "decoded_skip": str}]}                     # decode(ids, skip_special_tokens=True) when it differs
The strings (>= 1,000 per tokenizer) are generated deterministically by make_strings(); `--list NAME` prints
them without needing `tokenizers`, so the generator can be checked anywhere.
"""
import argparse
import gzip
import json
import os
import random
import sys

NUM_STRINGS = 1200
NUM_VARIANT_STRINGS = 400
NUM_SPECIAL = 150

ENGLISH = [
    "The quick brown fox jumps over the lazy dog.",
    "It's a truth universally acknowledged that they'll say we've done what I'd've done.",
    "Mixture-of-Experts models route each token to a few experts; DeepSeek-V4 uses 384 of them.",
    "He said, \"Don't panic!\" -- and then (quietly) left at 3:45 p.m. on 2024-12-31.",
    "URLs like https://example.com/a/b?c=1&d=2#frag and e-mails like jane.doe+tag@example.org.",
    "CamelCaseIdentifiers, snake_case_names, SCREAMING_CASE and kebab-case-words coexist.",
    "Prices: $1,234.56, 99%, 3.14159, 6.02e23, -0.5 and 1/3.",
]
CHINESE = ["深度求索发布了新的大语言模型，支持百万词元的上下文。", "我爱北京天安门，天安门上太阳升。",
           "今天天气很好，我们去公园散步吧！", "机器学习（Machine Learning）是人工智能的一个分支。"]
JAPANESE = ["今日はいい天気ですね。カタカナとひらがなと漢字が混ざっています。", "東京スカイツリーは高さ634メートルです。",
            "ｶﾀｶﾅ（半角）とカタカナ（全角）。"]
KOREAN = ["안녕하세요, 만나서 반갑습니다.", "한국어는 한글로 씁니다. 서울특별시 강남구."]
ARABIC = ["مرحبا بالعالم! كيف حالك اليوم؟", "اللغة العربية تكتب من اليمين إلى اليسار ١٢٣٤٥."]
HINDI = ["नमस्ते दुनिया! आप कैसे हैं?", "हिन्दी देवनागरी लिपि में लिखी जाती है।"]
OTHER = ["Привет, мир! Съешь же ещё этих мягких французских булок.", "Γειά σου Κόσμε! Σίσυφος.",
         "שלום עולם", "สวัสดีชาวโลก", "Xin chào thế giới, tiếng Việt có dấu.", "Zażółć gęślą jaźń. Ærø Øster Straße.",
         "İstanbul'da ıslak ılık İĞDIR", "ǅungla ǈj ǋ ﬁ ﬂ ﬀ Ⅻ ① ㎏ ™ ½ ²"]
CODE = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\treturn v.size() > 2 ? 0 : 1;\n}\n",
    "for (let i = 0; i < arr.length; i++) { console.log(`item ${i}: ${arr[i]}`); }",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
    "fn main() -> Result<(), Box<dyn Error>> { let x: u32 = 0xFF_u32 << 4; Ok(()) }",
    "    x = [a**2 for a in range(10) if a % 2 == 0]  # squares\r\n",
    "<html><body class=\"main\"><p>Hello &amp; welcome</p></body></html>",
]
JSONS = [
    '{"name": "DeepInfer", "version": [0, 1, 0], "nested": {"ok": true, "value": null, "pi": 3.14}}',
    '[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! \\u4f60\\u597d"}]',
    '{"a":1,"b":[1,2,{"c":"d"}],"e":"\\n\\t\\"quoted\\""}',
]
EMOJI = ["👍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "❤️", "🇯🇵", "🧑🏿‍💻", "😀😃😄", "✈︎", "🫠", "👩‍❤️‍💋‍👨"]
COMBINING = ["e\u0301", "a\u0308\u0304", "n\u0303", "\u0915\u094d\u0937", "Z\u0351\u036b\u0343\u036a\u0302\u036b",
             "\u1100\u1161\u11a8", "o\u0338", "\u00e9 vs e\u0301"]
EDGE = ["\ufffd", "\ufeff", "\u200b", "\u200c\u200d", "\u00a0", "\u0085", "\u2028", "\u2029", "\u3000", "\u180e",
        "\x00", "\x07", "\x7f", "\x80\x9f", "\ue000", "\U0010ffff", "\ufffe\uffff", "\u00c3\u00a9", "\u00e2\u0080\u0099",
        "\\x80\\xff", "%C3%A9", "\u0000\u0001", "\U0001f600\ufffd", "\u0131\u0130", "\u017ft", "\u212a"]
WS = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r\n\r\n", " \n ", "\t\t  ", "        ", "\r", "\u3000\u3000"]


def fragment(rng):
    kind = rng.randrange(14)
    if kind == 0:
        return rng.choice(ENGLISH)
    if kind == 1:
        return rng.choice(CHINESE)
    if kind == 2:
        return rng.choice(JAPANESE)
    if kind == 3:
        return rng.choice(KOREAN)
    if kind == 4:
        return rng.choice(ARABIC + HINDI)
    if kind == 5:
        return rng.choice(OTHER)
    if kind == 6:
        return rng.choice(CODE)
    if kind == 7:
        return rng.choice(JSONS)
    if kind == 8:
        return "".join(rng.choice(EMOJI) for _ in range(rng.randint(1, 4)))
    if kind == 9:
        return rng.choice(COMBINING)
    if kind == 10:
        return "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 24)))
    if kind == 11:
        return rng.choice(EDGE)
    if kind == 12:
        words = rng.choice(ENGLISH).split()
        return " ".join(rng.sample(words, min(len(words), rng.randint(1, 5))))
    return "".join(chr(rng.randint(0x20, 0x2FFF)) for _ in range(rng.randint(1, 6)))


def make_strings(specials, n, seed=1234):
    rng = random.Random(seed)
    out = ["", " ", "a", "Hello", " Hello", "Hello world", "hello\n", "\n", "\r\n", "  leading", "trailing  ",
           "1234567890", "3.14", "don't", "I'M", "you've", "WE'LL", "'s", "''", "...", "!!!", "¿Qué?", "a\u0301"]
    # Very long words and runs.
    out += ["supercalifragilistic" * 40, "x" * 3000, "7" * 1500, " " * 700, "\n" * 300, "ab " * 400,
            "你" * 800, "😀" * 300, "-=" * 500, "a\u0301" * 400, "\t" * 200 + "x", "Ω" * 600]
    for _ in range(40):  # specials embedded in text, with and without surrounding spaces
        if not specials:
            break
        s = rng.choice(specials)
        out.append(rng.choice(["", " ", "x", "word "]) + s + rng.choice(["", " ", "y", " next", "\n"]) +
                   rng.choice(specials))
        out.append(s[: max(1, len(s) // 2)] + rng.choice(ENGLISH)[:10])  # a truncated special token
    while len(out) < n:
        parts = []
        for _ in range(rng.randint(1, 5)):
            parts.append(fragment(rng))
            parts.append(rng.choice(WS + ["", "", "", ", ", ". ", "-", "/"]))
            if specials and rng.random() < 0.08:
                parts.append(rng.choice(specials))
        s = "".join(parts)
        if rng.random() < 0.15:
            s = rng.choice(WS) + s
        if rng.random() < 0.1:
            s = s.upper()
        out.append(s)
    return out[:n]


def added_contents(tok_json, limit=40):
    added = [t["content"] for t in tok_json.get("added_tokens", [])]
    # Keep the named ones (skip placeholder runs) so strings stay short.
    named = [a for a in added if "place" not in a and "reserved" not in a]
    return sorted(named)[:limit] + [a for a in added if a not in named][:3]


def load_json(path):
    if path.endswith(".gz"):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return json.load(f)
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def build_variant(data_dir, spec):
    base = load_json(os.path.join(data_dir, spec["base"], "tokenizer.json.gz"))
    for key, value in spec.get("replace", {}).items():
        base[key] = value
    next_id = max([max(base["model"]["vocab"].values())] + [t["id"] for t in base["added_tokens"]]) + 1
    for t in spec.get("add_tokens", []):
        assert t["content"] not in base["model"]["vocab"], t["content"]
        base["added_tokens"].append(dict(t, id=next_id))
        next_id += 1
    return base


MAIN = ["deepseek_v4", "llama2", "llama3", "qwen3", "gpt4o"]


def run_case_set(tokenizers, tok_json, name, n):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_str(json.dumps(tok_json))
    strings = make_strings(added_contents(tok_json), n, seed=hash_name(name))
    encs = tok.encode_batch(strings, add_special_tokens=False)
    cases = []
    for i, (s, e) in enumerate(zip(strings, encs)):
        ids = e.ids
        c = {"text": s, "ids": ids}
        if i < NUM_SPECIAL:
            c["ids_special"] = tok.encode(s, add_special_tokens=True).ids
        try:  # some decoders panic on edge cases (Strip with stop > 0 on an empty text)
            d = tok.decode(ids, skip_special_tokens=False)
            ds = tok.decode(ids, skip_special_tokens=True)
        except BaseException as e:  # pyo3's PanicException is not an Exception
            c["decode_error"] = repr(e)[:200]
            cases.append(c)
            continue
        if d != s:
            c["decoded"] = d
        if ds != d:
            c["decoded_skip"] = ds
        cases.append(c)
    return {"tokenizer": name, "tokenizers_version": tokenizers.__version__, "cases": cases}


def hash_name(name):
    return sum((i + 1) * ord(c) for i, c in enumerate(name))


def write_gz(path, obj):
    data = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    with open(path, "wb") as f:
        with gzip.GzipFile(fileobj=f, mode="wb", compresslevel=9, mtime=0) as g:
            g.write(data)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="tests/data/tokenizer")
    ap.add_argument("--out")
    ap.add_argument("--variants-only", action="store_true")
    ap.add_argument("--list", help="print the strings generated for this tokenizer and exit")
    args = ap.parse_args()
    variants = load_json(os.path.join(args.data, "variants.json"))["variants"]
    if args.list:
        spec = next((v for v in variants if v["name"] == args.list), None)
        tj = build_variant(args.data, spec) if spec else load_json(os.path.join(args.data, args.list, "tokenizer.json.gz"))
        n = NUM_VARIANT_STRINGS if spec else NUM_STRINGS
        for s in make_strings(added_contents(tj), n, seed=hash_name(args.list)):
            print(json.dumps(s, ensure_ascii=False))
        return
    import tokenizers
    os.makedirs(args.out, exist_ok=True)
    for name in MAIN:
        if os.path.exists(os.path.join(args.out, f"golden_{name}.json.gz")) or args.variants_only:
            continue
        tj = load_json(os.path.join(args.data, name, "tokenizer.json.gz"))
        res = run_case_set(tokenizers, tj, name, NUM_STRINGS)
        write_gz(os.path.join(args.out, f"golden_{name}.json.gz"), res)
        print(f"{name}: {len(res['cases'])} cases", flush=True)
    allv = {"tokenizers_version": tokenizers.__version__, "variants": []}
    for spec in variants:
        try:
            res = run_case_set(tokenizers, build_variant(args.data, spec), spec["name"], NUM_VARIANT_STRINGS)
        except BaseException as e:  # report and keep going: one bad variant must not cost the whole run
            print(f"variant {spec['name']} failed: {e!r}", file=sys.stderr, flush=True)
            continue
        allv["variants"].append(res)
        print(f"{spec['name']}: {len(res['cases'])} cases", flush=True)
    write_gz(os.path.join(args.out, "golden_variants.json.gz"), allv)


if __name__ == "__main__":
    main()
