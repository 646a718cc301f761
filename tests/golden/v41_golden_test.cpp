// DeepSeek-V4.1 against DeepSeek's official V4.1 inference code (fp32, CPU), on the fixture in
// tests/data/v41/v41_tiny_fp8 (see its README). Bound: max |ours - ref| <= 1e-2 * max |ref| (the
// reference's quantize-dequantize steps are discontinuous, so rounding noise can flip a code).
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "model/deepseek_v41/engram.h"
#include "model/deepseek_v41/model.h"
#include "model/deepseek_v41/numpy_random.h"
#include "model/model.h"
#include "sample/sampler.h"
#include "support/checkpoint_edit.h"
#include "support/greedy_decode.h"
#include "support/npy_compare.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {
namespace {

using namespace testing_support;

const std::string kDir = data_path("v41/v41_tiny_fp8");

class V41Golden : public ::testing::Test {
protected:
    void SetUp() override {
        backend_ = create_backend("cpu", 2);
        model_ = load_model(kDir, *backend_);
        v41_ = dynamic_cast<dsv41::DeepseekV41Model*>(model_.get());
        ASSERT_NE(v41_, nullptr);
        v41_->set_prefill_truncation({dsv41::PrefillTruncation::Mode::kOff, 140});
        ids_ = load_i32(kDir + "/ids.npy");
    }

    std::vector<float> prompt_logits(const std::vector<int32_t>& ids, int64_t chunk, int64_t logits_from = 0) {
        auto seq = model_->new_sequence(static_cast<int64_t>(ids.size()));
        std::vector<float> out;
        const size_t step = chunk > 0 ? static_cast<size_t>(chunk) : ids.size();
        for (size_t b = 0; b < ids.size(); b += step) {
            const size_t n = std::min(step, ids.size() - b);
            SequenceInput in{seq.get(), std::span<const int32_t>(ids.data() + b, n),
                             std::max<int64_t>(0, logits_from - static_cast<int64_t>(b))};
            Tensor t = model_->forward(std::span<const SequenceInput>(&in, 1));
            out.insert(out.end(), t.f32(), t.f32() + t.numel());
        }
        return out;
    }

    std::unique_ptr<Backend> backend_;
    std::unique_ptr<CausalLM> model_;
    dsv41::DeepseekV41Model* v41_ = nullptr;
    std::vector<int32_t> ids_;
};

TEST_F(V41Golden, PrefillMatchesOfficialCode) {
    const std::vector<float> ref = load_f32(kDir + "/logits.npy");
    const double err = rel_error(prompt_logits(ids_, 0), ref);
    std::printf("[ v41_tiny_fp8 ] prefill vs official code: %.3g (bound 1e-2)\n", err);
    EXPECT_LE(err, 1e-2);
}

// Greedy decode through the incremental state reproduces the official decode in which every index-key owner
// reads its own keys (gen_ownkey*; the official code's shared key pointer is a known artifact).
TEST_F(V41Golden, DecodeMatchesOfficialCodeWithOwnKeys) {
    const std::vector<int32_t> prompt = load_i32(kDir + "/prompt.npy");
    const std::vector<int32_t> ref = load_i32(kDir + "/gen_ownkey.npy");
    const std::vector<float> ref_logits = load_f32(kDir + "/gen_ownkey_logits.npy");
    const auto [ours, step_logits] = testing_support::greedy_decode(*model_, prompt, ref.size());
    EXPECT_EQ(ours, ref);
    const double err = rel_error(step_logits, ref_logits);
    std::printf("[ v41_tiny_fp8 ] decode-step logits vs official code: %.3g over %zu steps\n", err, ref.size());
    EXPECT_LE(err, 1e-2);
}

// In batch-invariant mode every row is computed alone, so chunked prefill is bitwise the full prefill.
TEST_F(V41Golden, ChunkedPrefillIsBitwiseTheFullPrefillInBatchInvariantMode) {
    backend_->set_batch_invariant(true);
    const std::vector<float> full = prompt_logits(ids_, 0);
    for (int64_t chunk : {1, 7, 64}) {
        const std::vector<float> chunked = prompt_logits(ids_, chunk);
        ASSERT_EQ(chunked.size(), full.size());
        EXPECT_EQ(std::memcmp(chunked.data(), full.data(), full.size() * 4), 0) << "chunk " << chunk;
    }
    const double err = rel_error(full, load_f32(kDir + "/logits.npy"));
    std::printf("[ v41_tiny_fp8 ] batch-invariant prefill vs official code: %.3g (informational)\n", err);
}

TEST(V41Engram, TokenMapMatchesTheOfficialBuilder) {
    const Tokenizer tokenizer = Tokenizer::from_file(kDir + "/tokenizer.json");
    int32_t compressed = 0;
    const std::vector<int32_t> map = dsv41::build_engram_token_map(tokenizer, &compressed);
    EXPECT_EQ(map, load_i32(kDir + "/engram_token_map.npy"));
    EXPECT_EQ(compressed, 279);
}

TEST(V41Engram, PrimesAndMultipliersMatchNumpy) {
    // The fixture's layout (README) ...
    dsv41::EngramConfig c;
    c.layer_ids = {1, 4};
    c.num_embeddings = {3688, 3904};
    c.max_ngram = 4;
    c.vocab_size = 600;
    c.n_heads = 2;
    const dsv41::EngramLayout tiny = dsv41::make_engram_layout(c, 279);
    EXPECT_EQ(tiny.primes[0], (std::vector<int64_t>{601, 607, 613, 617, 619, 631}));
    EXPECT_EQ(tiny.primes[1], (std::vector<int64_t>{641, 643, 647, 653, 659, 661}));
    EXPECT_EQ(tiny.multipliers[0], (std::vector<int64_t>{27217303445930585, 1718971332754923, 12771741395946107,
                                                         26277968614433783}));
    EXPECT_EQ(tiny.multipliers[1], (std::vector<int64_t>{29216235072973767, 1789264828494087, 26159383887204585,
                                                         6732169463156515}));
    // ... and V4.1-Flash's, as computed with numpy 2.5.2 for the design notes.
    c.layer_ids = {1, 14};
    c.num_embeddings = {384006168, 384016682};
    c.vocab_size = 16000000;
    c.n_heads = 8;
    const dsv41::EngramLayout flash = dsv41::make_engram_layout(c, 99092);
    EXPECT_EQ(flash.multipliers[0],
              (std::vector<int64_t>{76632096046245, 4839876093313, 35959672319349, 73987337458391}));
    EXPECT_EQ(flash.multipliers[1],
              (std::vector<int64_t>{67716810739261, 51510806800915, 30921347202721, 82619226485591}));
    EXPECT_EQ(flash.primes[0].front(), 16000057);
    EXPECT_EQ(flash.primes[1].back(), 16000889);
    // A layout that does not sum to the table size is an error.
    c.num_embeddings = {384006168, 1};
    EXPECT_THROW(dsv41::make_engram_layout(c, 99092), Error);
}

// Prefill truncation: the kv-source layers (and so the compressed cache and index keys every later
// layer reads) are unaffected, bit for bit; only the late layers' rows shrink.
TEST_F(V41Golden, CompactTruncationLeavesSourceCachesBitIdentical) {
    std::vector<std::unique_ptr<ModelSequence>> seqs;
    std::vector<float> last_row[2];
    for (int mode = 0; mode < 2; ++mode) {
        v41_->set_prefill_truncation({mode ? dsv41::PrefillTruncation::Mode::kCompact
                                           : dsv41::PrefillTruncation::Mode::kOff,
                                      140});
        seqs.push_back(model_->new_sequence(static_cast<int64_t>(ids_.size())));
        SequenceInput in{seqs.back().get(), std::span<const int32_t>(ids_), static_cast<int64_t>(ids_.size()) - 1};
        Tensor t = model_->forward(std::span<const SequenceInput>(&in, 1));
        last_row[mode].assign(t.f32(), t.f32() + t.numel());
        EXPECT_EQ(v41_->last_late_rows(), mode ? 140 : static_cast<int64_t>(ids_.size()));
    }
    const StateSpec& spec = model_->state_spec();
    const int last_source = v41_->config().last_kv_source();
    int compared = 0;
    for (size_t i = 0; i < spec.buffers.size(); ++i) {
        const StateBufferSpec& b = spec.buffers[i];
        const int layer = b.name[0] == 'l' ? std::stoi(b.name.substr(1)) : -1;
        if (layer > last_source || b.name == "tokens") continue;
        const SequenceMemory& a = seqs[0]->memory(), &c = seqs[1]->memory();
        if (b.ring_rows > 0) {
            EXPECT_EQ(std::memcmp(a.rings[i].data(), c.rings[i].data(), a.rings[i].nbytes()), 0) << b.name;
        } else {
            const int64_t rows = b.rows_for(static_cast<int64_t>(ids_.size()));
            for (int64_t r = 0; r < rows; ++r)
                ASSERT_EQ(std::memcmp(a.pages[i].row(r), c.pages[i].row(r), b.row_elems * 4), 0) << b.name << " " << r;
        }
        ++compared;
    }
    EXPECT_GT(compared, 10);
    std::printf("[ v41_tiny_fp8 ] compact vs off, last-row logits: %.3g\n", rel_error(last_row[1], last_row[0]));
}

TEST_F(V41Golden, TruncationNeverAppliesWhenEarlierLogitsAreRequested) {
    v41_->set_prefill_truncation({dsv41::PrefillTruncation::Mode::kCompact, 140});
    const std::vector<float> all_rows = prompt_logits(ids_, 0, 0);
    EXPECT_EQ(v41_->last_late_rows(), static_cast<int64_t>(ids_.size()));
    EXPECT_LE(rel_error(all_rows, load_f32(kDir + "/logits.npy")), 1e-2);
}

TEST_F(V41Golden, ImageTokensAndBadEnvironmentAreClearErrors) {
    auto seq = model_->new_sequence(8);
    const std::vector<int32_t> ok = {0, 5, 6};
    SequenceInput in{seq.get(), std::span<const int32_t>(ok), 2};
    model_->forward(std::span<const SequenceInput>(&in, 1));
    const std::vector<int32_t> bad = {7, 99999};
    SequenceInput b{seq.get(), std::span<const int32_t>(bad), 1};
    EXPECT_THROW(model_->forward(std::span<const SequenceInput>(&b, 1)), Error);
    EXPECT_EQ(seq->num_tokens(), 3);
    setenv("DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE", "sometimes", 1);
    EXPECT_THROW(dsv41::PrefillTruncation::from_env(), Error);
    unsetenv("DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE");
}

}  // namespace
}  // namespace deepinfer
