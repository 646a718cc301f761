#include "core/weight.h"

#include <cstring>

namespace deepinfer {

namespace {

inline uint16_t load_u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}

inline float load_f32(const uint8_t* p) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
}

// Scale of one FP8 block, from an E8M0 byte or an fp32 value.
inline float fp8_block_scale(const TensorView& scale, int64_t block_row, int64_t block_col) {
    int64_t idx = block_row * scale.dim(1) + block_col;
    const auto* p = static_cast<const uint8_t*>(scale.data());
    if (scale.dtype() == DType::kE8M0) return e8m0_to_f32(p[idx]);
    return load_f32(p + 4 * idx);
}

void convert_row(DType dtype, const uint8_t* src, int64_t n, float* out) {
    switch (dtype) {
        case DType::kF32: std::memcpy(out, src, static_cast<size_t>(n) * 4); break;
        case DType::kBF16:
            for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(load_u16(src + 2 * i));
            break;
        case DType::kF16:
            for (int64_t i = 0; i < n; ++i) out[i] = f16_to_f32(load_u16(src + 2 * i));
            break;
        case DType::kF8E4M3:
            for (int64_t i = 0; i < n; ++i) out[i] = f8e4m3_to_f32(src[i]);
            break;
        default: DI_ICHECK(false, "cannot convert ", dtype_name(dtype), " to f32");
    }
}

}  // namespace

void convert_to_f32(const TensorView& src, float* out) {
    convert_row(src.dtype(), static_cast<const uint8_t*>(src.data()), src.numel(), out);
}

void dequantize_rows(const LinearWeight& w, int64_t row_begin, int64_t row_end, float* out) {
    DI_ICHECK(0 <= row_begin && row_begin <= row_end && row_end <= w.rows, "rows [", row_begin, ", ", row_end,
              ") of ", w.name);
    const int64_t k = w.cols;
    const auto* base = static_cast<const uint8_t*>(w.data.data());
    switch (w.format) {
        case WeightFormat::kDense: {
            const int64_t esize = dtype_bits(w.data.dtype()) / 8;
            convert_row(w.data.dtype(), base + row_begin * k * esize, (row_end - row_begin) * k, out);
            return;
        }
        case WeightFormat::kFp8Block: {
            for (int64_t r = row_begin; r < row_end; ++r) {
                const uint8_t* src = base + r * k;
                float* dst = out + (r - row_begin) * k;
                const int64_t br = r / w.block_rows;
                for (int64_t c0 = 0; c0 < k; c0 += w.block_cols) {
                    const int64_t c1 = c0 + w.block_cols < k ? c0 + w.block_cols : k;
                    const float s = fp8_block_scale(w.scale, br, c0 / w.block_cols);
                    for (int64_t c = c0; c < c1; ++c) dst[c] = f8e4m3_to_f32(src[c]) * s;
                }
            }
            return;
        }
        case WeightFormat::kFp4Group: {
            const int64_t groups = k / w.block_cols;
            const auto* scales = static_cast<const uint8_t*>(w.scale.data());
            for (int64_t r = row_begin; r < row_end; ++r) {
                const uint8_t* src = base + r * (k / 2);
                float* dst = out + (r - row_begin) * k;
                for (int64_t g = 0; g < groups; ++g) {
                    const float s = e8m0_to_f32(scales[r * groups + g]);
                    for (int64_t c = g * w.block_cols; c < (g + 1) * w.block_cols; c += 2) {
                        const uint8_t byte = src[c / 2];
                        dst[c] = fp4e2m1_to_f32(byte & 0xf) * s;
                        dst[c + 1] = fp4e2m1_to_f32(byte >> 4) * s;
                    }
                }
            }
            return;
        }
    }
}

}  // namespace deepinfer
