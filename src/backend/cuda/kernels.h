// Kernel launchers of the CUDA backend (defined in the .cu files). All pointers are device memory; all
// launches go to `stream`. Shapes as in backend/backend.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gemm_policy.h"
#include "core/weight.h"

namespace deepinfer::cuda {

// A device weight as the kernels see it (cuda_backend.cu; the dtype of a dense weight is checked there).
WeightDesc describe_weight(const LinearWeight& w);
// The descriptions of three expert lists (w1, w3, w2), as the backend describes its weights.
struct ExpertDescs {
    std::vector<WeightDesc> w1, w3, w2;
    ExpertDescs(const std::vector<LinearWeight>& l1, const std::vector<LinearWeight>& l3,
                const std::vector<LinearWeight>& l2) {
        for (const LinearWeight& w : l1) w1.push_back(describe_weight(w));
        for (const LinearWeight& w : l3) w3.push_back(describe_weight(w));
        for (const LinearWeight& w : l2) w2.push_back(describe_weight(w));
    }
};

// out[t, n] (row stride ldc) = sum_k x[t, k] (row stride lda) * W[w_row0 + n, k], t < rows, n < n_out.
void launch_gemm(float* out, int64_t ldc, const float* x, int64_t lda, int64_t rows, const WeightDesc& w,
                 int64_t w_row0, int64_t n_out, cudaStream_t stream);
// The same product on tensor cores (gemm_tc.cu): bf16-rounded activations and weights (FP8/FP4 times E8M0
// scales stay exact), fp32 accumulation. Each output's reduction order depends only on K, not on `rows` or
// the tile shape, unless allow_split_k lets small problems split K (deterministic, but then row-count dependent).
void launch_gemm_tc(float* out, int64_t ldc, const float* x, int64_t lda, int64_t rows, const WeightDesc& w,
                    int64_t w_row0, int64_t n_out, bool allow_split_k, cudaStream_t stream);
// The same product on cuBLAS (gemm_cublas.cu), same numerics as launch_gemm_tc: x rounded to bf16 once, the
// weight rows dequantized into a bf16 scratch (BF16 weights read in place), then one bf16 x bf16 -> fp32
// cublasGemmEx per chunk of weight rows. cuBLAS picks its algorithm (and split-K) per shape, so a row's result
// may depend on the row count: not for batch-invariant mode. The default mode takes it from kCublasMinRows rows
// (gemm_policy.h).
// Bound on the dequantized weight scratch per call: larger weights (the 129280 x 4096 head: 1 GiB in bf16) are
// done in chunks of weight rows.
constexpr int64_t kCublasScratchBytes = int64_t{256} << 20;
// One per backend: a cuBLAS handle bound to `stream`, with its own workspace. Not thread-safe (nor is the stream).
class CublasGemm {
public:
    explicit CublasGemm(cudaStream_t stream);
    ~CublasGemm();
    CublasGemm(const CublasGemm&) = delete;
    CublasGemm& operator=(const CublasGemm&) = delete;
    // As launch_gemm_tc, on this handle's stream: x rounded to bf16 into a packed copy (launch_to_bf16), then
    // run_bf16 from it.
    void run(float* out, int64_t ldc, const float* x, int64_t lda, int64_t rows, const WeightDesc& w, int64_t w_row0,
             int64_t n_out);
    // The same product from activations already in bf16: xb [rows, K] bf16 bits at row stride ldb (a multiple of 8,
    // xb 16-byte aligned). Given run()'s packed copy ([rows, round_up(K, 8)], zero-padded), it computes what run()
    // does; several products of one input (Backend::linears, a grouped product's groups) can share one conversion.
    // out_bf16: out holds bf16 (each fp32 sum rounded to nearest even by cuBLAS's epilogue), ldc in elements.
    void run_bf16(void* out, int64_t ldc, const uint16_t* xb, int64_t ldb, int64_t rows, const WeightDesc& w,
                  int64_t w_row0, int64_t n_out, bool out_bf16 = false);

private:
    void* handle_ = nullptr;  // cublasHandle_t (kept opaque: this header does not include cuBLAS's)
    void* workspace_ = nullptr;
    cudaStream_t stream_;
};
// xb [rows, kp] bf16 bits = x [rows, k] (row stride lda) rounded to nearest even, zeros in columns k .. kp - 1
// (kp a multiple of 8): the activations of the bf16 products, converted once.
void launch_to_bf16(uint16_t* xb, int64_t kp, const float* x, int64_t lda, int64_t rows, int64_t k,
                    cudaStream_t stream);
// x [n] f32 = xb [n] bf16 bits (exact).
void launch_from_bf16(float* x, const uint16_t* xb, int64_t n, cudaStream_t stream);
// dst [n, ld] bf16 bits = W rows row0 .. row0 + n - 1 rounded to bf16 (the cuBLAS path's dequantization; columns
// K .. ld - 1 untouched).
void launch_dequantize_bf16(uint16_t* dst, int64_t ld, const WeightDesc& w, int64_t row0, int64_t n,
                            cudaStream_t stream);
// The same product for at most kGemvMaxRows rows, streaming each weight row once (decode). Applies when
// gemv_applies(): whole 16-byte chunks per weight row, each inside one scale block, a power-of-two number of
// chunks per scale block, and K short enough for an eighth of the activation rows to fit in shared memory.
constexpr int kGemvMaxRows = 8;
bool gemv_applies(int64_t rows, const WeightDesc& w);
// Such products of one row count (each gemv_applies()) as jobs, consecutive ones of one weight kind and K sharing a
// launch: a single product, the projections of one input, or the groups of a grouped linear.
struct GemvJob {
    float* out;  // [rows, ldc] f32
    int64_t ldc;
    const float* x;  // [rows, lda] f32
    int64_t lda;
    WeightDesc w;  // rows w_row0 .. w_row0 + n_out
    int64_t w_row0, n_out;
};
void launch_gemv_jobs(const GemvJob* jobs, int count, int64_t rows, cudaStream_t stream);
// For gemv_bench's sweep: force every later launch's output rows per 8-lane group (1 or 2) and cluster size (K
// splits: 1, 2, 4 or 8; too few for the activation slice fails the launch), or (0, 0) for the heuristic's choice;
// false for other values. Not for concurrent use with other launches.
bool set_gemv_split(int rows_per_group, int cluster);
// The same product for 2..32 rows on the tensor cores, from bf16-rounded activations and weights (the numerics
// of the tensor-core GEMM). Applies when K is whole blocks of 4 16-byte chunks, each chunk lies in one scale
// block (FP4: one group per chunk), and K fits 8 staged slices (16,384 up to 16 rows, 8,192 above).
bool gemv_tc_applies(int64_t rows, const WeightDesc& w);
// Such products (each gemv_tc_applies()) as jobs, consecutive ones of one weight kind and K sharing a launch.
void launch_gemv_tc_jobs(const GemvJob* jobs, int count, int64_t rows, cudaStream_t stream);
// The same products on Hopper wgmma for FP8 weights (gemv_wgmma.cu), with gemv_tc's numerics (bf16-rounded
// activations, weights bf16(fp8 * scale), fp32 accumulation) but another summation order; deterministic (split-K
// partials summed in a fixed order). Applies for 2..128 rows, FP8 with 128 x 128 scale blocks (E8M0 or f32), K a
// multiple of 128, 16-byte aligned rows, on a compute capability 9.0 device. Consecutive jobs of one K and scale kind
// share a launch (up to 8); stream-ordered scratch (rows x K bf16 per distinct x) on `stream`.
bool gemv_wgmma_applies(int64_t rows, const WeightDesc& w);
// The weight conditions of the FP8 block GEMVs (gemv_wgmma, gemv_fp8_mma): FP8 with 128 x 128 scale blocks (E8M0, or
// f32 4-byte aligned), K a positive multiple of 128 up to 2^24, 16-byte aligned rows.
bool fp8_block_weight_streams(const WeightDesc& w);
// For gemv_bench's plan sweep: force every later launch's tile height (slices of 64 weight rows: 2 or 4) and K splits
// (1..8; a launch where that plan cannot run fails), or (0, 0) for the cost model's choice again; false for other
// values. Not for concurrent use with other launches.
bool set_gemv_wgmma_plan(int slices, int splits);
struct GemvWgmmaPlan {
    int slices, splits;
    int64_t tiles;
};
// The plan a launch of these jobs (same K, at most 8) at `rows` rows (at most 64) takes.
GemvWgmmaPlan gemv_wgmma_plan_of(const GemvJob* jobs, int count, int64_t rows);
void launch_gemv_wgmma_jobs(const GemvJob* jobs, int count, int64_t rows, cudaStream_t stream);
// The same products for 1..kGemvFp8MmaMaxRows rows on the FP8 tensor cores (gemv_fp8_mma.cu): the weights' bytes as
// they are times the activations rounded to bf16 and split exactly into two e4m3 terms, each 128-k block's sums scaled
// into fp32 (differs from the bf16 GEMVs by the FP8 tensor cores' summation inside a block). Applies for FP8 with
// 128 x 128 scale blocks (E8M0 or f32), K a multiple of 128, 16-byte aligned rows, on compute capability 8.9 and
// later; deterministic. Scratch: 2 rows x K bytes and the scales per distinct x.
constexpr int64_t kGemvFp8MmaMaxRows = 4;
bool gemv_fp8_mma_applies(int64_t rows, const WeightDesc& w);
void launch_gemv_fp8_mma_jobs(const GemvJob* jobs, int count, int64_t rows, cudaStream_t stream);
void launch_embedding(float* out, const WeightDesc& table, const int32_t* ids, int64_t rows, cudaStream_t stream);

// RMSNorm of rows [rows, cols]. Many short rows take a warp a row (another summation order than a block a row);
// fixed_kernel keeps one kernel for every row count, so that a row's result does not depend on it (batch-invariant
// mode).
void launch_rms_norm(float* out, const float* x, const float* weight, int64_t rows, int64_t cols, float eps,
                     bool fixed_kernel, cudaStream_t stream);
// launch_rms_norm (over head_dim, in place) then launch_rope (not inverse) on x [rows, heads, head_dim] in one kernel,
// bitwise the two. Applies where launch_rms_norm would take a block a row (with the same fixed_kernel) and
// rope_dim % 4 == 0, x and weight 16-byte aligned.
bool rms_norm_rope_applies(const float* x, const float* weight, int64_t rows, int64_t heads, int64_t head_dim,
                           int rope_dim, bool fixed_kernel);
void launch_rms_norm_rope(float* x, const float* weight, float eps, const int32_t* positions, const float* inv_freq,
                          int64_t rows, int64_t heads, int64_t head_dim, int rope_dim, float attention_factor,
                          bool fixed_kernel, cudaStream_t stream);
void launch_rope(float* x, const int32_t* positions, const float* inv_freq, int64_t rows, int64_t heads,
                 int64_t head_dim, int rope_dim, float attention_factor, bool inverse, cudaStream_t stream);
void launch_swiglu(float* out, const float* gate, const float* up, int64_t n, float limit, cudaStream_t stream);
void launch_gated_pool(float* out, const float* kv, const float* gate, int64_t entries, int64_t slots, int64_t c,
                       cudaStream_t stream);
// kind: 0 FP8 ue8m0, 1 FP4 e4m3 scale, 2 FP4 ue8m0 (QuantSim order)
void launch_fake_quantize(float* x, int64_t n, int block, int kind, cudaStream_t stream);

struct HcDesc {
    const float* fn;     // [mix, n * D]
    const float* base;   // [mix]
    const float* scale;  // [3] or [1]
    int n, sinkhorn_iters;
    float hc_eps, norm_eps;
    // Calls of more than a few rows may take the 3xTF32 tensor-core dots (hc_dots_tc.cu: fp32-level accuracy, but
    // a row's result depends on the row count): not for batch-invariant or the exact fp32 mode.
    bool tensor_cores = false;
};
void launch_hc_mix(float* pre, float* post, float* comb, const float* streams, int64_t rows, int64_t d,
                   const HcDesc& p, cudaStream_t stream);
// launch_hc_post(out, y, post, comb, old) then launch_hc_mix(pre, post, comb, out) with the expand made by the mix's
// tensor-core dots as they load it (hc_post_dots_tc): bitwise the two, without the mix's second read of out (1 GB
// at a prefill of 16K tokens). post and comb are read for the expand, then rewritten by the mix. Applies for n = 4,
// the tensor-core dots (p.tensor_cores, more than a few rows) and their layouts.
bool hc_post_mix_applies(int64_t rows, int64_t d, const float* out, const float* y, const float* old, const HcDesc& p);
void launch_hc_post_mix(float* pre, float* post, float* comb, float* out, const float* y, const float* old,
                        int64_t rows, int64_t d, const HcDesc& p, cudaStream_t stream);
// out [rows, d] = RMSNorm of hc_collapse's rows (times weight [d] when not null) in one kernel, a block per row:
// bitwise what launch_hc_collapse then launch_rms_norm give where the latter takes a block per row (d > 1024, or
// fewer than 1024 rows). Applies for n <= 8, d % 4 == 0, d <= 4096, 16-byte aligned
// out, streams and weight.
bool hc_collapse_norm_applies(int64_t n, int64_t d, const float* out, const float* streams, const float* weight);
void launch_hc_collapse_norm(float* out, const float* streams, const float* pre, const float* weight, int64_t rows,
                             int64_t n, int64_t d, float eps, cudaStream_t stream);
// launch_hc_mix then launch_hc_collapse_norm for a few tokens (n = 4, at most 64 rows: decode) in two launches
// instead of three, bitwise the same: the collapse computes its token's pre weights itself, alongside the blocks
// that make post and comb, so it no longer waits for the Sinkhorn. Applies where hc_collapse_norm_applies does.
bool hc_pre_norm_fused_applies(int64_t n, int64_t rows, int64_t d, const float* out, const float* streams,
                               const float* weight);
void launch_hc_pre_norm_fused(float* out, float* post, float* comb, const float* streams, int64_t rows, int64_t d,
                              const HcDesc& p, const float* weight, float eps, cudaStream_t stream);
// launch_hc_post(out, y, post, comb, old) then launch_hc_pre_norm_fused(normed, post, comb, out) in two launches
// instead of three, bitwise the same: the few-token dots make the new streams as they stage them. Applies where
// hc_pre_norm_fused_applies does, with d a multiple of 512, y, old and the mix weights 16-byte aligned and out
// apart from old.
bool hc_post_pre_norm_fused_applies(int64_t n, int64_t rows, int64_t d, const float* out, const float* y,
                                    const float* old, const float* normed, const float* weight, const HcDesc& p);
void launch_hc_post_pre_norm_fused(float* normed, float* post, float* comb, float* out, const float* y,
                                   const float* old, int64_t rows, int64_t d, const HcDesc& p, const float* weight,
                                   float eps, cudaStream_t stream);
void launch_hc_collapse(float* out, const float* streams, const float* pre, int64_t rows, int64_t n, int64_t d,
                        cudaStream_t stream);
void launch_hc_post(float* out, const float* y, const float* post, const float* comb, const float* streams,
                    int64_t rows, int64_t n, int64_t d, cudaStream_t stream);
void launch_hc_head_pre(float* pre, const float* streams, int64_t rows, int64_t d, const HcDesc& p,
                        cudaStream_t stream);
// The mix dots on the tensor cores (hc_dots_tc.cu): part [tokens, S, rows + 1] = the partials of S = ceil(width
// / split_width) splits of f [tokens, width] . fn [rows, width]^T and of the sums of squares. Applies for rows <= 24,
// width % 4 == 0 and 16-byte aligned f and fn; split_width from hc_dots_tc_split_width (the same streams). streams:
// 1 (a split is a range of the width) or 4 (width % 16 == 0: the width is 4 streams, and a split the same range of
// columns in each, summed in blocks of 32 columns, stream by stream, as launch_hc_post_dots_tc makes them).
bool hc_dots_tc_applies(const float* f, int64_t width, const float* fn, int rows);
int64_t hc_dots_tc_split_width(int64_t tokens, int64_t width, int64_t streams);
void launch_hc_dots_tc(float* part, const float* f, int64_t tokens, int64_t width, const float* fn, int rows,
                       int64_t split_width, int64_t streams, cudaStream_t stream);
// The same dots over out [tokens, 4 d] made as they are loaded: out = launch_hc_post(y [tokens, d], post [tokens, 4],
// comb [tokens, 4, 4], old [tokens, 4 d]) bitwise, written once; the dots bitwise launch_hc_dots_tc's over that out
// with streams = 4. Applies for d % 4 == 0 and 16-byte aligned out, y, old and fn (and rows <= 24).
bool hc_post_dots_tc_applies(const float* out, const float* y, const float* old, int64_t d, const float* fn, int rows);
void launch_hc_post_dots_tc(float* part, float* out, const float* y, const float* post, const float* comb,
                            const float* old, int64_t tokens, int64_t d, const float* fn, int rows, int64_t split_width,
                            cudaStream_t stream);

// batch_invariant: never split a row's key list over several blocks, so a row's result does not depend on the
// number of rows in the call.
void launch_sparse_attention(float* out, const float* q, const float* keys, const int32_t* offsets,
                             const int32_t* indices, const float* sinks, int64_t rows, int64_t heads, int64_t d,
                             float scale, bool batch_invariant, cudaStream_t stream);
// The same op on the tensor cores (attention_tc.cu), for the bf16 modes: q and keys rounded to bf16, fp32
// accumulation and softmax, the probabilities rounded to bf16 for the product with V. Deterministic; without a
// split (batch_invariant) a row's result does not depend on the other rows. Head dims up to 512
// (sparse_attention_tc_applies). nkeys: rows of the key table. staging: how key tiles reach shared memory (the
// results are the same): gathered from the fp32 table, or by cp.async from a bf16 copy made once per call;
// kAuto picks the copy when the table is small against the rows (prefill).
enum class AttnKeyStaging { kAuto, kGather, kTable };
// The queries' per-head RMSNorm and RoPE and the output's inverse RoPE, applied inside the attention
// (Backend::rotary_attention_rows): only the wgmma form takes them (sparse_attention_wgmma_takes_rope).
struct AttnRope {
    const int32_t* positions;  // [rows]
    const float* inv_freq;     // [rope_dim / 2]
    int rope_dim;
    float attention_factor, eps;
    bool out_bf16 = false;  // out holds bf16 (each value rounded to nearest even), not f32
    bool q_bf16 = false;    // q holds bf16, not f32
};
bool sparse_attention_tc_applies(int64_t d);
// Whether kAuto stages from the bf16 copy for a table of nkeys rows and `rows` query rows.
bool sparse_attention_tc_copies_table(int64_t nkeys, int64_t rows);
// key_rows (non-null, keys null): the keys by address ([nkeys] rows of d floats, 16-byte aligned), read in place
// (gather staging) instead of from a table. out: f32, or bf16 where rope->out_bf16; q: f32, or bf16 where
// rope->q_bf16.
void launch_sparse_attention_tc(void* out, const void* q, const float* keys, int64_t nkeys, const int32_t* offsets,
                                const int32_t* indices, const float* sinks, int64_t rows, int64_t heads, int64_t d,
                                float scale, bool batch_invariant, cudaStream_t stream,
                                AttnKeyStaging staging = AttnKeyStaging::kAuto, const float* const* key_rows = nullptr,
                                const AttnRope* rope = nullptr);
// table [rows, half] = (cos, sin) of RoPE pair i at positions[r], scaled by attention_factor: what rope_kernel
// computes for each pair, for kernels that rotate as they load (the wgmma attention).
void launch_rope_table(float2* table, const int32_t* positions, const float* inv_freq, int64_t rows, int half,
                       float attention_factor, cudaStream_t stream);
// The prefill form of the tensor-core attention on wgmma (attention_wgmma.cu, Hopper): 64-head groups of head dim
// 512 from the bf16 table copy, without splits; not in batch-invariant mode (its sums run in another order than the
// mma.sync kernel's, which serves the decode rows). DEEPINFER_CUDA_ATTN_WGMMA=0 keeps the mma.sync kernel.
bool sparse_attention_wgmma_applies(int64_t rows, int64_t heads, int64_t d, bool batch_invariant, bool table,
                                    const void* q, const void* out);
// Whether it also norms and rotates the queries and rotates the output back (rope dims within a head's last 128).
bool sparse_attention_wgmma_takes_rope(int rope_dim);
void launch_sparse_attention_wgmma(void* out, const void* q, const uint16_t* table, const int32_t* offsets,
                                   const int32_t* indices, const float* sinks, int64_t rows, int64_t heads, float scale,
                                   cudaStream_t stream, const AttnRope* rope = nullptr);
// With key_begin / key_count ([rows] I32): row t scores keys key_begin[t] .. + key_count[t] into its first
// key_count[t] columns; entries is then the row stride of scores (Backend::indexer_scores_rows).
void launch_indexer_scores(float* scores, const float* q, const float* keys, const float* weights, int64_t rows,
                           int64_t heads, int64_t c, int64_t entries, float scale, cudaStream_t stream,
                           const int32_t* key_begin = nullptr, const int32_t* key_count = nullptr);
// The same op on the tensor cores (indexer_tc.cu), for the bf16 modes: q and keys rounded to bf16, fp32
// accumulation, relu, weights and head sums. Each output's summation order depends only on heads and c, so a row's
// scores do not depend on the other rows (batch-invariant). Takes up to 256 heads and c up to 512 where the
// shared memory allows (indexer_scores_tc_applies); any T, E, key ranges and pointer alignment.
bool indexer_scores_tc_applies(int64_t heads, int64_t c);
// key_rows (rows form only, 0 if unknown): the rows of the key table, which tell whether rows share key ranges.
void launch_indexer_scores_tc(float* scores, const float* q, const float* keys, const float* weights, int64_t rows,
                              int64_t heads, int64_t c, int64_t entries, float scale, cudaStream_t stream,
                              const int32_t* key_begin = nullptr, const int32_t* key_count = nullptr,
                              int64_t key_rows = 0);

void launch_gather_rows(float* dst, const float* const* rows, int64_t r, int64_t c, cudaStream_t stream);
void launch_scatter_rows(float* const* rows, const float* src, int64_t r, int64_t c, cudaStream_t stream);
// Backend::copy_rows: dst[i] (cols[i] floats) = src[i] for r rows, one launch.
void launch_copy_row_pairs(float* const* dst, const float* const* src, const int32_t* cols, int64_t r,
                           cudaStream_t stream);
// Backend::fill_index_ranges: dst [n] I32, runs [r, 5] I32; entries a run puts outside dst are not written.
void launch_fill_index_ranges(int32_t* dst, int64_t n, const int32_t* runs, int64_t r, cudaStream_t stream);
// Backend::fill_row_addresses: dst [n] I64, runs [r, 4] I64; likewise.
void launch_fill_row_addresses(int64_t* dst, int64_t n, const int64_t* runs, int64_t r, cudaStream_t stream);
void launch_add(float* x, const float* y, int64_t n, cudaStream_t stream);
void launch_scale(float* x, float s, int64_t n, cudaStream_t stream);
void launch_moe_combine(float* out, const float* routed, const float* weights, const float* shared, int64_t t,
                        int64_t k, int64_t d, cudaStream_t stream);

// Greedy selection and sampling (sampling.cu): see Backend::argmax_rows and Backend::sample_rows.
void launch_argmax_rows(int32_t* ids, const float* logits, int64_t rows, int64_t vocab, cudaStream_t stream);
struct SampleRowDesc {
    float temperature, top_p;
    float min_p_offset;  // temperature * log(min_p) in float as the host computes it, -inf without min_p
    int top_k;
    uint64_t seed, token_index;
};
void launch_sample_rows(int32_t* ids, const float* logits, int64_t rows, int64_t vocab, const SampleRowDesc* params,
                        cudaStream_t stream);

// The indexer's top-k (select.cu): see Backend::indexer_select.
// bases ([rows] I32, optional): row t's picks are bases[t] + entry instead of base + entry.
void launch_indexer_select(int32_t* dst, const int32_t* starts, const float* scores, int64_t rows, int64_t entries,
                           const int32_t* limits, int k, int32_t base, cudaStream_t stream,
                           const int32_t* bases = nullptr);

// MoE routing of `rows` rows of logits [rows, e] (Backend::moe_route): experts [rows, k] I32, weights [rows, k].
struct MoeRouteDesc {
    const float* bias;       // [e] f32 selection bias, or null (score routing)
    const int32_t* tid2eid;  // [vocab, k] I32 expert ids (hash routing), or null (score routing)
    const int32_t* tokens;   // [rows] I32 token ids (hash routing)
    int64_t vocab;           // rows of tid2eid
    int scoring;             // 0 sqrt(softplus), 1 softmax, 2 sigmoid (ScoringFunc's order)
    int k;                   // experts per row, <= kMoeRouteMaxK
    float gate_temp;         // logits are divided by it unless it is 1
    float routed_scaling;
};
constexpr int kMoeRouteMaxK = 32;
void launch_moe_route(int32_t* experts, float* weights, const float* logits, int64_t rows, int64_t e,
                      const MoeRouteDesc& r, cudaStream_t stream);

// Routed expert products (Backend::expert_linear): out [rows, n] row r = x row (r / rows_per_input) [k] times
// table[expert_of_row[r]]^T, every table entry an [n, k] weight of one kind. `fast` (from
// expert_linear_streams()) picks the weight-streaming kernels (for k up to 24576), else a plain one for any layout.
// The streaming kernels group the rows by expert on the device (a small sorting launch when many rows may share
// experts, with stream-ordered scratch memory), read each touched expert's weights once per group of its rows,
// and sum each output in an order fixed by k and the weight kind: a row's result does not depend on the other
// rows. `tensor_cores` picks the bf16 one (the numerics of launch_gemm_tc: activations rounded to bf16, weights
// dequantized to bf16, fp32 accumulation; groups of up to 16 rows on mma.sync), else the fp32 one (fp32 FMAs,
// groups of up to 4 rows). An id outside [0, num_experts) gives a NaN row.
struct ExpertLinearDesc {
    float* out;                    // [rows, n] f32
    const float* x;                // [rows / rows_per_input, k] f32
    const int32_t* expert_of_row;  // [rows] I32
    const WeightDesc* table;       // [num_experts] device memory
    int64_t rows, n, k;
    int num_experts, rows_per_input;
};
// Rows (slots) up to which the default mode keeps the routed experts on the fp32 kernel (see tc_experts() in
// the backend); its one-row items need no grouping launch.
constexpr int64_t kExpertTcMinRows = 64;
// True when every weight can be streamed in whole 16-byte chunks (see gemv_applies(), without the limit on K).
bool expert_linear_streams(const WeightDesc* host_table, int64_t num_experts);
void launch_expert_linear(const ExpertLinearDesc& p, const WeightDesc& first, bool fast, bool tensor_cores,
                          cudaStream_t stream);

}  // namespace deepinfer::cuda
