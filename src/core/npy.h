// Reading and writing NumPy .npy files (version 1/2/3 headers, C order, little endian).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace deepinfer {

struct NpyArray {
    DType dtype = DType::kF32;  // F32, F16, I8, U8, I16, I32, I64, BOOL (F64 is converted to F32)
    std::vector<int64_t> shape;
    std::vector<uint8_t> data;

    int64_t numel() const;
    TensorView view();
    // Elements converted to int64 / float (any integer or float dtype).
    std::vector<int64_t> to_i64() const;
    std::vector<float> to_f32() const;
};

NpyArray read_npy(const std::string& path);
NpyArray parse_npy(const uint8_t* bytes, size_t size, const std::string& what);

void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape);
void write_npy(const std::string& path, const int32_t* data, const std::vector<int64_t>& shape);
void write_npy(const std::string& path, const int64_t* data, const std::vector<int64_t>& shape);

}  // namespace deepinfer
