// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"): a counter-based generator.
// The same (key, counter) always gives the same numbers, on any thread, in any order: sampling draws
// from counter = (request-local token index, draw index) so results do not depend on batching.
#pragma once

#include <array>
#include <cstdint>

namespace deepinfer {

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// A uniform float in [0, 1) from (seed, stream, index): 24 random bits.
float philox_uniform(uint64_t seed, uint64_t stream, uint64_t index);

}  // namespace deepinfer
