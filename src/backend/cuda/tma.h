// Tensor memory accelerator (TMA) descriptors for Hopper's bulk tensor copies (cp.async.bulk.tensor): built on the host
// per call (cuTensorMapEncodeTiled, reached through the runtime's driver entry point, so nothing links libcuda),
// passed to a kernel as __grid_constant__ parameters, and used with the device helpers of tma.cuh.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace deepinfer::cuda {

// A row-major matrix of bytes [rows, row_bytes] at base (16-byte aligned, row_bytes a multiple of 16), copied in boxes
// of box_rows x box_bytes (box_bytes <= 128) laid out in shared memory under the 128-byte swizzle that wgmma's
// K-major operands use (8-row x 128-byte atoms: row r's 16-byte chunk c at r * 128 + ((c ^ (r % 8)) << 4), the box
// 1024-byte aligned). Rows past `rows` arrive as zeros and count as copied bytes.
CUtensorMap tma_rows_swizzle128(const void* base, uint64_t rows, uint64_t row_bytes, uint32_t box_rows,
                                uint32_t box_bytes);

// The wgmma tile widths (token rows) a kernel's B copies come in, and one map for each over the same matrix
// (tma_rows_swizzle128, boxes of kTmaTileWidths[i] rows x box_bytes); tma.cuh's tile_width_map picks the one for a
// tile.
inline constexpr int kTmaTileWidths[4] = {128, 64, 32, 16};
struct TileWidthMaps {
    CUtensorMap map[4];
};
TileWidthMaps tma_tile_width_maps(const void* base, uint64_t rows, uint64_t row_bytes, uint32_t box_bytes);

// Whether bulk tensor copies an environment variable governs are on: every value but "0" (read at each call, so that
// tests and benchmarks switch them).
bool tma_switch_on(const char* env_var);

}  // namespace deepinfer::cuda
