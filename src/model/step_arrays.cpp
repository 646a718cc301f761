#include "model/step_arrays.h"

#include <algorithm>
#include <cstring>

#include "model/model.h"

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

StepArrays::Handle StepArrays::stage_i64(std::span<const int64_t> values) {
    return stage(values.data(), DType::kI64, static_cast<int64_t>(values.size()));
}

StepArrays::Handle StepArrays::reserve(DType dtype, int64_t n) {
    DI_ICHECK(!staged_base_ && n >= 0, "StepArrays: reserving after upload_staged()");
    const size_t offset = (reserved_bytes_ + 15) / 16 * 16;
    reserved_bytes_ = offset + static_cast<size_t>(n) * (dtype_bits(dtype) / 8);
    return Handle{offset, dtype, n, true};
}

StepArrays::Handle StepArrays::reserve_i32(int64_t n) { return reserve(DType::kI32, n); }

StepArrays::Handle StepArrays::reserve_rows(int64_t n) { return reserve(DType::kI64, n); }

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

void RowRuns::add(const float* first, int64_t count, int64_t row_elems) {
    const int64_t stride = row_elems * static_cast<int64_t>(sizeof(float));
    for (int64_t done = 0; done < count; done += kMaxRunRows) {
        const int64_t n = std::min(kMaxRunRows, count - done);
        values.insert(values.end(),
                      {rows, static_cast<int64_t>(reinterpret_cast<uintptr_t>(first + done * row_elems)), n, stride});
        rows += n;
    }
}

void RowRuns::add_paged(const PagedRows& paged, int64_t count) {
    DI_ICHECK(count <= paged.capacity_rows(), "RowRuns: ", count, " rows of a paged buffer of ", paged.capacity_rows());
    for (int64_t r = 0; r < count; r += paged.rows_per_block)
        add(paged.blocks[r / paged.rows_per_block], std::min(paged.rows_per_block, count - r), paged.row_elems);
}

bool RowRuns::aligned(int64_t bytes) const {
    for (size_t i = 0; i < values.size(); i += 4)
        if (values[i + 1] % bytes != 0 || (values[i + 2] > 1 && values[i + 3] % bytes != 0)) return false;
    return true;
}

std::vector<int64_t> RowRuns::concat(const RowRuns& more) const {
    std::vector<int64_t> all = values;
    all.reserve(values.size() + more.values.size());
    for (size_t i = 0; i < more.values.size(); i += 4)
        all.insert(all.end(), {more.values[i] + rows, more.values[i + 1], more.values[i + 2], more.values[i + 3]});
    return all;
}

Tensor to_host(Backend& backend, TensorView t) {
    Tensor h(t.dtype(), t.shape());
    if (t.nbytes()) backend.download(h.view().data(), t);
    return h;
}

}  // namespace deepinfer
