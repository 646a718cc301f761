// The routed experts on FP8 tensor cores: FP4 experts whose rows' scales span at most 14 binades, multiplied exactly as
// e4m3 against e4m3 activations. At prefill with FP8 activations (experts_fp8.cu: the activations' e4m3 codes); at
// decode by default (experts_fp8_decode.cu: each bf16-rounded activation row split exactly into two e4m3 rows).
#pragma once

#include <cstdint>
#include <vector>

#include "core/weight.h"

struct CUstream_st;

namespace deepinfer::cuda {

struct WeightDesc;  // cuda_common.cuh (kept out: this header is also a host compiler's)
struct ExpertTile;  // experts_wgmma.h

// One expert's weights as the kernels read them: W1, W3, W2's FP4 bytes, their E8M0 bytes, and each row's largest
// E8M0 byte (experts_fp8_prepare).
struct ExpertsFp8Ptrs {
    const uint8_t* data[3];
    const uint8_t* scale[3];
    const uint8_t* row_max[3];
};

// Whether the kernels take these experts: sm_90 device, FP4 with E8M0 per 32 and aligned, D and I multiples of 128.
bool experts_fp8_shapes_ok(const WeightDesc* w1, const WeightDesc* w3, const WeightDesc* w2, int num_experts);
// Bytes of row exponents experts_fp8_prepare writes: every row of w1, w3 and w2.
constexpr int64_t experts_fp8_row_bytes(int num_experts, int64_t d, int64_t inter) {
    return num_experts * (2 * inter + d);
}
// Writes each weight row's largest E8M0 byte to row_max (device memory, experts_fp8_row_bytes) and says whether every
// row's scales lie within the span the kernels multiply exactly. Synchronizes the stream.
bool experts_fp8_prepare(const WeightDesc* w1, const WeightDesc* w3, const WeightDesc* w2, int num_experts,
                         uint8_t* row_max, CUstream_st* stream);
// The device table the launch reads: [num_experts] ExpertsFp8Ptrs, row_max as experts_fp8_prepare filled it.
std::vector<uint8_t> experts_fp8_table(const WeightDesc* w1, const WeightDesc* w3, const WeightDesc* w2,
                                       int num_experts, const uint8_t* row_max);
// The tiles of one call (run_starts [num_experts + 1] on the host), to be copied to device memory as they are.
std::vector<uint8_t> experts_fp8_plan(const int64_t* run_starts, int num_experts, int64_t d, int64_t inter);
// Runs of rows sorted by expert: row r's input is x [rows, d] (or in_rows[r]), its output replaces it (or goes to
// out_rows[r]). Quantizes x and the SwiGLU output per 128 columns on the way, as fake_quantize's kFp8Ue8m0. h_out
// (non-null): the SwiGLU output [rows, inter] f32 goes there, before its quantization (tests check each product).
void launch_grouped_experts_fp8(float* x, int64_t rows, const std::vector<uint8_t>& plan, const void* device_plan,
                                const void* device_table, int64_t d, int64_t inter, float swiglu_limit,
                                CUstream_st* stream, const float* const* in_rows = nullptr,
                                float* const* out_rows = nullptr, float* h_out = nullptr);

// Decode's routed experts on the FP8 tensor cores with exact activations (experts_fp8_decode.cu): the products of
// launch_routed_experts_wgmma's decode path on its device plan, cut into tiles of up to kFp8DecodeTileTokens slots
// (128 gate/up and 256 down features a tile), for experts with an experts_fp8_table (their rows' scales within e4m3's
// exact span) that experts_fp8_decode_applies takes.
constexpr int kFp8DecodeTileTokens = 16;
// Whether the decode products take experts_fp8_shapes_ok's experts: D and I multiples of 512, every scale 16-byte
// aligned.
bool experts_fp8_decode_applies(const WeightDesc* w1, const WeightDesc* w3, const WeightDesc* w2, int num_experts);
struct Fp8DecodePlan {
    const float* const* in_rows;  // [rows] the slots' token rows, sorted by expert
    float* const* out_rows;       // [rows] their output rows
    const ExpertTile* tiles1;     // gate/up tiles, tile_count[0] of them (at most max_tiles1)
    const ExpertTile* tiles2;     // down tiles, tile_count[1] (at most max_tiles2)
    const int* tile_count;
    int64_t max_tiles1, max_tiles2;
};
void launch_experts_fp8_decode(const Fp8DecodePlan& plan, int64_t rows, const void* fp8_table, int64_t d, int64_t inter,
                               float swiglu_limit, CUstream_st* stream);

// For tests: the same over LinearWeights in device memory (experts_fp8_prepare on the default stream).
bool experts_fp8_shapes_ok(const std::vector<LinearWeight>& w1, const std::vector<LinearWeight>& w3,
                           const std::vector<LinearWeight>& w2);
bool experts_fp8_prepare(const std::vector<LinearWeight>& w1, const std::vector<LinearWeight>& w3,
                         const std::vector<LinearWeight>& w2, uint8_t* row_max);
// The whole op on the default stream over x [rows, d] in place (runs starting at run_starts), synchronized.
void run_grouped_experts_fp8_sync(float* x, const std::vector<int64_t>& run_starts, const std::vector<LinearWeight>& w1,
                                  const std::vector<LinearWeight>& w3, const std::vector<LinearWeight>& w2,
                                  float swiglu_limit, float* h_out = nullptr);

}  // namespace deepinfer::cuda
