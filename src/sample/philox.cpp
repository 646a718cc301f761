#include "sample/philox.h"

#include "sample/philox_core.h"

namespace deepinfer {

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key) {
    philox_core::philox4x32_10(counter.data(), key[0], key[1]);
    return counter;
}

float philox_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    return philox_core::uniform24(seed, stream, index);
}

}  // namespace deepinfer
