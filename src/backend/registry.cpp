#include <cstdlib>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#ifdef DI_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#include "deepinfer/error.h"

namespace deepinfer {

Tensor to_backend(Backend& backend, TensorView host) {
    Tensor t = backend.alloc(host.dtype(), host.shape());
    if (host.nbytes()) backend.upload(t, host.data());
    return t;
}

LinearWeight to_backend(Backend& backend, const LinearWeight& w, std::vector<Tensor>* storage) {
    if (backend.is_host()) return w;
    LinearWeight d = w;
    storage->push_back(to_backend(backend, w.data));
    d.data = storage->back().view();
    if (!w.scale.empty()) {
        storage->push_back(to_backend(backend, w.scale));
        d.scale = storage->back().view();
    }
    return d;
}

std::unique_ptr<Backend> create_backend(const std::string& device, int num_threads) {
    const char* invariant = std::getenv("DEEPINFER_BATCH_INVARIANT");
    const bool batch_invariant = invariant && std::string(invariant) == "1";
    if (device == "cpu") {
        auto backend = std::make_unique<CpuBackend>(num_threads);
        backend->set_batch_invariant(batch_invariant);
        return backend;
    }
    if (device == "cuda" || device.rfind("cuda:", 0) == 0) {
#ifdef DI_HAVE_CUDA
        const int index = device == "cuda" ? 0 : std::stoi(device.substr(5));
        auto backend = make_cuda_backend(index, num_threads);
        backend->set_batch_invariant(batch_invariant);
        return backend;
#else
        DI_THROW("device '", device, "' is not available: this build has no CUDA backend (build with DI_CUDA=ON)");
#endif
    }
    DI_THROW("unknown device '", device, "' (expected cpu, cuda or cuda:N)");
}

}  // namespace deepinfer
