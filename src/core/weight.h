// A weight matrix in its stored format, and dequantization of row ranges to fp32.
// Formats: dense F32/BF16/F16; FP8 e4m3 with per-block scales (E8M0 or F32, e.g. 128x128 blocks);
// packed FP4 e2m1 (two codes per byte, low nibble = even column) with E8M0 scales per group of columns.
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace deepinfer {

enum class WeightFormat : uint8_t { kDense, kFp8Block, kFp4Group };

struct LinearWeight {
    WeightFormat format = WeightFormat::kDense;
    int64_t rows = 0;       // N (output features)
    int64_t cols = 0;       // K (input features)
    TensorView data;        // dense: [N, K] F32/BF16/F16; FP8: [N, K] F8_E4M3; FP4: [N, K/2] packed bytes
    TensorView scale;       // FP8: [ceil(N/block_rows), ceil(K/block_cols)] E8M0 or F32; FP4: [N, K/group] E8M0
    int block_rows = 0;     // FP8 block height (128)
    int block_cols = 0;     // FP8 block width (128); FP4 group size (32)
    std::string name;       // for error messages

    bool empty() const { return data.empty(); }
    // Bytes the stored weight occupies (data + scales).
    size_t stored_bytes() const { return data.nbytes() + scale.nbytes(); }
};

// Writes rows [row_begin, row_end) of W as fp32 into out (row-major, `cols` floats per row).
void dequantize_rows(const LinearWeight& w, int64_t row_begin, int64_t row_end, float* out);

// Element-wise conversion of a float tensor of any float dtype (F32/BF16/F16/F8_E4M3) to fp32.
void convert_to_f32(const TensorView& src, float* out);

}  // namespace deepinfer
