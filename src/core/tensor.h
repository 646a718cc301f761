// Tensor views (non-owning, contiguous, row-major) and an owning aligned buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "core/dtype.h"
#include "deepinfer/error.h"

namespace deepinfer {

constexpr int kMaxDims = 5;

struct Shape {
    int64_t dims[kMaxDims] = {};
    int ndim = 0;

    Shape() = default;
    Shape(std::initializer_list<int64_t> d);

    int64_t operator[](int i) const { return dims[i]; }
    int64_t& operator[](int i) { return dims[i]; }
    int64_t numel() const;
    bool operator==(const Shape& o) const;
    bool operator!=(const Shape& o) const { return !(*this == o); }
    std::string str() const;  // "[2, 3]"
};

// A contiguous view of memory it does not own. Packed FP4 views count logical elements.
class TensorView {
public:
    TensorView() = default;
    TensorView(void* data, DType dtype, Shape shape) : data_(data), dtype_(dtype), shape_(shape) {}

    void* data() const { return data_; }
    DType dtype() const { return dtype_; }
    const Shape& shape() const { return shape_; }
    int ndim() const { return shape_.ndim; }
    int64_t dim(int i) const { return shape_.dims[i < 0 ? i + shape_.ndim : i]; }
    int64_t numel() const { return shape_.numel(); }
    size_t nbytes() const { return static_cast<size_t>((numel() * dtype_bits(dtype_) + 7) / 8); }
    bool empty() const { return data_ == nullptr; }

    template <typename T>
    T* as() const { return static_cast<T*>(data_); }
    float* f32() const {
        DI_ICHECK(dtype_ == DType::kF32, "tensor is ", dtype_name(dtype_), ", not F32");
        return static_cast<float*>(data_);
    }

    // Rows [begin, end) of the leading dimension.
    TensorView slice_rows(int64_t begin, int64_t end) const;
    // The same memory seen with another shape of equal element count.
    TensorView reshape(Shape s) const;

private:
    void* data_ = nullptr;
    DType dtype_ = DType::kF32;
    Shape shape_;
};

// Owning buffer with a shape: 64-byte aligned zero-initialised host memory, or memory another allocator
// (a device backend) hands over with its release function.
class Tensor {
public:
    using Release = void (*)(void* context, void* data);

    Tensor() = default;
    Tensor(DType dtype, Shape shape);
    // Takes ownership of `data`, freed by release(context, data).
    static Tensor adopt(void* data, DType dtype, Shape shape, Release release, void* context);

    static Tensor f32(Shape shape) { return Tensor(DType::kF32, shape); }

    TensorView view() const { return TensorView(buf_.get(), dtype_, shape_); }
    operator TensorView() const { return view(); }
    float* f32() const { return view().f32(); }
    template <typename T>
    T* as() const { return reinterpret_cast<T*>(buf_.get()); }
    const Shape& shape() const { return shape_; }
    int64_t dim(int i) const { return view().dim(i); }
    int64_t numel() const { return shape_.numel(); }
    DType dtype() const { return dtype_; }
    size_t nbytes() const { return view().nbytes(); }

private:
    struct Free {  // value-initialised (no release): std::free
        Release release;
        void* context;
        void operator()(uint8_t* p) const;
    };
    std::unique_ptr<uint8_t, Free> buf_;
    DType dtype_ = DType::kF32;
    Shape shape_;
};

}  // namespace deepinfer
