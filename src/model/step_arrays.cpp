#include "model/step_arrays.h"

#include <cstring>

namespace deepinfer {

TensorView StepArrays::copy(const void* data, DType dtype, int64_t n) {
    keep_.push_back(backend_.alloc(dtype, Shape{std::max<int64_t>(n, 1)}));
    TensorView v(keep_.back().view().data(), dtype, Shape{n});
    if (n) backend_.upload(v, data);
    return v;
}

TensorView StepArrays::i32(std::span<const int32_t> values) {
    return copy(values.data(), DType::kI32, static_cast<int64_t>(values.size()));
}

TensorView StepArrays::f32(std::span<const float> values) {
    return copy(values.data(), DType::kF32, static_cast<int64_t>(values.size()));
}

TensorView StepArrays::rows(std::span<float* const> addresses) {
    static_assert(sizeof(float*) == 8, "row addresses are stored as I64");
    return copy(addresses.data(), DType::kI64, static_cast<int64_t>(addresses.size()));
}

Tensor to_host(Backend& backend, TensorView t) {
    Tensor h(t.dtype(), t.shape());
    if (t.nbytes()) backend.download(h.view().data(), t);
    return h;
}

}  // namespace deepinfer
