#include "backend/cpu/cpu_backend.h"

#include <cblas.h>

namespace deepinfer {

CpuBackend::CpuBackend(int num_threads) : pool_(num_threads) {
    // Parallelism comes from our pool (one sgemm per output tile); OpenBLAS must not spawn its own threads.
    openblas_set_num_threads(1);
}

}  // namespace deepinfer
