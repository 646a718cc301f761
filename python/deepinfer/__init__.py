"""DeepInfer: offline inference for DeepSeek-V4 models, mirroring vLLM's offline API.

    from deepinfer import LLM, SamplingParams
    llm = LLM(model="DIR")   # else $DEEPINFER_HF_MODEL_DIR, else the built-in default model
    outs = llm.generate(["Hello", {"prompt_token_ids": [0, 5, 9]}],
                        SamplingParams(temperature=0.8, top_p=0.95, max_tokens=64, seq_seed=7))
    for o in outs:
        print(o.prompt, o.outputs[0].text, o.outputs[0].token_ids, o.outputs[0].finish_reason)

A bad request (empty prompt, too long, bad sampling value, malformed so_args, ...) does not raise: its output
has finish_reason "error" and a message in `error`, and the other requests run normally. Problems with the
engine itself (a missing checkpoint, a bad option) raise deepinfer.Error.
"""

import json as _json

from ._deepinfer import (  # noqa: F401
    CompletionOutput,
    Error,
    LogprobEntry,
    RequestMetrics,
    RequestOutput,
    _check_sampling_params,
    _chat_options,
    _default_sampling_params,
    _Engine,
    default_model_dir,
)

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "LogprobEntry", "RequestMetrics", "Error"]

_DEFAULTS = _default_sampling_params()


class SamplingParams:
    """Per-request generation settings (vLLM names; `seq_seed` seeds this request, `so_args` constrains the
    output with a grammar: {"type": "regex" | "json_schema" | "json_object" | "ebnf" | "choice", "value": ...}).

    Values are checked when the request runs, so a bad value fails that request alone; call validate() to
    check eagerly. Defaults: temperature 1.0, top_p 1.0, top_k 0 (all), min_p 0, no penalties, max_tokens 16.
    """

    __slots__ = tuple(_DEFAULTS)

    def __init__(self, **kwargs):
        for name, value in _DEFAULTS.items():
            setattr(self, name, list(value) if isinstance(value, list) else value)
        for name, value in kwargs.items():
            if name == "seed":  # vLLM's name for the per-request seed
                name = "seq_seed"
            if name not in _DEFAULTS:
                raise TypeError(f"SamplingParams got an unexpected keyword argument '{name}'")
            setattr(self, name, value)

    def to_dict(self):
        return {name: getattr(self, name) for name in _DEFAULTS}

    def validate(self):
        """Raises deepinfer.Error naming the first bad field."""
        _check_sampling_params(self)
        return self

    def clone(self):
        return SamplingParams(**self.to_dict())

    def __eq__(self, other):
        return isinstance(other, SamplingParams) and self.to_dict() == other.to_dict()

    def __repr__(self):
        changed = {k: v for k, v in self.to_dict().items() if v != _DEFAULTS[k]}
        return "SamplingParams(" + ", ".join(f"{k}={v!r}" for k, v in changed.items()) + ")"


def _as_list(prompts):
    # One prompt (a string, a dict, or a list of token ids) or a list of them.
    if isinstance(prompts, (str, dict)):
        return [prompts]
    if isinstance(prompts, (list, tuple)) and prompts and all(isinstance(t, int) for t in prompts):
        return [list(prompts)]
    return list(prompts)


def _params_for(n, sampling_params):
    if sampling_params is None:
        return [SamplingParams()] * n
    if isinstance(sampling_params, (list, tuple)):
        if len(sampling_params) != n:
            raise ValueError(f"{len(sampling_params)} sampling parameter sets for {n} prompts")
        return list(sampling_params)
    return [sampling_params] * n


class LLM:
    """An engine over one checkpoint directory (continuous batching, async scheduling on by default).

    Engine options: tokenizer (path), device ("cpu"), num_threads, max_batch_tokens, max_seqs,
    max_prefill_chunk, memory_budget (bytes or "4GiB"), block_tokens, max_model_len, async_scheduling,
    batch_invariant, seed (for requests without seq_seed), load_format.
    """

    def __init__(self, model=None, **options):
        options["model"] = model
        self._engine = _Engine(options)

    def generate(self, prompts, sampling_params=None, *, on_output=None, use_tqdm=False):
        """Runs the prompts to completion and returns one RequestOutput per prompt, in order.

        prompts: a string, a list of token ids, {"prompt_token_ids": [...]}, {"prompt": "..."},
        {"messages": [...]}, or a list of these. sampling_params: one for all prompts or one per prompt.
        on_output(RequestOutput) is called after every engine step for each request that changed
        (outputs[0].delta_text / delta_token_ids hold what is new).
        """
        del use_tqdm  # accepted for vLLM compatibility
        prompts = _as_list(prompts)
        return self._engine.generate(prompts, _params_for(len(prompts), sampling_params), on_output)

    def chat(self, messages, sampling_params=None, *, thinking_mode="chat", reasoning_effort=None, on_output=None):
        """Chat completion with the model's chat format (DeepSeek-V4). messages: one conversation (a list of
        {"role", "content"} dicts) or a list of conversations."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = [{"messages": c} for c in conversations]
        chat = _chat_options(thinking_mode, reasoning_effort)
        return self._engine.generate(prompts, _params_for(len(prompts), sampling_params), on_output, chat)

    # The step-driven form (what a server uses).
    def add_request(self, prompt, sampling_params=None):
        return self._engine.add_request(prompt, sampling_params)

    def step(self):
        return self._engine.step()

    def abort_request(self, request_id):
        return self._engine.abort_request(request_id)

    def has_unfinished_requests(self):
        return self._engine.has_unfinished_requests()

    # Tokenizer and chat format (raise deepinfer.Error when the model has no tokenizer).
    def encode(self, text, add_special_tokens=False):
        return self._engine.encode(text, add_special_tokens)

    def decode(self, token_ids, skip_special_tokens=False):
        return self._engine.decode(list(token_ids), skip_special_tokens)

    def apply_chat_template(self, messages, thinking_mode="chat", reasoning_effort=None):
        return self._engine.apply_chat_template(_json.dumps(messages), _chat_options(thinking_mode, reasoning_effort))

    @property
    def model_info(self):
        return self._engine.model_info()

    @property
    def async_scheduling(self):
        return self._engine.async_scheduling()

    def memory_report(self):
        return self._engine.memory_report()

    def stats(self):
        return self._engine.stats()
