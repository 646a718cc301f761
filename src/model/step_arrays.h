// Small per-step host arrays (token ids, positions, attention index lists, row addresses) copied into the
// backend's memory for the ops that read them, kept alive until the step ends.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"

namespace deepinfer {

class StepArrays {
public:
    explicit StepArrays(Backend& backend) : backend_(backend) {}

    TensorView i32(std::span<const int32_t> values);
    TensorView f32(std::span<const float> values);
    // Device addresses of rows (for gather_rows / scatter_rows).
    TensorView rows(std::span<float* const> addresses);

private:
    TensorView copy(const void* data, DType dtype, int64_t n);

    Backend& backend_;
    std::vector<Tensor> keep_;
};

// A device tensor's values on the host (a copy; the tensor itself on host backends).
Tensor to_host(Backend& backend, TensorView t);

}  // namespace deepinfer
