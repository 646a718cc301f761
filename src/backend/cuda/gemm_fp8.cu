// FP8 products on cuBLASLt (see gemm_fp8.h). In cuBLASLt's column-major terms a product is D [n, T] = op(A) . B
// with A the weight rows [n, K] row-major (a K x n column-major matrix taken transposed: CUBLASLT_MATMUL_DESC_TRANSA
// = T, the only FP8 form on Hopper), B the activations [T, K] row-major (K x T column-major) and D the output [T, n]
// row-major (n x T column-major, leading dimension ldc). The scale modes: A BLK128x128_32F, [n / 128, K / 128] f32 in
// the checkpoint's row-major order; B VEC128_32F, [K / 128, T] f32 (the rows' scales of one 128-column block
// together, each block's 16-byte aligned: T a multiple of 4, or cuBLASLt offers no algorithm). Both were checked on
// an H200: the weights' grid against an exact sum (bench/gemm/fp8_gemm_probe: 2-4e-4 of a row's largest output, the
// transposed grid errors of order 1), the activations' by the CUDA op test, whose blocks' scales differ.
#include <cublasLt.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <climits>
#include <map>
#include <string>
#include <tuple>
#include <utility>

#include "backend/cuda/cublas_check.h"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gemm_fp8.h"
#include "backend/cuda/quant_math.cuh"
#include "core/log.h"
#include "deepinfer/error.h"

namespace deepinfer::cuda {

namespace {

// As CublasGemm's: the workspace is ours (stream-ordered), its size fixed so that the algorithm does not depend on
// the lane.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr int64_t kBlock = 128;

// One warp per (row, 128-column block): fp8_quantize_quad's codes and scale.
__global__ void quantize_fp8_rows_kernel(const float* __restrict__ x, uint32_t* __restrict__ xq, float* __restrict__ sx,
                                         int64_t rows, int64_t cols) {
    const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x % 32;
    const int64_t blocks_per_row = cols / kBlock;
    if (warp >= rows * blocks_per_row) return;
    const int64_t r = warp / blocks_per_row, b = warp % blocks_per_row;
    const Fp8Quad q = fp8_quantize_quad(x + r * cols + b * kBlock + 4 * lane);
    xq[(r * cols + b * kBlock) / 4 + lane] = q.codes;
    if (lane == 0) sx[b * rows + r] = q.scale;  // [cols / 128, rows]: each group's [its blocks, rows] in turn
}

// The weight's E8M0 block scales as the f32 scales cuBLASLt takes: 2^(e - 127), NaN for 255.
__global__ void e8m0_scales_kernel(float* __restrict__ dst, const uint8_t* __restrict__ e, int64_t n) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = e8m0_to_f32(e[i]);
}

// The descriptors of one call and its scale scratch, released with it (also when a step throws).
struct LtCall {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    float* scratch = nullptr;
    cudaStream_t stream = nullptr;  // the scratch's
    LtCall() = default;
    LtCall(const LtCall&) = delete;
    LtCall& operator=(const LtCall&) = delete;
    ~LtCall() {
        for (cublasLtMatrixLayout_t l : {a, b, d})
            if (l) cublasLtMatrixLayoutDestroy(l);
        if (desc) cublasLtMatmulDescDestroy(desc);
        if (scratch) cudaFreeAsync(scratch, stream);
    }
    void set(cublasLtMatmulDescAttributes_t attr, const void* value, size_t bytes) {
        DI_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, value, bytes));
    }
};

}  // namespace

// K a multiple of 512 (whole groups of 4 scale blocks): with K = 128 cuBLASLt 13.1 returned wrong products for most
// rows (N 512, 512 and 3812 rows), and with K = 256 for one of the shapes tried (N 128), though it offered an
// algorithm (CUDA op test, H200); every product tried with K of 512 or more matched. V4-Flash's K are 1024 to 8192.
bool fp8_gemm_applies(const WeightDesc& w) {
    return w.format == 1 && w.block_rows == kBlock && w.block_cols == kBlock && w.rows % kBlock == 0 &&
           w.cols % (4 * kBlock) == 0 && w.scale_cols == w.cols / kBlock && aligned16(w.data) && w.rows <= INT_MAX &&
           w.cols <= INT_MAX;
}

void launch_quantize_fp8_rows(const float* x, uint8_t* xq, float* sx, int64_t rows, int64_t cols, cudaStream_t stream) {
    DI_ICHECK(cols % kBlock == 0 && aligned16(x) && aligned16(xq), "quantize_fp8_rows: ", cols, " columns");
    const int64_t threads = rows * (cols / kBlock) * 32;
    if (threads == 0) return;
    quantize_fp8_rows_kernel<<<static_cast<unsigned>((threads + 255) / 256), 256, 0, stream>>>(
        x, reinterpret_cast<uint32_t*>(xq), sx, rows, cols);
    DI_CUDA_LAUNCH_CHECK();
}

namespace {

// An operand's alignment as cuBLASLt's preferences count it: the largest power of two up to 256 dividing the address.
uint32_t alignment_of(const void* p) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    return a == 0 ? 256u : static_cast<uint32_t>(std::min<uintptr_t>(a & (~a + 1), 256));
}

}  // namespace

struct Fp8Gemm::Impl {
    cudaStream_t stream = nullptr;
    cublasLtHandle_t handle = nullptr;
    void* workspace = nullptr;
    // cuBLASLt's choice per product shape (n, K, rows, ldx, ldc) and operand alignments (weight codes, activation
    // codes, output), asked once: the heuristic query costs more host time than setting up a call. found = false:
    // no algorithm.
    using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, uint32_t, uint32_t, uint32_t>;
    struct Choice {
        bool found;
        cublasLtMatmulAlgo_t algo;
    };
    std::map<Key, Choice> choices;

    // A product's key: its shape and its operands' alignments.
    static Key key_of(const float* out, int64_t ldc, const uint8_t* xq, int64_t ldx, int64_t rows, const uint8_t* a,
                      int64_t k, int64_t n_out) {
        return Key{n_out, k, rows, ldx, ldc, alignment_of(a), alignment_of(xq), alignment_of(out)};
    }

    // The call's descriptors. The scale pointers are the call's (sw, sx): cuBLASLt offers no algorithm to a
    // block-scaled product without them.
    static void describe(LtCall& call, int64_t ldc, int64_t ldx, const float* sx, int64_t rows, const float* sw,
                         int64_t k, int64_t n_out) {
        const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        const int32_t mode_a = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F,
                      mode_b = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
        DI_CUBLAS_CHECK(cublasLtMatmulDescCreate(&call.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        call.set(CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
        call.set(CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
        call.set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode_a, sizeof mode_a);
        call.set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode_b, sizeof mode_b);
        call.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sw, sizeof sw);
        call.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sx, sizeof sx);
        DI_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&call.a, CUDA_R_8F_E4M3, k, n_out, k));
        DI_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&call.b, CUDA_R_8F_E4M3, k, rows, ldx));
        DI_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&call.d, CUDA_R_32F, n_out, rows, ldc));
    }

    // cuBLASLt's choice for the product `key`, whose descriptors `call` holds: the cached one, else asked now.
    const Choice& choose(const Key& key, const LtCall& call) {
        auto it = choices.find(key);
        if (it != choices.end()) return it->second;
        const int64_t n_out = std::get<0>(key), k = std::get<1>(key), rows = std::get<2>(key);
        const uint32_t align[3] = {std::get<5>(key), std::get<6>(key), std::get<7>(key)};
        cublasLtMatmulPreference_t pref = nullptr;
        DI_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        size_t bytes = kWorkspaceBytes;
        cublasLtMatmulHeuristicResult_t heur = {};
        int count = 0;
        cublasStatus_t st =
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof bytes);
        const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align[0]},
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align[1]},
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align[2]},
            {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align[2]}};
        for (const auto& [attr, value] : aligns)
            if (st == CUBLAS_STATUS_SUCCESS)
                st = cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof value);
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatmulAlgoGetHeuristic(handle, call.desc, call.a, call.b, call.d, call.d, pref, 1, &heur,
                                                &count);
        cublasLtMatmulPreferenceDestroy(pref);
        const bool found = st == CUBLAS_STATUS_SUCCESS && count > 0;
        if (!found)  // once per shape: a slower path is worth knowing about
            DI_LOG(kWarn, "cuBLASLt offers no FP8 block-scaled GEMM for [", rows, ", ", k, "] x [", n_out, ", ", k,
                   "]^T (", cublasGetStatusString(st), ", ", count,
                   " algorithms): those products take the bf16 path from the quantized activations");
        return choices.emplace(key, Choice{found, heur.algo}).first->second;
    }
};

Fp8Gemm::Fp8Gemm(cudaStream_t stream) : impl_(std::make_unique<Impl>()) {
    impl_->stream = stream;
    DI_CUDA_CHECK(cudaMalloc(&impl_->workspace, kWorkspaceBytes));
    const cublasStatus_t st = cublasLtCreate(&impl_->handle);
    if (st != CUBLAS_STATUS_SUCCESS) {  // the destructor does not run for a throwing constructor
        cudaFree(impl_->workspace);
        DI_CUBLAS_CHECK(st);
    }
}

Fp8Gemm::~Fp8Gemm() {
    // Work queued on the stream may still use the workspace.
    cudaStreamSynchronize(impl_->stream);
    cublasLtDestroy(impl_->handle);
    cudaFree(impl_->workspace);
}

namespace {

void check_product(const WeightDesc& w, int64_t w_row0, int64_t n_out, int64_t rows, int64_t ldx, int64_t ldc,
                   const uint8_t* xq) {
    DI_ICHECK(fp8_gemm_applies(w) && w_row0 % kBlock == 0 && n_out % kBlock == 0 && w_row0 + n_out <= w.rows &&
                  rows <= INT_MAX && ldx <= INT_MAX && ldc <= INT_MAX && aligned16(xq),
              "fp8 GEMM: weight [", w.rows, ", ", w.cols, "] rows ", w_row0, " + ", n_out);
}

}  // namespace

bool Fp8Gemm::supports(const float* out, int64_t ldc, const uint8_t* xq, int64_t ldx, int64_t rows, const WeightDesc& w,
                       int64_t w_row0, int64_t n_out) {
    check_product(w, w_row0, n_out, rows, ldx, ldc, xq);
    const Impl::Key key = Impl::key_of(out, ldc, xq, ldx, rows, w.data + w_row0 * w.cols, w.cols, n_out);
    if (const auto it = impl_->choices.find(key); it != impl_->choices.end()) return it->second.found;
    LtCall call;
    // The scale pointers stand in for the call's (any valid address: the query reads nothing).
    const float* scales = reinterpret_cast<const float*>(impl_->workspace);
    Impl::describe(call, ldc, ldx, scales, rows, scales, w.cols, n_out);
    return impl_->choose(key, call).found;
}

void Fp8Gemm::run(float* out, int64_t ldc, const uint8_t* xq, int64_t ldx, const float* sx, int64_t rows,
                  const WeightDesc& w, int64_t w_row0, int64_t n_out) {
    if (rows == 0 || n_out == 0) return;
    check_product(w, w_row0, n_out, rows, ldx, ldc, xq);
    Impl& m = *impl_;
    const int64_t k = w.cols, kb = k / kBlock;
    const uint8_t* a = w.data + w_row0 * k;
    LtCall call;
    // Weight scales [n_out / 128, kb] f32: the checkpoint's where they are f32, else converted into a scratch that is
    // freed stream-ordered after the GEMM (its memory is reused only after it).
    const float* sw = reinterpret_cast<const float*>(w.scale) + (w_row0 / kBlock) * kb;
    if (!w.scale_f32) {
        const int64_t n_scales = n_out / kBlock * kb;
        DI_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&call.scratch), n_scales * 4, m.stream));
        call.stream = m.stream;
        e8m0_scales_kernel<<<static_cast<unsigned>((n_scales + 255) / 256), 256, 0, m.stream>>>(
            call.scratch, w.scale + (w_row0 / kBlock) * kb, n_scales);
        DI_CUDA_LAUNCH_CHECK();
        sw = call.scratch;
    }
    Impl::describe(call, ldc, ldx, sx, rows, sw, k, n_out);
    const Impl::Choice& choice = m.choose(Impl::key_of(out, ldc, xq, ldx, rows, a, k, n_out), call);
    DI_ICHECK(choice.found, "fp8 GEMM: cuBLASLt has no algorithm for [", rows, ", ", k, "] x [", n_out, ", ", k,
              "]^T (supports() says so first)");
    const float alpha = 1.0f, beta = 0.0f;
    DI_CUBLAS_CHECK(cublasLtMatmul(m.handle, call.desc, &alpha, a, call.a, xq, call.b, &beta, out, call.d, out, call.d,
                                   &choice.algo, m.workspace, kWorkspaceBytes, m.stream));
}

}  // namespace deepinfer::cuda
