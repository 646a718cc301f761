// moe_forward on CUDA with FP8 activations (MoeParams::act_quant): the shared expert runs on the side lane, its FP8
// products on cuBLASLt's FP8 GEMM from xn, beside the router and the routed experts, which read xn meanwhile. Against
// the same backend kind with DEEPINFER_CUDA_FP8_GEMM=0 (the shared expert's products on the bf16 kernels from the same
// quantized activations; the routing and the routed experts the same kernels on the same inputs): the outputs differ
// only by the FP8 GEMM's sums (within 1e-3 of a product's largest output, CudaFp8Gemm) and by the codes of the down
// product's input that those sums move across a rounding boundary (an e4m3 step, 1/8 of an element, each): 3e-2 here
// (seen 2.1e-2; without SwiGLU's clamp the terms are heavy-tailed, so a flip can weigh more),
// where a wrong scale or block is off by order 1; not at all were the FP8 GEMM not taken. The CPU's moe_forward bounds
// both at the bf16 products' bound, and xn must come back untouched. Shapes: D = shared_inter = 512 (the FP8 GEMM takes
// K of 512 and more), 130 tokens (the GEMM takes 128 rows, the last 2 take the GEMV), 8 FP4 experts of width 256,
// top-2, no SwiGLU clamp.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "cuda_test_support.h"
#include "model/moe.h"
#include "support/npy_compare.h"

namespace deepinfer {
namespace {

using testing_support::HostWeight;
using testing_support::make_weight;
using testing_support::rel_error;

class CudaMoeFp8 : public testing_support::CudaCompare {
public:
    CudaMoeFp8() : CudaCompare("auto") {}
};

TEST_F(CudaMoeFp8, SharedExpertOnTheSideLaneMatchesTheBf16PathAndTheCpu) {
    setenv("DEEPINFER_CUDA_FP8_GEMM", "0", 1);
    const std::unique_ptr<Backend> bf16 = create_backend("cuda", 2);
    unsetenv("DEEPINFER_CUDA_FP8_GEMM");

    const int64_t d = 512, shared_inter = 512, inter = 256, experts = 8, t = 130;
    MoeParams p;
    p.num_experts = static_cast<int>(experts);
    p.experts_per_token = 2;
    p.moe_inter = static_cast<int>(inter);
    p.routed_scaling = 1.5;
    // No SwiGLU clamp: the routed experts quantize their SwiGLU output too, and a clamped value sits next to an e4m3
    // rounding boundary, where f32 noise between backends flips its code (cuda_experts_fp8_test.cpp says more).
    p.swiglu_limit = 0.0f;
    p.act_quant = ActivationQuant{128};

    // The host weights (kept alive: the LinearWeights view them) and the MoeWeights over them.
    std::vector<HostWeight> hw;
    hw.push_back(make_weight(rng_, 0, experts, d));  // the router, f32
    for (int64_t e = 0; e < experts; ++e) {
        hw.push_back(make_weight(rng_, 4, inter, d));  // w1
        hw.push_back(make_weight(rng_, 4, d, inter));  // w2
        hw.push_back(make_weight(rng_, 4, inter, d));  // w3
    }
    hw.push_back(make_weight(rng_, 6, shared_inter, d));  // shared w1, w2, w3: FP8 128 x 128
    hw.push_back(make_weight(rng_, 6, d, shared_inter));
    hw.push_back(make_weight(rng_, 6, shared_inter, d));
    auto weights = [&] {  // MoeWeights over hw (move-only: one for each backend)
        MoeWeights w;
        w.gate = hw[0].w;
        w.bias = Tensor::f32(Shape{experts});
        std::memset(w.bias.f32(), 0, experts * 4);
        for (int64_t e = 0; e < experts; ++e) {
            w.w1.push_back(hw[1 + 3 * e].w);
            w.w2.push_back(hw[2 + 3 * e].w);
            w.w3.push_back(hw[3 + 3 * e].w);
        }
        w.shared = {hw[1 + 3 * experts].w, hw[2 + 3 * experts].w, hw[3 + 3 * experts].w};
        w.shared_inter = static_cast<int>(shared_inter);
        return w;
    };
    MoeWeights host_w = weights(), fp8_w = weights(), bf16_w = weights();
    ASSERT_TRUE(p.act_quant.quantizes(host_w.shared.w1) && p.act_quant.quantizes(host_w.shared.w2));

    moe_to_backend(*gpu_, fp8_w, &storage_);
    moe_to_backend(*bf16, bf16_w, &storage_);

    const std::vector<float> xv = randn(t * d);
    Tensor x = host(xv, Shape{t, d});
    Tensor tokens = Tensor(DType::kI32, Shape{t});
    std::memset(tokens.view().data(), 0, t * 4);
    Tensor x_fp8 = device(x), tokens_fp8 = device(tokens);
    Tensor x_bf16 = to_backend(*bf16, x), tokens_bf16 = to_backend(*bf16, tokens);

    Tensor ref = Tensor::f32(Shape{t, d});
    moe_forward(*cpu_, host_w, p, x, tokens, ref);
    Tensor out_fp8 = poisoned(Shape{t, d});
    moe_forward(*gpu_, fp8_w, p, x_fp8, tokens_fp8, out_fp8);
    Tensor out_bf16 = bf16->alloc(DType::kF32, Shape{t, d});
    moe_forward(*bf16, bf16_w, p, x_bf16, tokens_bf16, out_bf16);

    const std::vector<float> got = fetch(out_fp8), xn_after = fetch(x_fp8);
    std::vector<float> got_bf16(t * d);
    bf16->download(got_bf16.data(), out_bf16);
    EXPECT_EQ(std::memcmp(xn_after.data(), xv.data(), xv.size() * 4), 0) << "xn clobbered";
    EXPECT_LE(rel_error(got, got_bf16), 3e-2) << "FP8 GEMM against the bf16 path";
    EXPECT_NE(std::memcmp(got.data(), got_bf16.data(), got.size() * 4), 0) << "the FP8 GEMM was not taken";
    EXPECT_LE(rel_error(got, values(ref)), testing_support::kBf16Bound) << "against the CPU";
}

}  // namespace
}  // namespace deepinfer
