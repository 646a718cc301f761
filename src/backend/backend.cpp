// The ops that backends may leave to a default written in terms of the other ops.
#include "backend/backend.h"

#include <algorithm>

#include "deepinfer/error.h"

namespace deepinfer {

std::vector<int64_t> Backend::expert_run_starts(TensorView x, const std::vector<int64_t>& counts,
                                                const std::vector<LinearWeight>& w1,
                                                const std::vector<LinearWeight>& w3,
                                                const std::vector<LinearWeight>& w2) {
    DI_ICHECK(x.ndim() == 2 && !w1.empty() && counts.size() == w1.size() && w3.size() == w1.size() &&
                  w2.size() == w1.size(),
              "grouped_experts: x ", x.shape().str(), ", ", counts.size(), " counts, ", w1.size(), " w1, ", w3.size(),
              " w3, ", w2.size(), " w2");
    const int64_t d = x.dim(1), inter = w1[0].rows;
    std::vector<int64_t> starts{0};
    for (size_t e = 0; e < counts.size(); ++e) {
        DI_ICHECK(counts[e] >= 0 && w1[e].rows == inter && w1[e].cols == d && w3[e].rows == inter &&
                      w3[e].cols == d && w2[e].rows == d && w2[e].cols == inter,
                  "grouped_experts: expert ", e, " with ", counts[e], " rows: w1 [", w1[e].rows, ", ", w1[e].cols,
                  "], w3 [", w3[e].rows, ", ", w3[e].cols, "], w2 [", w2[e].rows, ", ", w2[e].cols, "], x ",
                  x.shape().str(), ", width ", inter);
        starts.push_back(starts.back() + counts[e]);
    }
    DI_ICHECK(starts.back() == x.dim(0), "grouped_experts: counts sum to ", starts.back(), ", x has ", x.dim(0),
              " rows");
    return starts;
}

Tensor Backend::quantized_copy(TensorView x, QuantSim kind, int block) {
    Tensor q = alloc(x.dtype(), x.shape());
    copy(q, x);
    fake_quantize(q, kind, block);
    return q;
}

void Backend::quantized_linears(TensorView x, QuantSim kind, int block, const std::vector<Projection>& projections) {
    linears(quantized_copy(x, kind, block), projections);
}

void Backend::quantized_grouped_linear(TensorView out, TensorView x, QuantSim kind, int block, const LinearWeight& w,
                                       int groups) {
    grouped_linear(out, quantized_copy(x, kind, block), w, groups);
}

void Backend::check_act_block(int act_block, const std::vector<LinearWeight>& w1) {
    DI_ICHECK(act_block >= 0 &&
                  (act_block == 0 || (!w1.empty() && w1[0].cols % act_block == 0 && w1[0].rows % act_block == 0)),
              "routed experts: activation block ", act_block, " for D ", w1.empty() ? 0 : w1[0].cols, ", I ",
              w1.empty() ? 0 : w1[0].rows);
}

void Backend::grouped_experts(TensorView x, const std::vector<int64_t>& counts, const std::vector<LinearWeight>& w1,
                              const std::vector<LinearWeight>& w3, const std::vector<LinearWeight>& w2,
                              float swiglu_limit, int act_block) {
    const std::vector<int64_t> starts = expert_run_starts(x, counts, w1, w3, w2);
    check_act_block(act_block, w1);
    const int64_t widest = *std::max_element(counts.begin(), counts.end());
    if (widest == 0) return;
    if (act_block > 0) fake_quantize(x, QuantSim::kFp8Ue8m0, act_block);  // x is replaced run by run anyway
    // One gate and up scratch for every expert: the runs go one after the other.
    Tensor g = alloc(DType::kF32, Shape{widest, w1[0].rows}), u = alloc(DType::kF32, Shape{widest, w1[0].rows});
    for (size_t e = 0; e < counts.size(); ++e) {
        if (counts[e] == 0) continue;
        const TensorView xe = x.slice_rows(starts[e], starts[e + 1]);
        const TensorView ge = g.view().slice_rows(0, counts[e]), ue = u.view().slice_rows(0, counts[e]);
        linear(ge, xe, w1[e]);
        linear(ue, xe, w3[e]);
        swiglu(ge, ge, ue, swiglu_limit);
        if (act_block > 0) fake_quantize(ge, QuantSim::kFp8Ue8m0, act_block);
        linear(xe, ge, w2[e]);  // over the run's inputs, which w1 and w3 have consumed
    }
}

void Backend::hc_pre_norm(TensorView normed, TensorView post, TensorView comb, TensorView streams, const HcParams& p,
                          const float* norm_weight, float eps) {
    DI_ICHECK(streams.ndim() == 3 && normed.numel() == streams.dim(0) * streams.dim(2), "hc_pre_norm shapes");
    Tensor collapsed = alloc(DType::kF32, Shape{streams.dim(0), streams.dim(2)});
    hc_pre(collapsed, post, comb, streams, p);
    rms_norm(normed, collapsed, norm_weight, eps);
}

void Backend::routed_experts(TensorView out, TensorView x, TensorView expert_of_row,
                             const std::vector<LinearWeight>& w1, const std::vector<LinearWeight>& w3,
                             const std::vector<LinearWeight>& w2, int rows_per_input, float swiglu_limit,
                             int act_block) {
    DI_ICHECK(!w1.empty() && w3.size() == w1.size() && w2.size() == w1.size(), "routed_experts: ", w1.size(), " w1, ",
              w3.size(), " w3, ", w2.size(), " w2");
    check_act_block(act_block, w1);
    const int64_t rows = expert_of_row.numel(), inter = w1[0].rows;
    if (rows == 0) return;
    Tensor g = alloc(DType::kF32, Shape{rows, inter}), u = alloc(DType::kF32, Shape{rows, inter});
    const Tensor xq = act_block > 0 ? quantized_copy(x, QuantSim::kFp8Ue8m0, act_block) : Tensor();
    const TensorView in = act_block > 0 ? xq.view() : x;
    expert_linear(g, in, expert_of_row, w1, rows_per_input);
    expert_linear(u, in, expert_of_row, w3, rows_per_input);
    swiglu(g, g, u, swiglu_limit);
    if (act_block > 0) fake_quantize(g, QuantSim::kFp8Ue8m0, act_block);
    expert_linear(out, g, expert_of_row, w2, 1);
}

void Backend::grouped_experts_rows(TensorView out_rows, TensorView in_rows, int64_t cols,
                                   const std::vector<int64_t>& counts, const std::vector<LinearWeight>& w1,
                                   const std::vector<LinearWeight>& w3, const std::vector<LinearWeight>& w2,
                                   float swiglu_limit, int act_block) {
    DI_ICHECK(in_rows.ndim() == 1 && out_rows.ndim() == 1 && in_rows.dim(0) == out_rows.dim(0),
              "grouped_experts_rows: in_rows ", in_rows.shape().str(), ", out_rows ", out_rows.shape().str());
    Tensor x = alloc(DType::kF32, Shape{in_rows.dim(0), cols});  // [slots by expert, cols]
    gather_rows(x, in_rows);
    grouped_experts(x, counts, w1, w3, w2, swiglu_limit, act_block);
    scatter_rows(out_rows, x);
}

void SideQueue::begin() {
    DI_ICHECK(state_ == State::kIdle, "SideQueue::begin: the queue was already begun");
    be_.side_begin();
    state_ = State::kOpen;
}

void SideQueue::end() {
    DI_ICHECK(state_ == State::kOpen, "SideQueue::end: the queue is not open");
    be_.side_end();
    state_ = State::kEnded;
}

void SideQueue::join() {
    DI_ICHECK(state_ == State::kEnded, "SideQueue::join: the queue was not ended");
    be_.side_join();
    state_ = State::kJoined;
}

SideQueue::~SideQueue() {
    // Only after an exception: the step has failed, so a second error here is dropped (a destructor must not throw).
    try {
        if (state_ == State::kOpen) be_.side_end(), state_ = State::kEnded;
        if (state_ == State::kEnded) be_.side_join();
    } catch (...) {
    }
}

}  // namespace deepinfer
