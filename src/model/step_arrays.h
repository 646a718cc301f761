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

    // One upload each, usable at once.
    TensorView i32(std::span<const int32_t> values);
    TensorView f32(std::span<const float> values);
    // Device addresses of rows (for gather_rows / scatter_rows).
    TensorView rows(std::span<float* const> addresses);

    // Staged arrays: stage() keeps a host copy and returns a handle; upload_staged() copies everything staged
    // so far in one transfer (each upload is a copy of its own on a device, a few microseconds), after which
    // view() gives the array in backend memory.
    struct Handle {
        size_t offset = 0;  // bytes into the staged block
        DType dtype = DType::kI32;
        int64_t n = 0;
    };
    Handle stage_i32(std::span<const int32_t> values);
    Handle stage_rows(std::span<float* const> addresses);
    void upload_staged();
    TensorView view(const Handle& h) const;

private:
    TensorView copy(const void* data, DType dtype, int64_t n);
    Handle stage(const void* data, DType dtype, int64_t n);

    Backend& backend_;
    std::vector<Tensor> keep_;
    std::vector<uint8_t> staged_;  // host bytes of the staged arrays, each at a 16-byte boundary
    uint8_t* staged_base_ = nullptr;  // their copy in backend memory (after upload_staged)
};

// A device tensor's values on the host (a copy; the tensor itself on host backends).
Tensor to_host(Backend& backend, TensorView t);

}  // namespace deepinfer
