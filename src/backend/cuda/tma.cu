#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/tma.h"
#include "deepinfer/error.h"

namespace deepinfer::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
    static std::once_flag once;
    std::call_once(once, [] {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult found{};
        DI_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found));
        DI_CHECK(found == cudaDriverEntryPointSuccess && p, "CUDA: the driver has no cuTensorMapEncodeTiled");
        fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    });
    return fn;
}

}  // namespace

CUtensorMap tma_rows_swizzle128(const void* base, uint64_t rows, uint64_t row_bytes, uint32_t box_rows,
                                uint32_t box_bytes) {
    DI_ICHECK(reinterpret_cast<uintptr_t>(base) % 16 == 0 && row_bytes % 16 == 0 && box_bytes <= 128 &&
                  box_bytes % 16 == 0 && box_rows >= 1 && box_rows <= 256 && rows >= 1,
              "tma_rows_swizzle128: rows ", rows, " x ", row_bytes, " bytes, box ", box_rows, " x ", box_bytes);
    CUtensorMap map;
    const cuuint64_t dims[2] = {row_bytes, rows};
    const cuuint64_t strides[1] = {row_bytes};  // bytes between rows (the innermost dimension's stride is implied)
    const cuuint32_t box[2] = {box_bytes, box_rows};
    const cuuint32_t element_strides[2] = {1, 1};
    const CUresult r = encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides,
                                      box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    DI_CHECK(r == CUDA_SUCCESS, "CUDA: cuTensorMapEncodeTiled failed (", static_cast<int>(r), ") for rows ", rows,
             " x ", row_bytes, " bytes, box ", box_rows, " x ", box_bytes);
    return map;
}

TileWidthMaps tma_tile_width_maps(const void* base, uint64_t rows, uint64_t row_bytes, uint32_t box_bytes) {
    TileWidthMaps m;
    for (int i = 0; i < 4; ++i)
        m.map[i] = tma_rows_swizzle128(base, rows, row_bytes, static_cast<uint32_t>(kTmaTileWidths[i]), box_bytes);
    return m;
}

bool tma_switch_on(const char* env_var) {
    const char* v = std::getenv(env_var);
    return !(v && std::strcmp(v, "0") == 0);
}

}  // namespace deepinfer::cuda
