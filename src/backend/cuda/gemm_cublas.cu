// Matrix products on cuBLAS for many activation rows: out [T, N] f32 (or bf16) = x [T, K] f32 . W^T, W rows
// w_row0 .. w_row0 + N of a weight in any stored format. cuBLAS takes no FP8 block or FP4 group scales in the
// layout of the checkpoints, so each call
//  - rounds x to bf16 once into a scratch [T, Kp] (Kp = K rounded up to 8: 16-byte aligned rows), unless the caller
//    hands it over in bf16 already (run_bf16);
//  - dequantizes the weight rows into a bf16 scratch [Nc, Kp], Nc rows at a time so that the scratch stays
//    within kCublasScratchBytes (BF16 weights are used in place);
//  - runs one bf16 x bf16 cublasGemmEx per chunk with fp32 accumulation, straight into out at ldc (fp32, or rounded
//    to bf16 by cuBLAS's epilogue: run_bf16's out_bf16).
// The numerics are the tensor-core kernel's (gemm_tc.cu): FP8 e4m3 and FP4 e2m1 times a power-of-two E8M0
// scale are exact in bf16; f32 scales, f16 and f32 weights round to nearest even.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <string>

#include "backend/cuda/cublas_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/weight_chunks.cuh"

namespace deepinfer::cuda {

namespace {

// cuBLAS's recommended workspace on Hopper; set explicitly so that it is stream-ordered with our stream
// rather than taken from cuBLAS's own pool.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;
// Weight rows per dequantized chunk are a multiple of this (keeps out + c0 and the scratch tile-aligned).
constexpr int64_t kChunkAlign = 256;

enum Kind { kF32, kBF16, kF16, kFP8, kFP4, kAny };

using mma::pack_bf16;

// dst [n, ld] bf16 = W rows row0 .. row0 + n - 1, 16 consecutive weights of one row per thread (one 16-byte
// load of FP8, 8 bytes of FP4, 32 of f16, 64 of f32; two 16-byte stores). n * k / 16 < 2^31: the scratch
// budget bounds it (see launch_dequantize_bf16).
template <int KIND>
__global__ void dequantize_kernel(__nv_bfloat16* __restrict__ dst, int64_t ld, WeightDesc w, int64_t row0, int n,
                                  int per_row) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * per_row) return;
    // 32-bit index arithmetic (rows and K < 2^31, checked at launch): 64-bit divisions cost more than the loads.
    const int r = i / per_row, k = (i % per_row) * 16;
    const int64_t row = row0 + r;
    uint32_t o[8];
    if constexpr (KIND == kF32) {
        const float4* p = reinterpret_cast<const float4*>(reinterpret_cast<const float*>(w.data) + row * w.cols + k);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float4 f = __ldg(p + j);
            o[2 * j] = pack_bf16(f.x, f.y);
            o[2 * j + 1] = pack_bf16(f.z, f.w);
        }
    } else if constexpr (KIND == kF16) {
        const uint4* p = reinterpret_cast<const uint4*>(reinterpret_cast<const uint16_t*>(w.data) + row * w.cols + k);
        const uint4 a = __ldg(p), b = __ldg(p + 1);
        const uint32_t h[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const float2 f = chunks::half2_bits_to_float2(h[j]);
            o[j] = pack_bf16(f.x, f.y);
        }
    } else if constexpr (KIND == kFP8) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(w.data + row * w.cols + k));
        const int64_t si = static_cast<int64_t>(static_cast<int>(row) / w.block_rows) * w.scale_cols + k / w.block_cols;
        const float s =
            w.scale_f32 ? __ldg(reinterpret_cast<const float*>(w.scale) + si) : e8m0_to_f32(__ldg(w.scale + si));
        const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {  // 4 bytes: weights 4j .. 4j + 3, low byte first
            const float2 a = chunks::e4m3x2_to_float2(words[j]), b = chunks::e4m3x2_to_float2(words[j] >> 16);
            o[2 * j] = pack_bf16(a.x * s, a.y * s);
            o[2 * j + 1] = pack_bf16(b.x * s, b.y * s);
        }
    } else if constexpr (KIND == kFP4) {
        const uint2 v = __ldg(reinterpret_cast<const uint2*>(w.data + row * (w.cols / 2) + k / 2));
        const float s = e8m0_to_f32(__ldg(w.scale + row * w.scale_cols + k / w.block_cols));
#pragma unroll
        for (int j = 0; j < 8; ++j) {  // byte j: weight 2j in the low nibble, 2j + 1 in the high one
            const uint32_t byte = ((j < 4 ? v.x : v.y) >> (8 * (j % 4))) & 0xffu;
            o[j] = pack_bf16(fp4e2m1_to_f32(byte & 0xf) * s, fp4e2m1_to_f32(byte >> 4) * s);
        }
    }
    uint4* out = reinterpret_cast<uint4*>(dst + static_cast<int64_t>(r) * ld + k);
    out[0] = make_uint4(o[0], o[1], o[2], o[3]);
    out[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

// Any layout (K not a multiple of 16, unaligned data, scale blocks not multiples of 16): one weight per thread.
__global__ void dequantize_any_kernel(__nv_bfloat16* __restrict__ dst, int64_t ld, WeightDesc w, int64_t row0,
                                      int64_t n) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n * w.cols) return;
    const int64_t r = i / w.cols, k = i % w.cols;
    dst[r * ld + k] = __float2bfloat16_rn(weight_at(w, row0 + r, k));
}

int kind_of(const WeightDesc& w) {
    // The vector loads read 16 weights of one row at once, inside one scale block, from aligned addresses.
    const bool whole = w.cols % 16 == 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0;
    if (w.format == 0) return !whole ? kAny : w.dtype == 0 ? kF32 : w.dtype == 1 ? kBF16 : kF16;
    if (!whole || w.block_cols % 16 != 0) return kAny;
    return w.format == 1 ? kFP8 : kFP4;
}

template <int KIND>
void launch_vec(__nv_bfloat16* dst, int64_t ld, const WeightDesc& w, int64_t row0, int64_t n, cudaStream_t stream) {
    const int64_t per_row = w.cols / 16, total = n * per_row;
    DI_ICHECK(total < INT_MAX && w.rows < INT_MAX, "dequantize: ", n, " x ", w.cols, " weights in one call");
    DI_ICHECK(ld % 8 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0, "dequantize: 16-byte stores need ld % 8 == 0");
    dequantize_kernel<KIND><<<static_cast<unsigned>((total + 255) / 256), 256, 0, stream>>>(
        dst, ld, w, row0, static_cast<int>(n), static_cast<int>(per_row));
}

}  // namespace

void launch_dequantize_bf16(uint16_t* dst_bits, int64_t ld, const WeightDesc& w, int64_t row0, int64_t n,
                            cudaStream_t stream) {
    if (n == 0 || w.cols == 0) return;
    __nv_bfloat16* dst = reinterpret_cast<__nv_bfloat16*>(dst_bits);
    switch (kind_of(w)) {
        case kF32:
            launch_vec<kF32>(dst, ld, w, row0, n, stream);
            break;
        case kF16:
            launch_vec<kF16>(dst, ld, w, row0, n, stream);
            break;
        case kFP8:
            launch_vec<kFP8>(dst, ld, w, row0, n, stream);
            break;
        case kFP4:
            launch_vec<kFP4>(dst, ld, w, row0, n, stream);
            break;
        default:  // kAny, and BF16 when asked for a copy (CublasGemm::run reads BF16 in place)
            dequantize_any_kernel<<<static_cast<unsigned>((n * w.cols + 255) / 256), 256, 0, stream>>>(dst, ld, w, row0,
                                                                                                       n);
    }
    DI_CUDA_LAUNCH_CHECK();
}

CublasGemm::CublasGemm(cudaStream_t stream) : stream_(stream) {
    DI_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
    cublasHandle_t h = nullptr;
    try {
        DI_CUBLAS_CHECK(cublasCreate(&h));
        // cublasSetStream resets the workspace to cuBLAS's default pool, so the workspace is set after it.
        DI_CUBLAS_CHECK(cublasSetStream(h, stream_));
        DI_CUBLAS_CHECK(cublasSetWorkspace(h, workspace_, kWorkspaceBytes));
    } catch (...) {  // the destructor does not run for a throwing constructor
        if (h) cublasDestroy(h);
        cudaFree(workspace_);
        throw;
    }
    handle_ = h;
}

CublasGemm::~CublasGemm() {
    // Work queued on the stream may still use the workspace.
    cudaStreamSynchronize(stream_);
    if (handle_) cublasDestroy(static_cast<cublasHandle_t>(handle_));
    if (workspace_) cudaFree(workspace_);
}

namespace {
// cublasGemmEx takes int sizes and leading dimensions.
void check_gemm_sizes(int64_t rows, int64_t k, int64_t ldc, int64_t ldb) {
    const int64_t kp = (k + 7) / 8 * 8;
    DI_ICHECK(rows <= INT_MAX && kp <= INT_MAX && ldc <= INT_MAX && ldb <= INT_MAX && k > 0, "cuBLAS GEMM: ", rows,
              " rows, K ", k, ", ldc ", ldc, ", ldb ", ldb, " exceed int");
}
}  // namespace

void CublasGemm::run(float* out, int64_t ldc, const float* x, int64_t lda, int64_t rows, const WeightDesc& w,
                     int64_t w_row0, int64_t n_out) {
    if (rows == 0 || n_out == 0) return;
    const int64_t kp = (w.cols + 7) / 8 * 8;
    check_gemm_sizes(rows, w.cols, ldc, kp);  // before the scratch is taken
    uint16_t* xb = nullptr;  // [rows, kp] bf16
    DI_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&xb), rows * kp * 2, stream_));
    launch_to_bf16(xb, kp, x, lda, rows, w.cols, stream_);
    run_bf16(out, ldc, xb, kp, rows, w, w_row0, n_out);
    DI_CUDA_CHECK(cudaFreeAsync(xb, stream_));  // stream-ordered: reused only after the GEMMs queued above
}

void CublasGemm::run_bf16(void* out, int64_t ldc, const uint16_t* x_bits, int64_t ldb, int64_t rows,
                          const WeightDesc& w, int64_t w_row0, int64_t n_out, bool out_bf16) {
    if (rows == 0 || n_out == 0) return;
    const int64_t k = w.cols, kp = (k + 7) / 8 * 8;
    check_gemm_sizes(rows, k, ldc, ldb);
    DI_ICHECK(ldb >= k && ldb % 8 == 0 && reinterpret_cast<uintptr_t>(x_bits) % 16 == 0,
              "cuBLAS GEMM: bf16 activations need 16-byte aligned rows of at least K (", k, "), ldb ", ldb);
    const __nv_bfloat16* xb = reinterpret_cast<const __nv_bfloat16*>(x_bits);

    // BF16 weights are read in place (rows w_row0.., row stride K); others are dequantized chunk by chunk into
    // [chunk, kp] bf16, chunk a multiple of kChunkAlign rows of at most kCublasScratchBytes (at least
    // kChunkAlign rows, more than the budget only for K > 512K).
    const bool in_place = w.format == 0 && w.dtype == 1;
    int64_t chunk = n_out;
    __nv_bfloat16* wb = nullptr;
    if (!in_place) {
        const int64_t budget_rows = std::max<int64_t>(kCublasScratchBytes / (kp * 2) / kChunkAlign, 1) * kChunkAlign;
        chunk = std::min(n_out, budget_rows);
        DI_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&wb), chunk * kp * 2, stream_));
    }
    const float one = 1.0f, zero = 0.0f;
    for (int64_t c0 = 0; c0 < n_out; c0 += chunk) {
        const int64_t nc = std::min(chunk, n_out - c0);
        const __nv_bfloat16* a = wb;
        int64_t ld_a = kp;
        if (in_place) {
            a = reinterpret_cast<const __nv_bfloat16*>(w.data) + (w_row0 + c0) * k;
            ld_a = k;
        } else {
            launch_dequantize_bf16(reinterpret_cast<uint16_t*>(wb), kp, w, w_row0 + c0, nc, stream_);
        }
        // Column-major view: out^T [nc, rows] (ld ldc) = A^T . xb^T, A [nc, K] row-major = [K, nc] column-major.
        DI_CUBLAS_CHECK(cublasGemmEx(
            static_cast<cublasHandle_t>(handle_), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(nc),
            static_cast<int>(rows), static_cast<int>(k), &one, a, CUDA_R_16BF, static_cast<int>(ld_a), xb, CUDA_R_16BF,
            static_cast<int>(ldb), &zero, static_cast<uint8_t*>(out) + c0 * (out_bf16 ? 2 : 4),
            out_bf16 ? CUDA_R_16BF : CUDA_R_32F, static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    // Stream-ordered free: the memory is reused only after the GEMMs queued above.
    if (wb) DI_CUDA_CHECK(cudaFreeAsync(wb, stream_));
}

}  // namespace deepinfer::cuda
