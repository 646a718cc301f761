// Incremental state: rollback of the last k tokens, batching, and the state's size accounting.
#include <gtest/gtest.h>

#include <cstring>

#include "backend/backend.h"
#include "core/file.h"
#include "model/deepseek_v4/model.h"
#include "model/deepseek_v4/state.h"
#include "model/model.h"
#include "support/checkpoint_edit.h"
#include "support/npy_compare.h"

namespace deepinfer {
namespace {

using namespace testing_support;

class V4State : public ::testing::Test {
protected:
    void SetUp() override {
        backend_ = create_backend("cpu", 2);
        // Case c: HCA every 32 tokens, CSA every 4, window 32.
        model_ = load_model(data_path("v4/v4_tiny_c"), *backend_);
        ids_ = load_i32(data_path("v4/v4_tiny_c/ids.npy"));
        vocab_ = model_->info().vocab_size;
    }

    std::vector<float> run(ModelSequence* seq, std::span<const int32_t> tokens, int64_t logits_from = 0) {
        SequenceInput in{seq, tokens, logits_from};
        Tensor t = model_->forward(std::span<const SequenceInput>(&in, 1));
        return std::vector<float>(t.f32(), t.f32() + t.numel());
    }

    // Caller-owned memory as a KV manager provides it: the rings, and paged buffers of rows_per_block-row
    // blocks with no block yet.
    SequenceMemory caller_memory(int64_t rows_per_block, std::vector<std::unique_ptr<float[]>>& storage) {
        const StateSpec& spec = model_->state_spec();
        SequenceMemory memory;
        memory.rings.resize(spec.buffers.size());
        memory.pages.resize(spec.buffers.size());
        for (size_t i = 0; i < spec.buffers.size(); ++i) {
            const StateBufferSpec& b = spec.buffers[i];
            if (b.ring_rows > 0) {
                storage.emplace_back(new float[b.ring_rows * b.row_elems]());
                memory.rings[i] = TensorView(storage.back().get(), DType::kF32, Shape{b.ring_rows, b.row_elems});
            } else {
                memory.pages[i] = PagedRows{{}, rows_per_block, b.row_elems};
            }
        }
        return memory;
    }

    std::unique_ptr<Backend> backend_;
    std::unique_ptr<CausalLM> model_;
    std::vector<int32_t> ids_;
    int64_t vocab_ = 0;
};

TEST_F(V4State, RollbackThenReplayIsBitwiseIdentical) {
    // Prefill 92 tokens, then 8 more one by one: positions 92..99 close a CSA window at 95 and 99 and an
    // HCA window at 95 (ratio 32), so rollback must un-emit compressed entries.
    auto seq = model_->new_sequence(200);
    run(seq.get(), std::span<const int32_t>(ids_.data(), 92), 91);
    std::vector<std::vector<float>> first;
    for (int i = 92; i < 100; ++i) first.push_back(run(seq.get(), std::span<const int32_t>(&ids_[i], 1)));
    seq->truncate(92);
    EXPECT_EQ(seq->num_tokens(), 92);
    for (int i = 92; i < 100; ++i) {
        const std::vector<float> again = run(seq.get(), std::span<const int32_t>(&ids_[i], 1));
        EXPECT_EQ(std::memcmp(again.data(), first[i - 92].data(), again.size() * 4), 0) << "position " << i;
    }
}

TEST_F(V4State, RollbackThenDifferentTokensMatchesAFreshSequence) {
    auto seq = model_->new_sequence(200);
    run(seq.get(), std::span<const int32_t>(ids_.data(), 100), 99);
    seq->truncate(93);  // drop 7 tokens across a window boundary
    std::vector<int32_t> alt = {5, 6, 7, 8, 9, 10, 11};
    const std::vector<float> after_rollback = run(seq.get(), alt);

    std::vector<int32_t> fresh_ids(ids_.begin(), ids_.begin() + 93);
    fresh_ids.insert(fresh_ids.end(), alt.begin(), alt.end());
    auto fresh = model_->new_sequence(200);
    const std::vector<float> expected = run(fresh.get(), fresh_ids, 93);
    EXPECT_LE(rel_error(after_rollback, expected), 1e-5);
}

TEST_F(V4State, RollbackBeyondTheLimitIsAnError) {
    auto seq = model_->new_sequence(64);
    run(seq.get(), std::span<const int32_t>(ids_.data(), 40), 39);
    EXPECT_THROW(seq->truncate(40 - seq->max_rollback() - 1), Error);
    EXPECT_THROW(seq->truncate(41), Error);
    EXPECT_EQ(seq->num_tokens(), 40);
}

TEST_F(V4State, BatchedSequencesMatchSeparateRuns) {
    // Three sequences at different stages in one forward: a prefill chunk, a decode step, a longer chunk.
    std::vector<std::unique_ptr<ModelSequence>> batched, alone;
    const int64_t warm[3] = {0, 70, 33}, step[3] = {50, 1, 40};
    for (int s = 0; s < 3; ++s) {
        batched.push_back(model_->new_sequence(200));
        alone.push_back(model_->new_sequence(200));
        if (warm[s]) {
            run(batched[s].get(), std::span<const int32_t>(ids_.data() + 10 * s, warm[s]), warm[s] - 1);
            run(alone[s].get(), std::span<const int32_t>(ids_.data() + 10 * s, warm[s]), warm[s] - 1);
        }
    }
    std::vector<SequenceInput> inputs;
    for (int s = 0; s < 3; ++s)
        inputs.push_back({batched[s].get(), std::span<const int32_t>(ids_.data() + 10 * s + warm[s], step[s]), 0});
    Tensor together = model_->forward(inputs);
    int64_t row = 0;
    for (int s = 0; s < 3; ++s) {
        const std::vector<float> single = run(alone[s].get(), inputs[s].tokens);
        EXPECT_LE(rel_error(together.f32() + row * vocab_, single.data(), single.size()), 1e-5) << "sequence " << s;
        row += step[s];
    }
    EXPECT_EQ(row, together.dim(0));
}

// A sequence over caller-owned memory whose paged buffers grow 3 rows at a time, as a KV manager would grow
// them, computes exactly what a sequence with one contiguous buffer computes.
TEST_F(V4State, PagedMemoryGrownBetweenChunksMatchesOwnedMemory) {
    const StateSpec& spec = model_->state_spec();
    std::vector<std::unique_ptr<float[]>> storage;
    SequenceMemory memory = caller_memory(3, storage);
    auto paged = model_->new_sequence(std::move(memory));
    auto owned = model_->new_sequence(400);
    const int64_t chunks[] = {37, 1, 64, 5, 93};
    int64_t pos = 0;
    for (int64_t n : chunks) {
        SequenceMemory& mem = paged->memory();
        for (size_t i = 0; i < spec.buffers.size(); ++i) {
            PagedRows& p = mem.pages[i];
            while (spec.buffers[i].tokens_per_row > 0 && p.capacity_rows() < spec.buffers[i].rows_for(pos + n)) {
                storage.emplace_back(new float[p.rows_per_block * p.row_elems]());
                p.blocks.push_back(storage.back().get());
            }
        }
        ASSERT_GE(paged->capacity(), pos + n);
        const auto tokens = std::span<const int32_t>(ids_.data() + pos, n);
        const std::vector<float> a = run(paged.get(), tokens), b = run(owned.get(), tokens);
        EXPECT_EQ(a, b) << "chunk at " << pos;
        pos += n;
    }
    // Without new blocks the next chunk does not fit, and the state is left untouched.
    const auto tokens = std::span<const int32_t>(ids_.data() + pos, 40);
    EXPECT_THROW(run(paged.get(), tokens), Error);
    EXPECT_EQ(paged->num_tokens(), pos);
}

// A fork continues exactly like its source, whatever memory either lives in: here the source's paged
// buffers have 5-row blocks and the fork's are contiguous, so the copy crosses block boundaries.
TEST_F(V4State, ForkedSequenceContinuesLikeItsSource) {
    const StateSpec& spec = model_->state_spec();
    std::vector<std::unique_ptr<float[]>> storage;
    SequenceMemory memory = caller_memory(5, storage);
    for (size_t i = 0; i < spec.buffers.size(); ++i) {
        const StateBufferSpec& b = spec.buffers[i];
        while (b.tokens_per_row > 0 && memory.pages[i].capacity_rows() <= b.rows_for(160)) {
            storage.emplace_back(new float[5 * b.row_elems]());
            memory.pages[i].blocks.push_back(storage.back().get());
        }
    }
    auto source = model_->new_sequence(std::move(memory));
    run(source.get(), std::span<const int32_t>(ids_.data(), 97), 96);  // mid-window for every compressor
    auto fork = model_->fork_sequence(*source, 200);
    EXPECT_EQ(fork->num_tokens(), 97);
    for (int64_t i = 97; i < 140; i += 7) {
        const auto tokens = std::span<const int32_t>(ids_.data() + i, 7);
        EXPECT_EQ(run(fork.get(), tokens), run(source.get(), tokens)) << "tokens from " << i;
    }
    // A fork without room for the source's tokens is refused.
    EXPECT_THROW(model_->fork_sequence(*source, 100), Error);
}

// With the backend in batch-invariant mode, a sequence's logits are bitwise identical alone or batched.
TEST_F(V4State, BatchInvariantModeIsBitwiseIdentical) {
    backend_->set_batch_invariant(true);
    auto a = model_->new_sequence(200), b = model_->new_sequence(200), c = model_->new_sequence(200);
    auto alone = model_->new_sequence(200);
    const auto prompt = std::span<const int32_t>(ids_.data(), 45);
    run(c.get(), std::span<const int32_t>(ids_.data() + 100, 20));
    std::vector<SequenceInput> inputs = {{a.get(), std::span<const int32_t>(ids_.data() + 50, 31), 0},
                                         {b.get(), prompt, 0},
                                         {c.get(), std::span<const int32_t>(ids_.data() + 120, 1), 0}};
    Tensor together = model_->forward(inputs);
    const std::vector<float> single = run(alone.get(), prompt);
    EXPECT_EQ(std::memcmp(together.f32() + 31 * vocab_, single.data(), single.size() * 4), 0);
    backend_->set_batch_invariant(false);
}

TEST_F(V4State, SameSequenceTwiceInABatchIsRejected) {
    auto seq = model_->new_sequence(16);
    const std::vector<int32_t> t = {1, 2};
    std::vector<SequenceInput> inputs = {{seq.get(), t, 0}, {seq.get(), t, 0}};
    EXPECT_THROW(model_->forward(inputs), Error);
    EXPECT_EQ(seq->num_tokens(), 0);
}

// The state size for the real V4-Flash shape: fp32 entries grow by 21 CSA layers x (512 + 128) / 4 and
// 20 HCA layers x 512 / 128 floats per token.
TEST(V4StateLayout, FlashBytesPerToken) {
    const char* kFlashConfig = "v4/deepseek_v4_flash_config.json";  // DeepSeek-V4-Flash, release keys
    const dsv4::DeepseekV4Config c =
        dsv4::parse_deepseek_v4_config(read_file(data_path(kFlashConfig)), kFlashConfig);
    EXPECT_EQ(c.compress_rope.dim, 64);
    const std::vector<float> inv = dsv4::rope_inv_freq(c.compress_rope);
    // YaRN bounds for Flash are low 15, high 25: dims below 15 keep the base frequency, above 25 are /16.
    EXPECT_FLOAT_EQ(inv[10], 1.0f / std::pow(160000.0f, 20.0f / 64.0f));
    EXPECT_NEAR(inv[30], 1.0f / (16.0f * std::pow(160000.0f, 60.0f / 64.0f)), 1e-12);
    const StateSpec spec = dsv4::state_spec(c);
    const double per_token = 4.0 * (21 * (512 + 128) / 4.0 + 20 * 512 / 128.0);
    EXPECT_DOUBLE_EQ(spec.paged_bytes_per_token(), per_token);
    std::printf("V4-Flash fp32 state: %.0f bytes/token + %.1f MiB of rings per sequence\n",
                spec.paged_bytes_per_token(), spec.ring_bytes() / 1048576.0);
}

}  // namespace
}  // namespace deepinfer
