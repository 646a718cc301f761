// ModelRunner's token selection over crafted logits (a fake model): the backend greedy path for steps whose
// rows are all plain greedy, per-request errors for rows it cannot decide, and the host path otherwise.
#include "engine/model_runner.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "deepinfer/error.h"

namespace deepinfer::engine {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// Returns the rows it was given, one per sampling sequence, and counts which entry point produced them.
class FakeModel final : public CausalLM {
public:
    explicit FakeModel(std::vector<std::vector<float>> rows) : rows_(std::move(rows)) {
        info_.model_type = "fake";
        info_.vocab_size = static_cast<int64_t>(rows_[0].size());
    }
    const ModelInfo& info() const override { return info_; }
    const StateSpec& state_spec() const override { return spec_; }
    std::unique_ptr<ModelSequence> new_sequence(SequenceMemory) override { DI_THROW("unused"); }
    std::unique_ptr<ModelSequence> new_sequence(int64_t) override { DI_THROW("unused"); }
    std::unique_ptr<ModelSequence> fork_sequence(ModelSequence&, int64_t) override { DI_THROW("unused"); }
    Tensor forward(std::span<const SequenceInput>) override {
        ++host_calls;
        return logits();
    }
    Tensor forward_on_backend(std::span<const SequenceInput>) override {
        ++backend_calls;
        return logits();
    }
    int host_calls = 0, backend_calls = 0;

private:
    Tensor logits() const {
        const int64_t v = info_.vocab_size;
        Tensor t = Tensor::f32(Shape{static_cast<int64_t>(rows_.size()), v});
        for (size_t r = 0; r < rows_.size(); ++r) std::copy(rows_[r].begin(), rows_[r].end(), t.f32() + r * v);
        return t;
    }
    std::vector<std::vector<float>> rows_;
    ModelInfo info_;
    StateSpec spec_;
};

struct Step {
    std::vector<std::unique_ptr<SamplerState>> samplers;
    StepBatch batch;
    explicit Step(size_t n) {
        for (size_t i = 0; i < n; ++i) {
            samplers.push_back(std::make_unique<SamplerState>());
            StepItem it;
            it.sampler = samplers.back().get();
            it.samples = true;
            it.tokens = {1};
            batch.items.push_back(std::move(it));
        }
    }
};

TEST(ModelRunner, AllGreedyStepsSelectOnTheBackendAndFailOnlyUndecidableRows) {
    FakeModel model({{0, 3, 3, 1}, {kNaN, 5, 0, 0}, {-kInf, -kInf, 2, -kInf}});
    auto be = create_backend("cpu", 1);
    ModelRunner runner(model, *be);
    Step s(3);
    runner.execute(s.batch);
    EXPECT_TRUE(s.batch.error.empty()) << s.batch.error;
    EXPECT_EQ(model.backend_calls, 1);
    EXPECT_EQ(model.host_calls, 0);
    EXPECT_EQ(s.batch.results[0].token, 1);  // tie: the lower id
    EXPECT_TRUE(s.batch.results[0].error.empty());
    EXPECT_NE(s.batch.results[1].error.find("no token can be generated"), std::string::npos)
        << s.batch.results[1].error;
    EXPECT_EQ(s.batch.results[2].token, 2);
    EXPECT_EQ(s.samplers[0]->num_sampled, 1);
    EXPECT_EQ(s.samplers[0]->history.output_counts().at(1), 1);
    EXPECT_EQ(s.samplers[2]->num_sampled, 1);
}

TEST(ModelRunner, StepsNeedingTheLogitsOnTheHostTakeTheHostPath) {
    FakeModel model({{0, 9, 1, 1}, {0, 1, 2, 3}});
    auto be = create_backend("cpu", 1);
    ModelRunner runner(model, *be);
    Step s(2);
    s.samplers[0]->min_tokens = 2;  // the end id 1 is masked until two tokens are out
    s.samplers[0]->end_ids = {1};
    runner.execute(s.batch);
    EXPECT_EQ(model.host_calls, 1);
    EXPECT_EQ(model.backend_calls, 0);
    EXPECT_EQ(s.batch.results[0].token, 2);  // 1 masked; 2 and 3 tie at 1: the lower id
    EXPECT_EQ(s.batch.results[1].token, 3);
}

}  // namespace
}  // namespace deepinfer::engine
