// Matrix products over weights in any stored format.
#include <cblas.h>

#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace deepinfer {

namespace {

// Output features per task: enough tasks to balance the pool, tiles large enough to amortise the sgemm
// call, and small enough that the dequantized tile (tile * K floats) stays in cache.
int64_t tile_rows(int64_t n, int64_t k, int threads) {
    int64_t by_threads = (n + threads * 4 - 1) / (threads * 4);
    int64_t by_cache = std::max<int64_t>(16, (256 * 1024 / 4) / std::max<int64_t>(k, 1));
    int64_t tile = std::min<int64_t>(std::max<int64_t>(by_threads, 16), by_cache);
    return std::max<int64_t>(1, std::min(tile, n));
}

bool dense_f32_aligned(const LinearWeight& w) {
    return w.format == WeightFormat::kDense && w.data.dtype() == DType::kF32 &&
           reinterpret_cast<uintptr_t>(w.data.data()) % 4 == 0;
}

}  // namespace

void CpuBackend::gemm_rows(float* out, int64_t ldc, const float* x, int64_t lda, int64_t t, const LinearWeight& w,
                           int64_t w_row0, int64_t n) {
    const int64_t k = w.cols;
    const int64_t tile = tile_rows(n, k, pool_.num_threads());
    const int64_t tiles = (n + tile - 1) / tile;
    pool_.parallel_for(tiles, 1, [&](int64_t b, int64_t e) {
        std::vector<float> buffer;
        for (int64_t i = b; i < e; ++i) {
            const int64_t n0 = i * tile, n1 = std::min(n, n0 + tile);
            const float* wt;
            if (dense_f32_aligned(w)) {
                wt = w.data.as<const float>() + (w_row0 + n0) * k;
            } else {
                buffer.resize(static_cast<size_t>((n1 - n0) * k));
                dequantize_rows(w, w_row0 + n0, w_row0 + n1, buffer.data());
                wt = buffer.data();
            }
            if (batch_invariant_) {
                // One row per call: OpenBLAS may pick kernels (and reduction orders) by the row count.
                for (int64_t r = 0; r < t; ++r)
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, 1, static_cast<int>(n1 - n0),
                                static_cast<int>(k), 1.0f, x + r * lda, static_cast<int>(lda), wt, static_cast<int>(k),
                                0.0f, out + r * ldc + n0, static_cast<int>(ldc));
            } else {
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(t), static_cast<int>(n1 - n0),
                            static_cast<int>(k), 1.0f, x, static_cast<int>(lda), wt, static_cast<int>(k), 0.0f,
                            out + n0, static_cast<int>(ldc));
            }
        }
    });
}

void CpuBackend::linear(TensorView out, TensorView x, const LinearWeight& w) {
    const int64_t t = x.dim(0);
    DI_ICHECK(x.ndim() == 2 && x.dim(1) == w.cols && out.dim(0) == t && out.numel() == t * w.rows, "linear ",
              w.name, ": x ", x.shape().str(), ", out ", out.shape().str(), ", W [", w.rows, ", ", w.cols, "]");
    if (t == 0) return;
    gemm_rows(out.f32(), w.rows, x.f32(), w.cols, t, w, 0, w.rows);
}

void CpuBackend::grouped_linear(TensorView out, TensorView x, const LinearWeight& w, int groups) {
    const int64_t t = x.dim(0), r = w.rows / groups, k = w.cols;
    DI_ICHECK(w.rows % groups == 0 && x.numel() == t * groups * k && out.numel() == t * w.rows, "grouped_linear ",
              w.name);
    if (t == 0) return;
    for (int g = 0; g < groups; ++g)
        gemm_rows(out.f32() + g * r, w.rows, x.f32() + g * k, groups * k, t, w, g * r, r);
}

void CpuBackend::embedding(TensorView out, const LinearWeight& table, const int32_t* ids) {
    const int64_t t = out.dim(0), d = table.cols;
    DI_ICHECK(out.numel() == t * d, "embedding output ", out.shape().str());
    float* o = out.f32();
    for (int64_t i = 0; i < t; ++i) {
        DI_CHECK(ids[i] >= 0 && ids[i] < table.rows, "token id ", ids[i], " is outside the vocabulary [0, ",
                 table.rows, ")");
        dequantize_rows(table, ids[i], ids[i] + 1, o + i * d);
    }
}

}  // namespace deepinfer
