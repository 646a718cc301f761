#!/usr/bin/env python3
"""Offline batched inference with DeepInfer: open an LLM, generate for a few prompts with SamplingParams
(greedy, seeded sampling, and output constrained by a JSON schema), print the outputs.

    ./build.sh && python3 examples/offline_inference.py [MODEL_DIR]

Without MODEL_DIR it uses $DEEPINFER_HF_MODEL_DIR, else DeepInfer's built-in default model,
models/deepinfer-tiny-v4: a 17.7 M-parameter DeepSeek-V4 trained on Python's sources and documentation (it
writes Python-looking code, not correct programs). $DEEPINFER_BUILD_DIR names the build directory (default:
build).
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.environ.get("DEEPINFER_BUILD_DIR", os.path.join(ROOT, "build")), "python"))

from deepinfer import LLM, SamplingParams  # noqa: E402


def main():
    llm = LLM(sys.argv[1] if len(sys.argv) > 1 else None)
    info = llm.model_info
    print(f"model: {info['dir']} ({info['model_type']}, vocabulary {info['vocab_size']}, "
          f"tokenizer: {'yes' if info['has_tokenizer'] else 'no'})")

    texts = ["def fibonacci(n):", "class Stack:\n    \"\"\"", "Is the sky blue? Answer in JSON:"]
    if info["has_tokenizer"]:
        prompts = texts
    else:
        # No tokenizer: token-id prompts only (outputs carry token ids, their text stays empty).
        prompts = [{"prompt_token_ids": [0] + [3 + (7 * i + k) % 200 for k in range(12)]} for i in range(3)]

    schema = {
        "type": "object",
        "properties": {"answer": {"enum": ["yes", "no"]}, "confidence": {"enum": ["low", "medium", "high"]}},
        "required": ["answer", "confidence"],
        "additionalProperties": False,
    }
    params = [
        SamplingParams(temperature=0, max_tokens=24),                            # greedy
        SamplingParams(temperature=0.8, top_p=0.95, max_tokens=24, seq_seed=7),  # the same text on every run
        SamplingParams(temperature=0.7, max_tokens=96, seq_seed=1, so_args={"type": "json_schema", "value": schema}),
    ]
    outputs = llm.generate(prompts, params)

    for prompt, params_, out in zip(prompts, params, outputs):
        completion = out.outputs[0]
        print("-" * 80)
        shown = out.prompt if out.prompt is not None else prompt
        if out.prompt is None and info["has_tokenizer"] and out.prompt_token_ids:
            shown = llm.decode(out.prompt_token_ids, skip_special_tokens=True)  # token-id prompts: show their text
        print(f"prompt:        {shown!r}")
        print(f"params:        {params_}")
        if out.error:
            print(f"error:         {out.error}")
            continue
        print(f"text:          {completion.text!r}")
        print(f"token ids:     {completion.token_ids}")
        print(f"finish reason: {completion.finish_reason}")
        print(f"TTFT:          {1e3 * out.metrics.time_to_first_token:.1f} ms")


if __name__ == "__main__":
    main()
