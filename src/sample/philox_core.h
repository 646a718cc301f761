// Philox4x32-10 on plain integers, for host code and CUDA kernels alike (the samplers of both devices must draw
// the same numbers). philox.h holds the host API.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define DI_PHILOX_HD __host__ __device__ __forceinline__
#else
#define DI_PHILOX_HD inline
#endif

namespace deepinfer::philox_core {

// ctr: the 128-bit counter, replaced by the block's four random words; (k0, k1): the 64-bit key.
DI_PHILOX_HD void philox4x32_10(uint32_t ctr[4], uint32_t k0, uint32_t k1) {
    constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
    for (int round = 0; round < 10; ++round) {
        const uint64_t p0 = static_cast<uint64_t>(kM0) * ctr[0];
        const uint64_t p1 = static_cast<uint64_t>(kM1) * ctr[2];
        const uint32_t c1 = ctr[1], c3 = ctr[3];
        ctr[0] = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
        ctr[1] = static_cast<uint32_t>(p1);
        ctr[2] = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
        ctr[3] = static_cast<uint32_t>(p0);
        k0 += kW0;
        k1 += kW1;
    }
}

// A uniform float in [0, 1) from (seed, stream, index): the top 24 bits of the block's first word.
DI_PHILOX_HD float uniform24(uint64_t seed, uint64_t stream, uint64_t index) {
    uint32_t ctr[4] = {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), static_cast<uint32_t>(stream),
                       static_cast<uint32_t>(stream >> 32)};
    philox4x32_10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
    return static_cast<float>(ctr[0] >> 8) * (1.0f / 16777216.0f);
}

}  // namespace deepinfer::philox_core
