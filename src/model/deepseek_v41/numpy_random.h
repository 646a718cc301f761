// A bit-exact port of the numpy pieces DeepSeek-V4.1 derives its Engram hash multipliers from:
// numpy.random.default_rng(seed) (SeedSequence -> PCG64) and Generator.integers(low, high, size, int64).
#pragma once

#include <cstdint>
#include <vector>

namespace deepinfer::dsv41 {

// numpy.random.default_rng(seed).integers(low, high, size=count, dtype=np.int64), for 0 <= seed < 2^32.
std::vector<int64_t> numpy_default_rng_integers(uint32_t seed, int64_t low, int64_t high, int count);

}  // namespace deepinfer::dsv41
