// Device side of tma.h: a 2D bulk tensor copy into shared memory completing on an mbarrier, and the barrier's
// expected-bytes count for it.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "backend/cuda/tma.h"

namespace deepinfer::cuda::tma {

// TileWidthMaps' index of a tile width (128, 64, 32 or 16).
__host__ __device__ constexpr int tile_width_map(int width) {
    return width == 128 ? 0 : width == 64 ? 1 : width == 32 ? 2 : 3;
}
static_assert(tile_width_map(kTmaTileWidths[0]) == 0 && tile_width_map(kTmaTileWidths[1]) == 1 &&
                  tile_width_map(kTmaTileWidths[2]) == 2 && tile_width_map(kTmaTileWidths[3]) == 3,
              "the maps' order");

// The barrier's current phase also waits for `bytes` more bytes of asynchronous copies (no arrival).
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// The box at element (x, y) of the map (x: the innermost dimension) into shared memory at dst, its bytes counted on
// bar. map: a __grid_constant__ kernel parameter (or global or constant memory).
__device__ __forceinline__ void load_2d(uint32_t dst, const CUtensorMap* map, int x, int y, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
        "[%4];\n" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
        : "memory");
}

}  // namespace deepinfer::cuda::tma
