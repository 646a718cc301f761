#include "backend/cpu/cpu_backend.h"

#include <cblas.h>

#include <cstring>

namespace deepinfer {

CpuBackend::CpuBackend(int num_threads) : pool_(num_threads) {
    // Parallelism comes from our pool (one sgemm per output tile); OpenBLAS must not spawn its own threads.
    openblas_set_num_threads(1);
}

void CpuBackend::upload(TensorView dst, const void* src) { std::memcpy(dst.data(), src, dst.nbytes()); }

void CpuBackend::download(void* dst, TensorView src) { std::memcpy(dst, src.data(), src.nbytes()); }

}  // namespace deepinfer
