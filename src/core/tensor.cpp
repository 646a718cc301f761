#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace deepinfer {

Shape::Shape(std::initializer_list<int64_t> d) {
    DI_ICHECK(d.size() <= kMaxDims, "too many dims: ", d.size());
    for (int64_t v : d) dims[ndim++] = v;
}

int64_t Shape::numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= dims[i];
    return n;
}

bool Shape::operator==(const Shape& o) const {
    if (ndim != o.ndim) return false;
    for (int i = 0; i < ndim; ++i)
        if (dims[i] != o.dims[i]) return false;
    return true;
}

std::string Shape::str() const {
    std::string s = "[";
    for (int i = 0; i < ndim; ++i) {
        if (i) s += ", ";
        s += std::to_string(dims[i]);
    }
    return s + "]";
}

TensorView TensorView::slice_rows(int64_t begin, int64_t end) const {
    DI_ICHECK(shape_.ndim >= 1 && 0 <= begin && begin <= end && end <= shape_.dims[0], "bad row slice [", begin,
              ", ", end, ") of ", shape_.str());
    Shape s = shape_;
    s.dims[0] = end - begin;
    int64_t row_elems = shape_.dims[0] ? numel() / shape_.dims[0] : 0;
    size_t offset = static_cast<size_t>(begin * row_elems * dtype_bits(dtype_) / 8);
    return TensorView(static_cast<uint8_t*>(data_) + offset, dtype_, s);
}

TensorView TensorView::reshape(Shape s) const {
    DI_ICHECK(s.numel() == numel(), "cannot reshape ", shape_.str(), " to ", s.str());
    return TensorView(data_, dtype_, s);
}

void Tensor::Free::operator()(uint8_t* p) const {
    if (release) release(context, p);
    else std::free(p);
}

Tensor Tensor::adopt(void* data, DType dtype, Shape shape, Release release, void* context) {
    Tensor t;
    t.dtype_ = dtype;
    t.shape_ = shape;
    t.buf_ = std::unique_ptr<uint8_t, Free>(static_cast<uint8_t*>(data), Free{release, context});
    return t;
}

Tensor::Tensor(DType dtype, Shape shape) : dtype_(dtype), shape_(shape) {
    size_t bytes = view().nbytes();
    size_t alloc = (bytes + 63) / 64 * 64;
    if (alloc == 0) alloc = 64;
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, alloc));
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, alloc);
    buf_ = std::unique_ptr<uint8_t, Free>(p, Free{nullptr, nullptr});
}

}  // namespace deepinfer
