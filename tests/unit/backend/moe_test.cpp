// The CPU backend's MoE ops: routing (moe_route) against a plain re-statement of DeepSeek's router, and the routed
// experts' products (expert_linear) against linear() over each expert's rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <numeric>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/weight.h"
#include "deepinfer/error.h"

namespace deepinfer {
namespace {

struct Route {
    std::vector<int32_t> experts;
    std::vector<float> weights;
};

Tensor f32_tensor(const std::vector<float>& v, Shape s) {
    Tensor t(DType::kF32, s);
    std::memcpy(t.f32(), v.data(), v.size() * 4);
    return t;
}

// The router written out plainly: scores, selection by a full stable sort (score + bias descending, so ties keep
// the lower id first) or tid2eid, weights from the sum in selection order, then the slots by ascending id.
Route reference_route(const std::vector<float>& logits, int64_t e, const MoeRouting& r) {
    const int64_t rows = static_cast<int64_t>(logits.size()) / e, k = r.k;
    Route out;
    for (int64_t t = 0; t < rows; ++t) {
        std::vector<float> s(e);
        for (int64_t i = 0; i < e; ++i) {
            const float x = r.gate_temp == 1.0f ? logits[t * e + i] : logits[t * e + i] / r.gate_temp;
            if (r.scoring == ScoringFunc::kSqrtSoftplus) s[i] = std::sqrt(x > 20.0f ? x : std::log1p(std::exp(x)));
            else if (r.scoring == ScoringFunc::kSigmoid) s[i] = 1.0f / (1.0f + std::exp(-x));
            else s[i] = x;
        }
        if (r.scoring == ScoringFunc::kSoftmax) {
            float mx = s[0], sum = 0;
            for (float v : s) mx = std::max(mx, v);
            for (float& v : s) sum += (v = std::exp(v - mx));
            for (float& v : s) v /= sum;
        }
        std::vector<int32_t> sel(k);
        if (r.tid2eid) {
            std::copy_n(r.tid2eid + r.tokens[t] * k, k, sel.begin());
        } else {
            std::vector<int32_t> order(e);
            std::iota(order.begin(), order.end(), 0);
            std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
                return s[a] + (r.bias ? r.bias[a] : 0.0f) > s[b] + (r.bias ? r.bias[b] : 0.0f);
            });
            std::copy_n(order.begin(), k, sel.begin());
        }
        float sum = 0;
        for (int32_t id : sel) sum += s[id];
        std::vector<std::pair<int32_t, float>> slots;
        for (int32_t id : sel) slots.emplace_back(id, s[id] / (sum + 1e-20f) * r.routed_scaling);
        std::stable_sort(slots.begin(), slots.end(), [](auto& a, auto& b) { return a.first < b.first; });
        for (auto& [id, w] : slots) out.experts.push_back(id), out.weights.push_back(w);
    }
    return out;
}

class CpuMoe : public ::testing::Test {
protected:
    void SetUp() override { be_ = create_backend("cpu", 2); }

    std::vector<float> randn(int64_t n, float std = 1.0f) {
        std::normal_distribution<float> d(0.0f, std);
        std::vector<float> v(n);
        for (float& x : v) x = d(rng_);
        return v;
    }
    // The routed experts written out op by op over rows of x with ids id_t (a row per input): expert_linear with
    // w1 and w3, swiglu, expert_linear with w2; with block > 0 the two products' inputs quantized first as
    // fake_quantize(kFp8Ue8m0, block) quantizes them.
    Tensor expert_sequence(const std::vector<float>& xv, const Tensor& id_t, const std::vector<LinearWeight>& w1,
                           const std::vector<LinearWeight>& w3, const std::vector<LinearWeight>& w2, float limit,
                           int block = 0) {
        const int64_t rows = id_t.numel(), d = w1[0].cols, inter = w1[0].rows;
        Tensor x = f32_tensor(xv, Shape{rows, d});
        if (block > 0) be_->fake_quantize(x, QuantSim::kFp8Ue8m0, block);
        Tensor g = Tensor::f32(Shape{rows, inter}), u = Tensor::f32(Shape{rows, inter}),
               out = Tensor::f32(Shape{rows, d});
        be_->expert_linear(g, x, id_t, w1, 1);
        be_->expert_linear(u, x, id_t, w3, 1);
        be_->swiglu(g, g, u, limit);
        if (block > 0) be_->fake_quantize(g, QuantSim::kFp8Ue8m0, block);
        be_->expert_linear(out, g, id_t, w2, 1);
        return out;
    }
    Route route(const std::vector<float>& logits, int64_t e, const MoeRouting& r) {
        const int64_t rows = static_cast<int64_t>(logits.size()) / e;
        Tensor lg = f32_tensor(logits, Shape{rows, e});
        Tensor experts(DType::kI32, Shape{rows, r.k}), weights(DType::kF32, Shape{rows, r.k});
        be_->moe_route(experts, weights, lg, r);
        return {std::vector<int32_t>(experts.as<int32_t>(), experts.as<int32_t>() + rows * r.k),
                std::vector<float>(weights.f32(), weights.f32() + rows * r.k)};
    }
    void expect_reference(const std::vector<float>& logits, int64_t e, const MoeRouting& r) {
        const Route got = route(logits, e, r), want = reference_route(logits, e, r);
        EXPECT_EQ(got.experts, want.experts);
        EXPECT_EQ(got.weights, want.weights);
    }

    // `count` f32 experts [n, k] of N(0, std) weights (kept in store_), and the expert of each row of runs of `counts`.
    std::vector<LinearWeight> f32_experts(size_t count, int64_t n, int64_t k, float std) {
        std::vector<LinearWeight> ws;
        for (size_t e = 0; e < count; ++e) {
            store_.push_back(randn(n * k, std));
            LinearWeight w;
            w.rows = n;
            w.cols = k;
            w.name = "expert";
            w.data = TensorView(store_.back().data(), DType::kF32, Shape{n, k});
            ws.push_back(w);
        }
        return ws;
    }
    static Tensor ids_of_runs(const std::vector<int64_t>& counts) {
        std::vector<int32_t> ids;
        for (size_t e = 0; e < counts.size(); ++e) ids.insert(ids.end(), counts[e], static_cast<int32_t>(e));
        Tensor t(DType::kI32, Shape{static_cast<int64_t>(ids.size())});
        std::memcpy(t.as<int32_t>(), ids.data(), ids.size() * 4);
        return t;
    }

    std::unique_ptr<Backend> be_;
    std::mt19937 rng_{1234};
    std::deque<std::vector<float>> store_;
};

TEST_F(CpuMoe, ScoreRoutingEveryScoringFunction) {
    const int64_t e = 64;
    const std::vector<float> logits = randn(7 * e, 2.0f), bias = randn(e, 0.3f);
    for (ScoringFunc f : {ScoringFunc::kSqrtSoftplus, ScoringFunc::kSigmoid, ScoringFunc::kSoftmax}) {
        for (float temp : {1.0f, 0.7f}) {
            MoeRouting r;
            r.scoring = f;
            r.gate_temp = temp;
            r.bias = bias.data();
            r.k = 6;
            r.routed_scaling = 1.5f;
            SCOPED_TRACE(static_cast<int>(f));
            expect_reference(logits, e, r);
        }
    }
}

TEST_F(CpuMoe, SlotsAscendByExpertAndWeightsSumToTheScaling) {
    const int64_t e = 32;
    MoeRouting r;
    r.k = 4;
    r.routed_scaling = 2.0f;
    const Route got = route(randn(5 * e), e, r);
    for (int64_t t = 0; t < 5; ++t) {
        float sum = 0;
        for (int k = 0; k < 4; ++k) {
            if (k) {
                EXPECT_LT(got.experts[t * 4 + k - 1], got.experts[t * 4 + k]);
            }
            sum += got.weights[t * 4 + k];
        }
        EXPECT_NEAR(sum, 2.0f, 1e-5);
    }
}

// Equal scores + bias: the lower expert id wins, whether the tie comes from the logits or from the bias.
TEST_F(CpuMoe, TiesGoToTheLowerExpertId) {
    MoeRouting r;
    r.k = 3;
    const Route flat = route(std::vector<float>(10, 0.5f), 10, r);
    EXPECT_EQ(flat.experts, (std::vector<int32_t>{0, 1, 2}));
    for (float w : flat.weights) EXPECT_EQ(w, flat.weights[0]);

    // Experts 7 and 2 tie at the top (2 ranks first); 4 and 5 tie on the logits and 4 wins through the bias;
    // 1 and 6 tie on score + bias (different logits and biases).
    std::vector<float> logits(8, -3.0f), bias(8, 0.0f);
    logits[7] = 2.0f, logits[2] = 2.0f, logits[4] = 1.0f, logits[5] = 1.0f;
    bias[5] = -0.5f;
    r.bias = bias.data();
    r.k = 1;
    EXPECT_EQ(route(logits, 8, r).experts, (std::vector<int32_t>{2}));
    r.k = 3;
    EXPECT_EQ(route(logits, 8, r).experts, (std::vector<int32_t>{2, 4, 7}));
    expect_reference(logits, 8, r);
    r.scoring = ScoringFunc::kSoftmax;  // scores in [0, 1]: the bias decides between 1 and 6
    logits.assign(8, 0.0f);
    bias = {0.0f, 0.5f, 0.0f, 0.0f, 0.0f, 0.0f, 0.5f, 0.0f};
    r.k = 1;
    EXPECT_EQ(route(logits, 8, r).experts, (std::vector<int32_t>{1}));
}

// Dividing by the gate temperature equals routing logits already divided.
TEST_F(CpuMoe, GateTemperatureDividesTheLogits) {
    const int64_t e = 16;
    const std::vector<float> logits = randn(3 * e, 3.0f);
    std::vector<float> halved(logits);
    for (float& x : halved) x /= 2.0f;
    for (ScoringFunc f : {ScoringFunc::kSqrtSoftplus, ScoringFunc::kSigmoid, ScoringFunc::kSoftmax}) {
        MoeRouting r;
        r.scoring = f;
        r.k = 2;
        const Route plain = route(halved, e, r);
        r.gate_temp = 2.0f;
        const Route tempered = route(logits, e, r);
        EXPECT_EQ(tempered.experts, plain.experts);
        EXPECT_EQ(tempered.weights, plain.weights);
    }
}

// Hash routing takes tid2eid's row of each token whatever the scores; the weights still come from the scores.
TEST_F(CpuMoe, HashRoutingReadsTid2eid) {
    const int64_t e = 12;
    const std::vector<int32_t> tid2eid = {5, 1, 9, 0, 11, 3, 7, 2, 4};  // [3 tokens, 3]
    const std::vector<int32_t> tokens = {2, 0, 2, 1};
    MoeRouting r;
    r.tid2eid = tid2eid.data();
    r.tokens = tokens.data();
    r.vocab = 3;
    r.k = 3;
    r.routed_scaling = 1.25f;
    const std::vector<float> logits = randn(4 * e);
    const Route got = route(logits, e, r);
    EXPECT_EQ(got.experts, (std::vector<int32_t>{2, 4, 7, 1, 5, 9, 2, 4, 7, 0, 3, 11}));
    expect_reference(logits, e, r);
    r.scoring = ScoringFunc::kSigmoid;
    expect_reference(logits, e, r);

    const std::vector<int32_t> bad = {3};
    r.tokens = bad.data();
    EXPECT_THROW(route(randn(e), e, r), Error);
}

// Weights of several formats; each row's product equals linear() over the rows routed to its expert (the same
// sgemm calls), and the first products' mapping reads token row r / k.
TEST_F(CpuMoe, ExpertLinearEqualsLinearOverEachExpertsRows) {
    const int64_t e = 5, n = 24, kin = 64, k = 2;
    std::vector<std::vector<float>> data;
    std::vector<std::vector<uint16_t>> bf16;
    std::vector<LinearWeight> experts;
    for (int64_t i = 0; i < e; ++i) {
        data.push_back(randn(n * kin));
        LinearWeight w;
        w.rows = n;
        w.cols = kin;
        w.name = "expert";
        if (i % 2) {
            bf16.emplace_back(n * kin);
            for (int64_t j = 0; j < n * kin; ++j) bf16.back()[j] = f32_to_bf16(data.back()[j]);
            w.data = TensorView(bf16.back().data(), DType::kBF16, Shape{n, kin});
        } else {
            w.data = TensorView(data.back().data(), DType::kF32, Shape{n, kin});
        }
        experts.push_back(w);
    }
    for (bool invariant : {false, true}) {
        be_->set_batch_invariant(invariant);
        const std::vector<int32_t> ids = {3, 0, 3, 4, 1, 3, 0, 2, 2, 4};  // [5 tokens, k]
        const int64_t rows = static_cast<int64_t>(ids.size());
        Tensor x = f32_tensor(randn(rows / k * kin), Shape{rows / k, kin});
        Tensor id_t(DType::kI32, Shape{rows});
        std::memcpy(id_t.as<int32_t>(), ids.data(), rows * 4);
        Tensor out = Tensor::f32(Shape{rows, n});
        be_->expert_linear(out, x, id_t, experts, static_cast<int>(k));
        for (int64_t ex = 0; ex < e; ++ex) {
            std::vector<int64_t> rs;
            for (int64_t r = 0; r < rows; ++r)
                if (ids[r] == ex) rs.push_back(r);
            Tensor xe = Tensor::f32(Shape{static_cast<int64_t>(rs.size()), kin});
            for (size_t i = 0; i < rs.size(); ++i) std::memcpy(xe.f32() + i * kin, x.f32() + rs[i] / k * kin, kin * 4);
            Tensor ye = Tensor::f32(Shape{static_cast<int64_t>(rs.size()), n});
            be_->linear(ye, xe, experts[ex]);
            for (size_t i = 0; i < rs.size(); ++i)
                EXPECT_EQ(0, std::memcmp(ye.f32() + i * n, out.f32() + rs[i] * n, n * 4)) << "row " << rs[i];
        }
        // Each row by hand, within fp32 noise.
        for (int64_t r = 0; r < rows; ++r) {
            std::vector<float> w(n * kin);
            dequantize_rows(experts[ids[r]], 0, n, w.data());
            for (int64_t j = 0; j < n; ++j) {
                double acc = 0;
                for (int64_t c = 0; c < kin; ++c) acc += static_cast<double>(w[j * kin + c]) * x.f32()[r / k * kin + c];
                EXPECT_NEAR(out.f32()[r * n + j], acc, 1e-4 * (1 + std::abs(acc)));
            }
        }
    }
    be_->set_batch_invariant(false);

    Tensor x = f32_tensor(randn(kin), Shape{1, kin}), out = Tensor::f32(Shape{1, n});
    Tensor bad(DType::kI32, Shape{1});
    bad.as<int32_t>()[0] = static_cast<int32_t>(e);
    EXPECT_THROW(be_->expert_linear(out, x, bad, experts, 1), Error);
}

// grouped_experts (prefill's experts over rows sorted by expert) equals the decode path over the same rows,
// expert_linear with each row's expert for w1, w3 and w2 around swiglu (the same sgemm calls), experts without
// rows included; counts that do not add up to the rows are an error.
TEST_F(CpuMoe, GroupedExpertsEqualExpertLinearOverTheSameRows) {
    const int64_t d = 32, inter = 16;
    const float limit = 4.0f;  // clamps some of the gates and ups
    const std::vector<int64_t> counts = {3, 0, 5, 1, 0, 2};
    const size_t n = counts.size();
    const std::vector<LinearWeight> w1 = f32_experts(n, inter, d, 0.3f), w3 = f32_experts(n, inter, d, 0.3f),
                                    w2 = f32_experts(n, d, inter, 0.3f);
    const Tensor id_t = ids_of_runs(counts);
    const int64_t rows = id_t.numel();

    const std::vector<float> xv = randn(rows * d);
    Tensor x = f32_tensor(xv, Shape{rows, d});
    const Tensor want = expert_sequence(xv, id_t, w1, w3, w2, limit);
    be_->grouped_experts(x, counts, w1, w3, w2, limit);
    EXPECT_EQ(0, std::memcmp(x.f32(), want.f32(), rows * d * 4));

    Tensor x2 = f32_tensor(xv, Shape{rows, d});
    std::vector<int64_t> short_counts = counts;
    --short_counts.back();
    EXPECT_THROW(be_->grouped_experts(x2, short_counts, w1, w3, w2, limit), Error);
}

// FP8 activations (act_block): routed_experts and grouped_experts multiply x and the SwiGLU output quantized as
// fake_quantize(kFp8Ue8m0, block) quantizes them, bit for bit the sequence written out by hand; x itself is left as it
// is by routed_experts; unquantized results differ; a block that does not divide D and I is an error.
TEST_F(CpuMoe, ActivationBlockQuantizesBothProductsInputs) {
    const int64_t d = 256, inter = 128, block = 128;
    const float limit = 4.0f;
    const std::vector<int64_t> counts = {3, 0, 5, 1};
    const size_t n = counts.size();
    const std::vector<LinearWeight> w1 = f32_experts(n, inter, d, 0.1f), w3 = f32_experts(n, inter, d, 0.1f),
                                    w2 = f32_experts(n, d, inter, 0.1f);
    const Tensor id_t = ids_of_runs(counts);
    const int64_t rows = id_t.numel();
    const std::vector<float> xv = randn(rows * d);
    const Tensor want = expert_sequence(xv, id_t, w1, w3, w2, limit, block);

    Tensor x = f32_tensor(xv, Shape{rows, d}), out = Tensor::f32(Shape{rows, d});
    be_->routed_experts(out, x, id_t, w1, w3, w2, 1, limit, block);
    EXPECT_EQ(0, std::memcmp(out.f32(), want.f32(), rows * d * 4)) << "routed_experts";
    EXPECT_EQ(0, std::memcmp(x.f32(), xv.data(), rows * d * 4)) << "routed_experts changed its input";
    be_->grouped_experts(x, counts, w1, w3, w2, limit, block);
    EXPECT_EQ(0, std::memcmp(x.f32(), want.f32(), rows * d * 4)) << "grouped_experts";

    Tensor plain = Tensor::f32(Shape{rows, d});
    be_->routed_experts(plain, f32_tensor(xv, Shape{rows, d}), id_t, w1, w3, w2, 1, limit);
    EXPECT_NE(0, std::memcmp(plain.f32(), want.f32(), rows * d * 4)) << "quantizing changed nothing";
    EXPECT_THROW(be_->routed_experts(out, f32_tensor(xv, Shape{rows, d}), id_t, w1, w3, w2, 1, limit, 96), Error);
}

}  // namespace
}  // namespace deepinfer
