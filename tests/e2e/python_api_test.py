"""The Python module end to end (standard-library unittest; run by ctest with the build's package on
DEEPINFER_PYTHON_DIR and the fixtures in DI_TEST_DATA_DIR)."""

import ast
import os
import re
import struct
import sys
import unittest

sys.path.insert(0, os.environ["DEEPINFER_PYTHON_DIR"])

import deepinfer  # noqa: E402
from deepinfer import LLM, SamplingParams  # noqa: E402

DATA = os.environ["DI_TEST_DATA_DIR"]
FIXTURE = os.path.join(DATA, "v4", "v4_tiny_c")


def load_ids(path):
    """A 1-D little-endian integer .npy file as a list (no numpy needed)."""
    with open(path, "rb") as f:
        assert f.read(6) == b"\x93NUMPY"
        major = f.read(2)[0]
        (hlen,) = struct.unpack("<H" if major == 1 else "<I", f.read(2 if major == 1 else 4))
        header = ast.literal_eval(f.read(hlen).decode("latin1"))
        fmt = {"<i4": "i", "<i8": "q"}[header["descr"]]
        n = 1
        for d in header["shape"]:
            n *= d
        return list(struct.unpack("<%d%s" % (n, fmt), f.read(n * struct.calcsize(fmt))))


IDS = load_ids(os.path.join(FIXTURE, "ids.npy"))


def engine(**kw):
    kw.setdefault("num_threads", 2)
    kw.setdefault("max_batch_tokens", 96)
    kw.setdefault("memory_budget", "64MiB")
    return LLM(FIXTURE, **kw)


class TestGeneration(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.llm = engine()

    def test_greedy_matches_the_reference(self):
        ref = load_ids(os.path.join(FIXTURE, "gen.npy"))
        out = self.llm.generate({"prompt_token_ids": IDS}, SamplingParams(temperature=0, max_tokens=len(ref),
                                                                           ignore_eos=True))
        self.assertEqual(len(out), 1)
        self.assertIsNone(out[0].error)
        self.assertEqual(out[0].outputs[0].token_ids, ref)
        self.assertEqual(out[0].outputs[0].finish_reason, "length")
        self.assertEqual(out[0].outputs[0].text, "")  # no tokenizer in the fixture
        self.assertEqual(out[0].prompt_token_ids, IDS)
        self.assertIsNone(out[0].prompt)

    def test_one_params_for_all_or_one_per_prompt(self):
        prompts = [IDS[:10], {"prompt_token_ids": IDS[20:50]}, IDS[5:6]]
        greedy = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
        shared = self.llm.generate(prompts, greedy)
        each = self.llm.generate(prompts, [greedy, greedy.clone(), greedy])
        self.assertEqual([o.outputs[0].token_ids for o in shared], [o.outputs[0].token_ids for o in each])
        self.assertTrue(all(len(o.outputs[0].token_ids) == 5 for o in shared))
        with self.assertRaises(ValueError):
            self.llm.generate(prompts, [greedy, greedy])

    def test_bad_requests_fail_alone(self):
        good = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        cases = [
            ([], good, "empty"),
            ("some text", good, "tokenizer"),
            ([3] * 600, good, "context limit"),
            (IDS[:20], SamplingParams(temperature=-1.0), "temperature"),
            (IDS[:20], SamplingParams(top_p=1.5), "top_p"),
            (IDS[:20], SamplingParams(stop=5), "stop must be a string or a list of strings"),
            (IDS[:20], SamplingParams(stop=["ok", 3]), "stop must be a string or a list of strings"),
            (IDS[:20], SamplingParams(so_args="{not json"), "so_args"),
            (IDS[:20], SamplingParams(so_args={"type": "xml", "value": "x"}), "xml"),
            (IDS[:20], SamplingParams(so_args=12), "so_args"),
            (IDS[:20], SamplingParams(max_tokens="ten"), "max_tokens"),
            (3.5, good, "a prompt must be"),
            ({"nothing": 1}, good, "prompt_token_ids"),
            ([1, 2, 99999], good, "vocabulary"),
        ]
        goods = [IDS[:20], IDS[100:190]]
        alone = [self.llm.generate(p, good)[0].outputs[0].token_ids for p in goods]
        prompts = [goods[0]] + [c[0] for c in cases[:7]] + [goods[1]] + [c[0] for c in cases[7:]]
        params = [good] + [c[1] for c in cases[:7]] + [good] + [c[1] for c in cases[7:]]
        outs = self.llm.generate(prompts, params)
        self.assertEqual(len(outs), len(prompts))
        good_outs = [outs[0], outs[8]]
        bad_outs = outs[1:8] + outs[9:]
        for o, expected in zip(good_outs, alone):
            self.assertIsNone(o.error)
            self.assertEqual(o.outputs[0].token_ids, expected)
        for o, (_, _, message) in zip(bad_outs, cases):
            self.assertTrue(o.finished)
            self.assertEqual(o.outputs[0].finish_reason, "error")
            self.assertEqual(o.outputs[0].token_ids, [])
            self.assertIn(message, o.error)
        report = self.llm.memory_report()
        self.assertEqual(report["free_blocks"], report["num_blocks"])

    def test_seeded_sampling_is_reproducible_and_batch_independent(self):
        llm = engine(batch_invariant=True)
        prompts = [IDS[i * 13:i * 13 + 5 + 17 * i] for i in range(8)]
        params = [SamplingParams(temperature=0.9, top_k=40, max_tokens=12, ignore_eos=True, seq_seed=100 + i)
                  for i in range(8)]
        batched = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        reversed_ = [o.outputs[0].token_ids for o in llm.generate(prompts[::-1], params[::-1])][::-1]
        alone = [llm.generate(p, s)[0].outputs[0].token_ids for p, s in zip(prompts, params)]
        again = [o.outputs[0].token_ids for o in engine(max_batch_tokens=512).generate(prompts, params)]
        self.assertEqual(batched, alone)
        self.assertEqual(reversed_, alone)
        self.assertEqual(again, alone)

    def test_streaming_callback_and_logprobs(self):
        seen = []
        out = self.llm.generate(IDS[:30], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=2),
                                on_output=lambda o: seen.extend(o.outputs[0].delta_token_ids))[0]
        self.assertEqual(seen, out.outputs[0].token_ids)
        self.assertEqual(len(out.outputs[0].logprobs), 10)
        for token, entry in zip(out.outputs[0].token_ids, out.outputs[0].logprobs):
            self.assertEqual(entry.token_id, token)
            self.assertEqual(entry.rank, 1)
            self.assertEqual(entry.top[0][0], token)
            self.assertLessEqual(entry.logprob, 0.0)
        self.assertAlmostEqual(out.outputs[0].cumulative_logprob, sum(e.logprob for e in out.outputs[0].logprobs),
                               places=4)
        self.assertGreater(out.metrics.time_to_first_token, 0.0)

    def test_callback_exceptions_surface_after_the_batch(self):
        def boom(_):
            raise KeyError("from the callback")

        with self.assertRaises(KeyError):
            self.llm.generate([IDS[:5], IDS[:9]], SamplingParams(max_tokens=3), on_output=boom)
        self.assertFalse(self.llm.has_unfinished_requests())

    def test_step_api_and_abort(self):
        p = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
        a = self.llm.add_request(IDS[:40], p)
        b = self.llm.add_request({"prompt_token_ids": IDS[:50]}, p)
        final = {}
        steps = 0
        while self.llm.has_unfinished_requests():
            for o in self.llm.step():
                if o.finished:
                    final[o.request_id] = o
            steps += 1
            if steps == 3:
                self.assertTrue(self.llm.abort_request(b))
        self.assertEqual(final[a].outputs[0].finish_reason, "length")
        self.assertEqual(len(final[a].outputs[0].token_ids), 30)
        self.assertEqual(final[b].outputs[0].finish_reason, "abort")
        self.assertFalse(self.llm.abort_request(b))

    def test_stats_and_memory(self):
        stats = self.llm.stats()
        self.assertGreaterEqual(stats["cpu_seconds"], stats["cpu_overlapped_seconds"])
        report = self.llm.memory_report()
        self.assertGreater(report["bytes_per_token"], 0)
        self.assertGreater(report["max_concurrent_tokens"], 0)
        self.assertTrue(self.llm.async_scheduling)
        self.assertEqual(self.llm.model_info["vocab_size"], 256)


class TestApi(unittest.TestCase):
    def test_sampling_params(self):
        p = SamplingParams()
        self.assertEqual((p.temperature, p.top_p, p.top_k, p.max_tokens, p.seq_seed), (1.0, 1.0, 0, 16, None))
        self.assertEqual(SamplingParams(seed=3).seq_seed, 3)
        with self.assertRaises(TypeError):
            SamplingParams(temprature=0.5)
        with self.assertRaises(deepinfer.Error):
            SamplingParams(top_p=2.0).validate()
        with self.assertRaises(deepinfer.Error):
            SamplingParams(stop=5).validate()
        SamplingParams(stop="x", so_args={"type": "regex", "value": "a+"}).validate()
        self.assertIn("temperature=0.5", repr(SamplingParams(temperature=0.5)))
        self.assertEqual(SamplingParams(temperature=0.5), SamplingParams(temperature=0.5))

    def test_engine_errors_raise(self):
        with self.assertRaises(deepinfer.Error):
            LLM("/nonexistent/model/dir")
        with self.assertRaises(deepinfer.Error):
            LLM(FIXTURE, max_seqs=0)
        with self.assertRaises(deepinfer.Error):
            LLM(FIXTURE, no_such_option=1)
        with self.assertRaises(deepinfer.Error):
            LLM(FIXTURE, memory_budget="lots")
        llm = engine()
        with self.assertRaises(deepinfer.Error):
            llm.encode("no tokenizer here")
        out = llm.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=4))
        self.assertEqual(out[0].outputs[0].finish_reason, "error")
        self.assertIn("tokenizer", out[0].error)

    def test_default_model_with_structured_output(self):
        saved = os.environ.pop("DEEPINFER_HF_MODEL_DIR", None)
        try:
            llm = LLM(num_threads=2)
        finally:
            if saved is not None:
                os.environ["DEEPINFER_HF_MODEL_DIR"] = saved
        info = llm.model_info
        self.assertEqual(info["dir"], deepinfer.default_model_dir())
        self.assertTrue(info["has_tokenizer"])
        prompt = {"prompt_token_ids": [0] + [llm.encode(c)[0] for c in "Pick one:"]}
        outs = llm.generate([prompt, prompt], [
            SamplingParams(max_tokens=20, seq_seed=4, so_args={"type": "choice", "value": ["red", "green", "blue"]}),
            SamplingParams(max_tokens=20, seq_seed=5, so_args={"type": "regex", "value": "[a-z]{3}[0-9]"}),
        ])
        self.assertIn(outs[0].outputs[0].text, ["red", "green", "blue"])
        self.assertEqual(outs[0].outputs[0].finish_reason, "stop")
        self.assertRegex(outs[1].outputs[0].text, r"^[a-z]{3}[0-9]$")
        self.assertEqual(outs[0].outputs[0].text, llm.decode(outs[0].outputs[0].token_ids, True))
        messages = [{"role": "user", "content": "Hi"}]
        self.assertIn("Hi", llm.apply_chat_template(messages))


if __name__ == "__main__":
    unittest.main()
