// FP8 activations for the products with FP8 weights, as DeepSeek's reference inference runs them: each input row
// quantized to e4m3 with a power-of-two scale per block of columns (its act_quant) before the product, so that the
// product is what FP8 tensor cores compute from such inputs. transformers' model, the V4 oracle, multiplies the
// activations unquantized, so this is off unless DEEPINFER_FP8_ACTIVATIONS=1.
//
// The routed experts quantize their inputs the same way (x and the SwiGLU output, Backend::routed_experts' act_block),
// which lets prefill run them on FP8 tensor cores (backend/cuda/experts_fp8.cu).
//
// On the default model (held-out perplexity 7.4934, CPU) it gives 7.5004 (+0.09%; 7.4991 with the routed experts'
// inputs left unquantized); the GPU path's perplexity bound is 0.5%.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "core/weight.h"

namespace deepinfer {

struct ActivationQuant {
    int block = 0;  // columns per scale; 0: off

    // DEEPINFER_FP8_ACTIVATIONS: unset or "0": off; "1": blocks of 128 (DeepSeek-V4's reference). Anything else is an
    // error.
    static ActivationQuant from_env();

    bool on() const { return block > 0; }
    // Whether a product with w quantizes its input.
    bool quantizes(const LinearWeight& w) const {
        return on() && w.format == WeightFormat::kFp8Block && w.cols % block == 0;
    }
    // The routed experts' activation block (Backend::routed_experts' act_block) for experts of width inter over D
    // columns: the block where D and inter are whole blocks, else 0 (their inputs multiplied as they are).
    int expert_block(int64_t d, int64_t inter) const {
        return on() && d % block == 0 && inter % block == 0 ? block : 0;
    }
    // be.linears(x, ps) with the products that quantize their input taking it quantized (Backend::quantized_linears).
    void linears(Backend& be, TensorView x, const std::vector<Backend::Projection>& ps) const;
    // be.linear(out, x, w), x quantized first where the product quantizes its input.
    void linear(Backend& be, TensorView out, TensorView x, const LinearWeight& w) const;
    // be.grouped_linear(out, x, w, groups), likewise (each group's columns a multiple of the block).
    void grouped_linear(Backend& be, TensorView out, TensorView x, const LinearWeight& w, int groups) const;
};

}  // namespace deepinfer
