// Deterministic finite device contents for the CUDA micro-benchmarks, by byte index and seed.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace deepinfer::bench {

enum FillKind : int {
    kFillF32 = 0,   // f32 in [-1, 1)
    kFillBf16 = 1,  // bf16 in +-[0.5, 1)
    kFillE4m3 = 2,  // e4m3 without NaN (exponent < 8)
    kFillE2m1 = 3,  // packed e2m1, any byte
    kFillE8m0 = 4,  // E8M0 scales 2^-8 .. 2^-1
};

static __global__ void fill_kernel(uint8_t* p, int64_t bytes, int kind, uint32_t seed) {
    const int64_t stride = int64_t{gridDim.x} * blockDim.x;
    for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < bytes; i += stride) {
        uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ (seed * 40503u + static_cast<uint32_t>(i >> 32));
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        if (kind == kFillF32) {
            if (i % 4 == 0) *reinterpret_cast<float*>(p + i) = static_cast<float>(h % 2048) / 1024.0f - 1.0f;
        } else if (kind == kFillBf16) {
            if (i % 2 == 0) *reinterpret_cast<uint16_t*>(p + i) = static_cast<uint16_t>((h & 0x807f) | 0x3f00);
        } else if (kind == kFillE4m3) {
            p[i] = static_cast<uint8_t>(h & 0xbf);
        } else if (kind == kFillE2m1) {
            p[i] = static_cast<uint8_t>(h);
        } else {
            p[i] = static_cast<uint8_t>(119 + h % 8);
        }
    }
}

// Fills `bytes` bytes at p with `kind` contents.
inline void fill_device(void* p, int64_t bytes, int kind, uint32_t seed) {
    fill_kernel<<<2048, 256>>>(static_cast<uint8_t*>(p), bytes, kind, seed);
    DI_CUDA_LAUNCH_CHECK();
}

// A new device buffer of `bytes` bytes with `kind` contents.
inline void* device_fill(int64_t bytes, int kind, uint32_t seed) {
    void* p = nullptr;
    DI_CUDA_CHECK(cudaMalloc(&p, bytes));
    fill_device(p, bytes, kind, seed);
    return p;
}

}  // namespace deepinfer::bench
