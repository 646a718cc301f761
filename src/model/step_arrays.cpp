#include "model/step_arrays.h"

#include <cstring>

namespace deepinfer {

StepArrays::Handle StepArrays::stage(const void* data, DType dtype, int64_t n) {
    DI_ICHECK(!staged_base_, "StepArrays: staging after upload_staged()");
    const size_t offset = (staged_.size() + 15) / 16 * 16, bytes = static_cast<size_t>(n) * (dtype_bits(dtype) / 8);
    staged_.resize(offset + bytes);
    if (bytes) std::memcpy(staged_.data() + offset, data, bytes);
    return Handle{offset, dtype, n};
}

StepArrays::Handle StepArrays::stage_i32(std::span<const int32_t> values) {
    return stage(values.data(), DType::kI32, static_cast<int64_t>(values.size()));
}

StepArrays::Handle StepArrays::reserve_i32(int64_t n) {
    DI_ICHECK(!staged_base_ && n >= 0, "StepArrays: reserving after upload_staged()");
    const size_t offset = (reserved_bytes_ + 15) / 16 * 16;
    reserved_bytes_ = offset + static_cast<size_t>(n) * 4;
    return Handle{offset, DType::kI32, n, true};
}

StepArrays::Handle StepArrays::stage_rows(std::span<float* const> addresses) {
    return stage(addresses.data(), DType::kI64, static_cast<int64_t>(addresses.size()));
}

void StepArrays::upload_staged() {
    DI_ICHECK(!staged_base_, "StepArrays: upload_staged() twice");
    const int64_t words = static_cast<int64_t>((staged_.size() + 15) / 16 * 4);  // reserved arrays start aligned
    staged_.resize(static_cast<size_t>(words) * 4);
    const int64_t reserved_words = static_cast<int64_t>((reserved_bytes_ + 3) / 4);
    block_ = backend_.alloc(DType::kI32, Shape{std::max<int64_t>(words + reserved_words, 4)});
    staged_base_ = static_cast<uint8_t*>(block_.view().data());
    if (words) backend_.upload(TensorView(staged_base_, DType::kI32, Shape{words}), staged_.data());
}

TensorView StepArrays::view(const Handle& h) const {
    DI_ICHECK(staged_base_, "StepArrays: view() before upload_staged()");
    return TensorView(staged_base_ + (h.reserved ? staged_.size() : 0) + h.offset, h.dtype, Shape{h.n});
}

Tensor to_host(Backend& backend, TensorView t) {
    Tensor h(t.dtype(), t.shape());
    if (t.nbytes()) backend.download(h.view().data(), t);
    return h;
}

}  // namespace deepinfer
