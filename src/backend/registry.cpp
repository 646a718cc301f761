#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "deepinfer/error.h"

namespace deepinfer {

std::unique_ptr<Backend> create_backend(const std::string& device, int num_threads) {
    if (device == "cpu") return std::make_unique<CpuBackend>(num_threads);
    if (device == "cuda") DI_THROW("device 'cuda' is not available: this build has no CUDA backend");
    DI_THROW("unknown device '", device, "' (expected cpu or cuda)");
}

}  // namespace deepinfer
