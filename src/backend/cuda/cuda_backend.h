// The CUDA backend (NVIDIA GPUs; built for Hopper, sm_90a): the Backend op set on device memory, one stream
// per backend (and side streams that an op may fork from it and join back into before it returns),
// stream-ordered allocation (cudaMallocAsync's pool is the caching allocator). Plain C++ header: nothing here
// needs the CUDA toolkit's headers.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace deepinfer {

// Throws Error when no CUDA device is usable (no driver, no device, or device_index out of range).
std::unique_ptr<Backend> make_cuda_backend(int device_index, int host_threads);

// Number of CUDA devices visible (0 when the driver or devices are missing; never throws).
int cuda_device_count();

}  // namespace deepinfer
