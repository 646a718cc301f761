// Random weights in a checkpoint's release formats, for `--load-format random`: a model of any config runs
// (and can be benchmarked) without its checkpoint, reading the same bytes per step as the real one.
// Values are not meant to be meaningful, only finite and of a sane scale: matrices have a per-element
// standard deviation near 1/sqrt(in_features), norm weights are 1, biases and sinks 0.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace deepinfer {

// How DeepSeek's releases store the matrix `<base>.weight` (base in canonical release naming).
enum class ReleaseFormat { kBF16, kFp8Block, kFp4Group };
ReleaseFormat release_format(const std::string& base);

// One named tensor to add to a synthetic checkpoint.
struct NamedTensor {
    std::string name;
    Tensor tensor;
};

// The tensors of a [rows, cols] matrix `<base>.weight` in `format` (FP8: 128x128 blocks with E8M0
// `<base>.scale`; FP4: packed I8 [rows, cols/2] with E8M0 `<base>.scale` per 32 inputs).
std::vector<NamedTensor> random_matrix(const std::string& base, int64_t rows, int64_t cols, ReleaseFormat format,
                                       int fp8_block_rows, int fp8_block_cols, uint64_t seed);
// A BF16 vector/tensor `name` whose value depends on its role (norm weights 1, biases/sinks 0, others small).
Tensor random_float_tensor(const std::string& name, Shape shape, uint64_t seed);
// [rows, k] I32 with k distinct values in [0, bound) per row (hash-routing tables).
Tensor random_index_table(int64_t rows, int64_t k, int32_t bound, uint64_t seed);

// A stable seed for `name` under the model seed.
uint64_t tensor_seed(uint64_t model_seed, const std::string& name);

}  // namespace deepinfer
