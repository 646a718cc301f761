// The routed experts on Hopper wgmma (experts_wgmma.cu). Prefill: x [R, D] f32, rows sorted into runs by expert, in
// place x_run = W2_e . swiglu(W1_e . x_run, W3_e . x_run), FP4 weights decoded straight into the tensor cores'
// A fragments. Numerics of the backend's tensor-core products: x rounded to bf16 once, weights exact in bf16,
// fp32 accumulation, SwiGLU in fp32, h rounded to bf16 for the down product, the output written as f32.
//
// Plain C++ header (no CUDA headers): cudaStream_t is `CUstream_st*`, WeightDesc is cuda_common.cuh's.
#pragma once

#include <cstdint>
#include <vector>

#include "core/weight.h"

struct CUstream_st;

namespace deepinfer::cuda {

struct WeightDesc;

// True when the fused kernels take these experts on the current device: a compute capability 9.0 GPU, all FP4
// with 32-wide E8M0 groups, w1 and w3 [I, D], w2 [D, I] with D a multiple of 256 and I of 128, data 16-byte and
// scales 4-byte aligned.
// A tile of the prefill expert kernels (experts_wgmma.cu, experts_fp8.cu): `rows` rows (1 .. the kernel's tile height)
// of expert `expert`'s run from sorted row row0, weight features feature0 .. of the product's tile width.
struct ExpertTile {
    int expert, feature0, row0, rows;
};
struct ExpertTilesHeader {
    int64_t tiles1, tiles2;  // gate/up and down tiles
};
// Both kernels' tile lists, as they are copied to the device: [ExpertTilesHeader] [gate/up tiles] [down tiles], each
// run (run_starts [num_experts + 1]) cut into tiles of max_rows rows and the features into gate_up_features of inter
// and down_features of d; expert-major, then feature tile, then token tile, so that the CTAs running at once share one
// expert's weights and its activations through L2. `who` names the caller in errors.
std::vector<uint8_t> expert_tile_plan(const int64_t* run_starts, int num_experts, int64_t d, int64_t inter,
                                      int gate_up_features, int down_features, int max_rows, const char* who);

// Whether w is an FP4 expert matrix [rows, cols] as the expert kernels read it: e2m1 with an E8M0 scale per 32 columns,
// the codes 16-byte and the scales 4-byte aligned.
bool fp4_expert_ok(const WeightDesc& w, int64_t rows, int64_t cols);
// Whether both expert kernels' common conditions hold: a compute capability 9.0 device, num_experts > 0 experts whose
// w1 and w3 [I, D] and w2 [D, I] are fp4_expert_ok, I a multiple of inter_multiple and D of d_multiple, both <= 2^20.
bool fp4_expert_lists_ok(const WeightDesc* w1, const WeightDesc* w3, const WeightDesc* w2, int num_experts,
                         int64_t inter_multiple, int64_t d_multiple);
bool grouped_experts_wgmma_applies(const WeightDesc* w1, const WeightDesc* w3, const WeightDesc* w2, int num_experts);

// The kernels' plan for runs starting at run_starts [num_experts + 1] (host, run_starts[0] = 0): tile lists and
// the experts' weight pointers, as bytes for the caller to copy to the device (w1, w3, w2: host arrays of
// descriptors of device weights that satisfy grouped_experts_wgmma_applies).
std::vector<uint8_t> grouped_experts_wgmma_plan(const int64_t* run_starts, int num_experts, const WeightDesc* w1,
                                                const WeightDesc* w3, const WeightDesc* w2, int64_t d, int64_t inter);
// x [rows, D] f32 (device, rows = run_starts[num_experts]) in place, with `plan` and its device copy
// `device_plan` (16-byte aligned, alive until the launches are done). Scratch (rows x (D + I) bf16) is
// stream-ordered on `stream`. in_rows / out_rows (device [rows] arrays of row addresses, or null): read row r
// from in_rows[r] and write it to out_rows[r] instead of x (x may then be null).
void launch_grouped_experts_wgmma(float* x, int64_t rows, const std::vector<uint8_t>& plan, const void* device_plan,
                                  int64_t d, int64_t inter, float swiglu_limit, CUstream_st* stream,
                                  const float* const* in_rows = nullptr, float* const* out_rows = nullptr);

// The routed experts (Backend::routed_experts) on the same kernels, planned on the device: out [rows, D] f32
// row r = w2[e] . swiglu(w1[e] . x_t, w3[e] . x_t, swiglu_limit) with e = expert_of_row[r] (device [rows] I32) and
// t = r / rows_per_input, x [rows / rows_per_input, D] f32; a row whose id is outside [0, num_experts) is NaN (as
// expert_linear leaves it). One launch sorts the slots by expert and writes the tile lists and their counts to
// device memory, so nothing waits for the host. device_table: routed_experts_wgmma_table's bytes in device memory
// (16-byte aligned). Scratch (rows x (D + I) bf16 and the plan) is stream-ordered on `stream`. Up to
// kRoutedDecodeMaxSlots slots run on decode's rings (tiles of up to 32 rows); more on prefill's (128), the tiles and
// kernels of launch_grouped_experts_wgmma over the slots sorted stably by expert, so bitwise its results.
constexpr int kRoutedWgmmaMaxExperts = 1024;  // the plan kernel's shared memory
constexpr int64_t kRoutedDecodeMaxSlots = 2048;
// Fewest tokens (slots / top-k) for which the backend takes these kernels over expert_linear: at one token the
// fp32 kernel is faster (H200, D 4096, I 2048, top-6 of 256: 58 vs 79 us for the routed FFN; 8-layer V4-Flash
// decode 2.69 vs 2.84 ms a step), from 8 tokens these are (decode steps 4.89 vs 5.76 ms at batch 8, 8.95 vs
// 10.50 at 32).
constexpr int64_t kRoutedWgmmaMinTokens = 2;
// The experts' weight pointers as the kernels index them, to be copied to the device once per expert list (w1, w3,
// w2: host arrays of descriptors that satisfy grouped_experts_wgmma_applies, at most kRoutedWgmmaMaxExperts).
std::vector<uint8_t> routed_experts_wgmma_table(const WeightDesc* w1, const WeightDesc* w3, const WeightDesc* w2,
                                                int num_experts);
// quantize_h (FP8 activations with blocks of 128; x already quantized by the caller): the SwiGLU output is quantized
// as fake_quantize's kFp8Ue8m0 before the down product (gate/up writes it in f32, quantize_h_kernel rounds it); this
// takes the default decode variant (DecodeRing) whatever DEEPINFER_CUDA_EXPERTS_DECODE_WGS / _BATCH say.
// fp8_table (non-null: experts_fp8_table's bytes in device memory, for the same experts): decode-sized calls without
// quantize_h run their products on the FP8 tensor cores with exact activations (launch_experts_fp8_decode); the
// experts must satisfy experts_fp8_decode_applies.
void launch_routed_experts_wgmma(float* out, const float* x, const int32_t* expert_of_row, int64_t rows,
                                 int rows_per_input, const void* device_table, int num_experts, int64_t d,
                                 int64_t inter, float swiglu_limit, CUstream_st* stream, bool quantize_h = false,
                                 const void* fp8_table = nullptr);

// The routed experts of a few tokens (experts_few_tokens.cu): launch_routed_experts_wgmma's contract (the same device
// table and outputs, bad ids NaN rows), each slot its own work item on mma.sync; the backend takes them for calls of
// up to kRoutedFewTokensAuto tokens by default and up to kRoutedFewTokensMax with DEEPINFER_CUDA_FEW_TOKEN_EXPERTS=1
// (CudaBackend::few_token_experts), where the wgmma kernels' tiles leave much of the GPU idle. Applies where D and I
// are multiples of 128 up to 1024, or 2048 or 4096, and D a multiple of 16 (routed_experts_few_tokens_applies); x
// 16-byte aligned.
constexpr int64_t kRoutedFewTokensMax = 4;
constexpr int64_t kRoutedFewTokensAuto = 2;
bool routed_experts_few_tokens_applies(int64_t d, int64_t inter);
void launch_routed_experts_few_tokens(float* out, const float* x, const int32_t* expert_of_row, int64_t rows,
                                      int rows_per_input, const void* device_table, int num_experts, int64_t d,
                                      int64_t inter, float swiglu_limit, CUstream_st* stream);

// For callers without the CUDA headers (the GPU tests): the same over device LinearWeights, described as the
// backend describes them. The run waits for `stream` (nullptr: the legacy default stream) before returning.
bool grouped_experts_wgmma_applies(const std::vector<LinearWeight>& w1, const std::vector<LinearWeight>& w3,
                                   const std::vector<LinearWeight>& w2);
void run_grouped_experts_wgmma_sync(float* x, const std::vector<int64_t>& run_starts,
                                    const std::vector<LinearWeight>& w1, const std::vector<LinearWeight>& w3,
                                    const std::vector<LinearWeight>& w2, float swiglu_limit,
                                    CUstream_st* stream = nullptr);

}  // namespace deepinfer::cuda
