// The shipped default model (models/deepinfer-tiny-v4): it loads as the default, our tokenizer encodes its
// held-out text exactly as Hugging Face tokenizers did, and its held-out perplexity matches the one
// transformers computed on the GPU machine from the same (dequantized) weights (reference.json, written by
// tools/train/train_tiny_v4.py).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/file.h"
#include "deepinfer/llm.h"
#include "model/model.h"
#include "model/perplexity.h"
#include "support/npy_compare.h"
#include "support/scoped_env.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {
namespace {

nlohmann::json reference() {
    std::ifstream f(path_join(default_model_dir(), "reference.json"));
    return nlohmann::json::parse(f);
}

std::vector<int32_t> heldout_ids() {
    return perplexity_ids(Tokenizer::from_file(default_model_dir()),
                          read_file(path_join(default_model_dir(), "heldout.txt")));
}

// Built with -DDI_DEFAULT_MODEL= (no default model) there is nothing to check.
#define SKIP_WITHOUT_DEFAULT_MODEL() \
    if (default_model_dir().empty()) GTEST_SKIP() << "built without a default model"

TEST(DefaultModel, TokenizerEncodesHeldOutTextLikeHuggingFace) {
    SKIP_WITHOUT_DEFAULT_MODEL();
    const std::vector<int32_t> expected = testing_support::load_i32(path_join(default_model_dir(), "heldout_ids.npy"));
    const std::vector<int32_t> ids = heldout_ids();
    ASSERT_EQ(ids.size(), expected.size());
    EXPECT_EQ(ids, expected);
}

// The CI check: perplexity over the first windows of the committed held-out text equals the reference's
// within 1% (and so stays under the reference * 1.01), far below the uniform baseline.
TEST(DefaultModel, HeldOutPerplexityMatchesTheReference) {
    SKIP_WITHOUT_DEFAULT_MODEL();
    const nlohmann::json ref = reference();
    const int64_t windows = ref["ci_windows"].get<int64_t>(), context = ref["eval_context"].get<int64_t>();
    const double expected = ref["perplexity_shipped_reference_ci_windows"].get<double>();
    auto backend = create_backend("cpu", 2);
    auto model = load_model(default_model_dir(), *backend);
    const PerplexityResult r = evaluate_perplexity(*model, heldout_ids(), context, windows, 8, &backend->pool());
    ASSERT_EQ(static_cast<int64_t>(r.window_nll.size()), windows);
    EXPECT_EQ(r.tokens(), windows * context);
    EXPECT_NEAR(r.perplexity() / expected, 1.0, 0.01) << "engine " << r.perplexity() << " reference " << expected;
    EXPECT_LT(r.perplexity(), expected * 1.01);
    EXPECT_LT(r.perplexity(), ref["uniform_perplexity"].get<double>() / 100);
    const std::vector<double> ref_nll = ref["window_nll_shipped"].get<std::vector<double>>();
    for (int64_t w = 0; w < windows; ++w)
        EXPECT_NEAR(r.window_nll[w], ref_nll[w], 0.01 * ref_nll[w]) << "window " << w;
}

// FP8 activations for the FP8 products (DEEPINFER_FP8_ACTIVATIONS=1, DeepSeek's reference numerics) change every
// window's NLL a little: measured on the CI windows 11.6955 -> 11.7276 (+0.27%; +0.08% over all 56), within the
// 0.5% bound that the GPU path's perplexity keeps.
TEST(DefaultModel, Fp8ActivationsMoveThePerplexityLittle) {
    SKIP_WITHOUT_DEFAULT_MODEL();
    const nlohmann::json ref = reference();
    const int64_t windows = ref["ci_windows"].get<int64_t>(), context = ref["eval_context"].get<int64_t>();
    auto backend = create_backend("cpu", 2);
    const std::vector<int32_t> ids = heldout_ids();
    auto perplexity = [&](const char* fp8) {
        testing_support::ScopedEnv env("DEEPINFER_FP8_ACTIVATIONS", fp8);
        auto model = load_model(default_model_dir(), *backend);
        return evaluate_perplexity(*model, ids, context, windows, 8, &backend->pool());
    };
    const PerplexityResult plain = perplexity("0"), fp8 = perplexity("1");
    ASSERT_EQ(fp8.window_nll.size(), plain.window_nll.size());
    for (size_t w = 0; w < plain.window_nll.size(); ++w)
        EXPECT_NE(fp8.window_nll[w], plain.window_nll[w]) << "window " << w << ": the switch changed nothing";
    EXPECT_NEAR(fp8.perplexity() / plain.perplexity(), 1.0, 0.005)
        << "FP8 activations " << fp8.perplexity() << ", plain " << plain.perplexity();
}

TEST(DefaultModel, GeneratesTextFromATextPrompt) {
    SKIP_WITHOUT_DEFAULT_MODEL();
    testing_support::ScopedEnv no_model("DEEPINFER_HF_MODEL_DIR", nullptr);
    EngineOptions o;
    o.num_threads = 2;
    LLM llm(o);
    ASSERT_EQ(llm.model_info().dir, default_model_dir());
    SamplingParams p;
    p.max_tokens = 24;
    p.ignore_eos = true;
    const RequestOutput out = llm.generate({Prompt::from_text("def fibonacci(n):")}, p)[0];
    ASSERT_TRUE(out.error.empty()) << out.error;
    EXPECT_EQ(out.outputs[0].token_ids.size(), 24u);
    EXPECT_FALSE(out.outputs[0].text.empty());
    EXPECT_EQ(out.outputs[0].text, llm.decode(out.outputs[0].token_ids, true));
}

}  // namespace
}  // namespace deepinfer
