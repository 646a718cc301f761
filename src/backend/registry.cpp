#include <cstdlib>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "deepinfer/error.h"

namespace deepinfer {

std::unique_ptr<Backend> create_backend(const std::string& device, int num_threads) {
    const char* invariant = std::getenv("DEEPINFER_BATCH_INVARIANT");
    const bool batch_invariant = invariant && std::string(invariant) == "1";
    if (device == "cpu") {
        auto backend = std::make_unique<CpuBackend>(num_threads);
        backend->set_batch_invariant(batch_invariant);
        return backend;
    }
    if (device == "cuda") DI_THROW("device 'cuda' is not available: this build has no CUDA backend");
    DI_THROW("unknown device '", device, "' (expected cpu or cuda)");
}

}  // namespace deepinfer
