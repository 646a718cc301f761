// Looks up checkpoint tensors by their canonical (DeepSeek release) names, trying the spellings other
// writers use, and turns them into validated weights: LinearWeight for matrices kept in their stored
// format, fp32 copies for the small vectors (norm weights, biases, sinks) that every token reads.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "core/weight.h"
#include "model/safetensors.h"

namespace deepinfer {

class WeightLoader {
public:
    // A synthetic checkpoint (Checkpoint::synthetic) is filled with random tensors as they are requested.
    // aliases: (canonical fragment, alternative fragment) replacements tried in order, e.g.
    // {"embed.weight", "embed_tokens.weight"}. Every candidate is also tried with a "model." prefix.
    WeightLoader(Checkpoint& ckpt, std::vector<std::pair<std::string, std::string>> aliases);

    // Name actually present for `canonical`, or "" when absent.
    std::string find(const std::string& canonical) const;
    bool has(const std::string& canonical) const { return !find(canonical).empty(); }

    // A [rows, cols] matrix `<base>.weight`: dense F32/BF16/F16, FP8 e4m3 with `<base>.scale` (E8M0) or
    // `<base>.weight_scale_inv` (F32) per block, or packed FP4 (I8 [rows, cols/2]) with E8M0 `<base>.scale`.
    LinearWeight linear(const std::string& base, int64_t rows, int64_t cols);
    // A float tensor of the given shape, converted to fp32 (owned).
    Tensor f32(const std::string& canonical, Shape shape);
    // An integer tensor (I32 or I64) of the given shape, as int32. Random weights draw distinct values per
    // row below random_bound.
    std::vector<int32_t> i32(const std::string& canonical, Shape shape, int32_t random_bound);

    void set_fp8_block(int rows, int cols) {
        fp8_block_rows_ = rows;
        fp8_block_cols_ = cols;
    }
    // Canonical names requested so far (to report unused tensors).
    const std::vector<std::string>& used() const { return used_; }
    Checkpoint& checkpoint() { return ckpt_; }

private:
    TensorView require(const std::string& canonical, std::string* actual);
    std::vector<std::string> candidates(const std::string& canonical) const;

    // A synthetic checkpoint gets random tensors (release formats) for every name first requested.
    bool absent_to_synthesize(const std::string& canonical) const {
        return ckpt_.is_synthetic() && find(canonical).empty();
    }

    Checkpoint& ckpt_;
    std::vector<std::pair<std::string, std::string>> aliases_;
    std::vector<std::string> used_;
    int fp8_block_rows_ = 128, fp8_block_cols_ = 128;
};

}  // namespace deepinfer
