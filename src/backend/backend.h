// The op set models are written against. A backend implements each op on its own memory; the CPU
// backend (fp32, the oracle) works on host memory. Shapes are given as comments: [T, D] f32 and so on.
// All activation tensors are contiguous f32 unless stated otherwise.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "core/weight.h"
#include "deepinfer/error.h"

namespace deepinfer {

class ThreadPool;

// Hyper-connection (mHC) parameters for one sublayer or the final head collapse.
struct HcParams {
    const float* fn = nullptr;     // [mix, n * D]: mix = (2 + n) * n for sublayers, n for the head
    const float* base = nullptr;   // [mix]
    const float* scale = nullptr;  // [3] for sublayers (pre, post, comb), [1] for the head
    int n = 0;                     // streams
    int sinkhorn_iters = 0;
    float hc_eps = 0;              // added to pre and to the Sinkhorn normalisers
    float norm_eps = 0;            // of the unweighted RMS normalisation of the flattened streams
};

// Quantization simulations (DeepSeek-V4.1's QAT): the value is replaced by its dequantized code.
enum class QuantSim {
    kFp8Ue8m0,  // e4m3 codes, power-of-two scale 2^ceil(log2(amax / 448)), amax >= 1e-4
    kFp4E4m3,   // e2m1 codes, e4m3 scale round(amax / 6), amax >= 6 * 2^-9
    kFp4Ue8m0,  // e2m1 codes, power-of-two scale 2^ceil(log2(amax / 6)), amax >= 6 * 2^-126
};

// How a mixture-of-experts router turns logits into per-token scores.
enum class ScoringFunc { kSqrtSoftplus, kSoftmax, kSigmoid };

// Routing of a DeepSeek MoE layer (see Backend::moe_route). Arrays live in the backend's memory.
struct MoeRouting {
    ScoringFunc scoring = ScoringFunc::kSqrtSoftplus;
    float gate_temp = 1.0f;             // logits are divided by it before scoring (unless it is 1)
    const float* bias = nullptr;        // [E] f32 selection bias (score routing); null: zeros
    const int32_t* tid2eid = nullptr;   // [vocab, k] expert ids (hash routing); null: score routing
    const int32_t* tokens = nullptr;    // [T] token ids (hash routing)
    int64_t vocab = 0;                  // rows of tid2eid
    int k = 0;                          // experts per token
    float routed_scaling = 1.0f;
};

// Every tensor and array an op reads or writes lives in the backend's memory (alloc(), or weights the
// backend was given); on host backends (is_host()) that is plain host memory. Ops run in issue order;
// download() and synchronize() wait for them.
class Backend {
public:
    virtual ~Backend() = default;
    virtual std::string name() const = 0;
    virtual bool is_host() const = 0;
    // Uninitialised memory of the backend.
    virtual Tensor alloc(DType dtype, Shape shape) = 0;
    // Copies dst.nbytes() bytes from host memory into dst, and back.
    virtual void upload(TensorView dst, const void* src) = 0;
    virtual void download(void* dst, TensorView src) = 0;
    // A download in two halves, so that the host can work while the device runs what is queued after it:
    // download_async queues the copy of src behind the work queued so far and may return before it lands;
    // wait_downloads returns once every queued download's bytes are in its dst. Host backends copy at once.
    virtual void download_async(void* dst, TensorView src) { download(dst, src); }
    virtual void wait_downloads() {}
    virtual void synchronize() = 0;
    // Device time per op since the last call, as a table, when the backend profiles (the CUDA backend with
    // DEEPINFER_CUDA_PROFILE=1); empty otherwise.
    virtual std::string take_profile() { return {}; }
    // Host thread pool for the loops models run around the ops.
    virtual ThreadPool& pool() = 0;
    // Batch-invariant mode: every op reduces each row in a fixed order that does not depend on how many
    // rows are processed together, so a sequence's results are bitwise identical alone or in any batch.
    virtual void set_batch_invariant(bool on) = 0;
    virtual bool batch_invariant() const = 0;
    // A side queue for independent work. The ops issued between side_begin() and side_end() start after every op
    // issued before side_begin() and may run alongside the ops issued after side_end(); the ops issued after
    // side_join() start once the side queue's are done. Until side_join(), neither side may write what the other
    // reads or writes, and what the side ops use must stay allocated; the side queue takes no uploads or
    // downloads. Results do not depend on the overlap (each op's arithmetic is its own). Backends that run one op
    // at a time take the calls as no-ops. SideQueue (below) pairs them, also when an op throws.
    virtual void side_begin() {}
    virtual void side_end() {}
    virtual void side_join() {}

    // out [T, N] = x [T, K] . W^T, W [N, K] in any stored format.
    virtual void linear(TensorView out, TensorView x, const LinearWeight& w) = 0;
    // Several products of one input (an activation's projections): outs[i] = x . ws[i]^T. Device backends
    // may run them in one launch (their K split, and so the last bits of a sum, may then differ from
    // separate linear() calls); in batch-invariant mode each is computed as linear() computes it.
    struct Projection {
        TensorView out;
        const LinearWeight* w;
    };
    virtual void linears(TensorView x, const std::vector<Projection>& projections) {
        for (const Projection& p : projections) linear(p.out, x, *p.w);
    }
    // Block-diagonal: for g < groups, out[:, g*R:(g+1)*R] = x[:, g*K:(g+1)*K] . W[g*R:(g+1)*R, :]^T,
    // W [groups * R, K], x [T, groups * K], out [T, groups * R].
    // x may be BF16 where takes_bf16_inputs(T, w) holds.
    virtual void grouped_linear(TensorView out, TensorView x, const LinearWeight& w, int groups) = 0;
    // Whether products of `rows` rows with w round their input to bf16 first (a device's bf16 tensor-core GEMM), so
    // that grouped_linear may take that input in BF16 and its producer write it so (the result is the same, the
    // fp32 copy and its conversion saved); where it holds, linears may also write that product's out in BF16 (its
    // fp32 sums rounded to nearest even: another result, for consumers content with bf16 values). False unless a
    // backend says so.
    virtual bool takes_bf16_inputs(int64_t rows, const LinearWeight& w) const {
        (void)rows, (void)w;
        return false;
    }
    // Products of activations quantized first: outs[i] = q(x) . ws[i]^T with q(x) what fake_quantize(x, kind, block)
    // leaves of x [T, K]; x itself is left as it is. The default multiplies a quantized copy; device backends may
    // instead multiply the quantized codes and their scales on FP8 tensor cores (the same products, summed in another
    // order).
    virtual void quantized_linears(TensorView x, QuantSim kind, int block, const std::vector<Projection>& projections);
    // grouped_linear of x quantized first the same way (each group's K a multiple of block).
    virtual void quantized_grouped_linear(TensorView out, TensorView x, QuantSim kind, int block, const LinearWeight& w,
                                          int groups);
    // out [T, D] = rows ids[t] of table [V, D].
    virtual void embedding(TensorView out, const LinearWeight& table, const int32_t* ids) = 0;
    // Over the last dim of x [R, C]: x * rsqrt(mean(x^2) + eps), times weight [C] when given. out may be x.
    virtual void rms_norm(TensorView out, TensorView x, const float* weight, float eps) = 0;
    // x [T, heads, head_dim]: rotates the last rope_dim dims of every head in interleaved pairs by
    // positions[t] * inv_freq[i] (negated when inverse), cos and sin scaled by attention_factor.
    virtual void rope(TensorView x, const int32_t* positions, const float* inv_freq, int rope_dim,
                      float attention_factor, bool inverse) = 0;

    // rms_norm over the last dim of x [T, heads, head_dim] in place (times weight [head_dim] when given), then rope
    // (not inverse) with these arguments. Device backends may fuse the two.
    virtual void rms_norm_rope(TensorView x, const float* weight, float eps, const int32_t* positions,
                               const float* inv_freq, int rope_dim, float attention_factor) {
        rms_norm(x, x, weight, eps);
        rope(x, positions, inv_freq, rope_dim, attention_factor, false);
    }

    // mHC collapse: from streams [T, n, D] computes post [T, n], comb [T, n, n] (Sinkhorn-normalised) and
    // the collapsed input collapsed [T, D] = sum_j pre_j * streams_j.
    virtual void hc_pre(TensorView collapsed, TensorView post, TensorView comb, TensorView streams,
                        const HcParams& p) = 0;
    // hc_pre, then the collapsed rows' RMSNorm: normed [T, D] = c * rsqrt(mean(c^2) + eps), times norm_weight [D]
    // when given, for each collapsed row c; post and comb as hc_pre. The default runs the two ops on scratch from
    // alloc(); device backends may fuse the collapse and the norm.
    virtual void hc_pre_norm(TensorView normed, TensorView post, TensorView comb, TensorView streams, const HcParams& p,
                             const float* norm_weight, float eps);
    // The mHC coefficients alone: pre [T, n], post [T, n], comb [T, n, n] (V4.1 collapses with a pre from
    // an earlier sublayer).
    virtual void hc_mix(TensorView pre, TensorView post, TensorView comb, TensorView streams, const HcParams& p) = 0;
    // collapsed [T, D] = sum_j pre[t, j] * streams[t, j]; pre [T, n].
    virtual void hc_collapse(TensorView collapsed, TensorView streams, TensorView pre) = 0;
    // mHC expand: out[t, k] = post[t, k] * y[t] + sum_j comb[t, j, k] * streams[t, j]. out [T, n, D].
    virtual void hc_post(TensorView out, TensorView y, TensorView post, TensorView comb, TensorView streams) = 0;
    // The expand of one sublayer and the collapse of the next: hc_post(out, y, post, comb, streams), then
    // hc_pre_norm(normed, post, comb, out, p, norm_weight, eps); post and comb are read by the first and rewritten by
    // the second. The default runs the two; device backends may make the expand as the mix reads it.
    virtual void hc_post_pre_norm(TensorView out, TensorView y, TensorView post, TensorView comb, TensorView streams,
                                  TensorView normed, const HcParams& p, const float* norm_weight, float eps) {
        hc_post(out, y, post, comb, streams);
        hc_pre_norm(normed, post, comb, out, p, norm_weight, eps);
    }
    // Final collapse: out [T, D] = sum_j (sigmoid(mix_j * scale + base_j) + eps) * streams[t, j].
    virtual void hc_head(TensorView out, TensorView streams, const HcParams& p) = 0;

    // Multi-query attention with one shared K=V head and per-head sinks: for query t and head h,
    // keys[indices[offsets[t] .. offsets[t+1])] are attended with logits q.k * scale, and the sink logit
    // sinks[h] joins the softmax denominator with a zero value. q [T, H, d], keys [Nk, d], out [T, H, d].
    virtual void sparse_attention(TensorView out, TensorView q, TensorView keys, const int32_t* offsets,
                                  const int32_t* indices, const float* sinks, float scale) = 0;
    // The same with the keys by address (as gather_rows takes them): key_rows [Nk] I64, each the address of a row
    // of d floats in this backend's memory (16-byte aligned when d % 4 == 0); indices select among them. The default
    // gathers them into a table for sparse_attention; device backends read them in place where that saves the copy
    // (decode, where most keys serve one query row).
    virtual void sparse_attention_rows(TensorView out, TensorView q, TensorView key_rows, const int32_t* offsets,
                                       const int32_t* indices, const float* sinks, float scale) {
        DI_ICHECK(key_rows.dtype() == DType::kI64, "sparse_attention_rows: key_rows must be I64 addresses");
        Tensor keys = alloc(DType::kF32, Shape{key_rows.numel(), q.dim(2)});
        gather_rows(keys.view(), key_rows);
        sparse_attention(out, q, keys.view(), offsets, indices, sinks, scale);
    }
    // The rotary queries and output of V4's attention around sparse_attention_rows: q [T, H, d] still to be normed
    // per head (unweighted RMSNorm with eps) and rotated (RoPE of its last rope_dim dims at positions[t]), out
    // rotated back after. The same as rms_norm_rope(q, nullptr, ...), sparse_attention_rows, then rope(out, ...,
    // inverse), which is the default; q is left normed and rotated, or as it was (device backends may norm and
    // rotate the queries as the attention loads them, and the output as it writes it). out may be BF16 (the F32
    // result rounded to nearest even), and q BF16, in backends whose takes_bf16_inputs can hold; the default takes
    // F32.
    struct AttentionRope {
        const int32_t* positions;  // [T], this backend's memory
        const float* inv_freq;     // [rope_dim / 2], this backend's memory
        int rope_dim;
        float attention_factor;
        float eps;  // the queries' RMSNorm
    };
    // Whether rotary_attention_rows norms and rotates queries of this shape inside the attention. Where it does not,
    // it runs rms_norm_rope first, and a caller may as well run the three ops itself, the norm earlier (V4's model:
    // on the side queue, beside the key row and the compressors).
    virtual bool attention_applies_rope(int64_t rows, int64_t heads, int64_t head_dim, int rope_dim) const {
        (void)rows, (void)heads, (void)head_dim, (void)rope_dim;
        return false;
    }
    virtual void rotary_attention_rows(TensorView out, TensorView q, TensorView key_rows, const int32_t* offsets,
                                       const int32_t* indices, const float* sinks, float scale,
                                       const AttentionRope& rope) {
        DI_ICHECK(out.dtype() == DType::kF32 && q.dtype() == DType::kF32, "rotary_attention_rows: F32 only here");
        rms_norm_rope(q, nullptr, rope.eps, rope.positions, rope.inv_freq, rope.rope_dim, rope.attention_factor);
        sparse_attention_rows(out, q, key_rows, offsets, indices, sinks, scale);
        this->rope(out, rope.positions, rope.inv_freq, rope.rope_dim, rope.attention_factor, true);
    }
    // Compressor pooling: out [E, c] = sum_s softmax_s(gate[e, s, :]) * kv[e, s, :], per channel;
    // kv, gate [E, S, c]; a gate of -inf marks an empty slot.
    virtual void gated_pool(TensorView out, TensorView kv, TensorView gate) = 0;
    // Lightning indexer: scores [T, E] = scale * sum_h weights[t, h] * relu(q[t, h] . keys[e]);
    // q [T, Hi, c], keys [E, c], weights [T, Hi].
    virtual void indexer_scores(TensorView scores, TensorView q, TensorView keys, TensorView weights,
                                float scale) = 0;
    // The indexer's top-k: for each row t of scores [T, E], the min(k, limits[t]) entries of [0, limits[t])
    // with the highest scores (at equal scores the lower index wins), written in ascending index order as
    // base + entry to dst[starts[t] ...]. dst: I32 array; starts, limits: [T] I32. NaN scores rank as -inf.
    virtual void indexer_select(TensorView dst, TensorView starts, TensorView scores, TensorView limits, int k,
                                int32_t base) = 0;
    // Both for rows of several sequences in one call each (each sequence has its own keys and key-list base).
    // Row t scores keys[key_begin[t] .. key_begin[t] + key_count[t]) into scores[t, 0 .. key_count[t]) of
    // scores [T, E] (E >= every count; the rest of the row is not written), and its picks are written as
    // bases[t] + entry. key_begin, key_count, bases: [T] I32 in backend memory. The defaults run the ops above
    // one row at a time (they read the arrays, so only host backends may keep them).
    virtual void indexer_scores_rows(TensorView scores, TensorView q, TensorView keys, TensorView weights,
                                     TensorView key_begin, TensorView key_count, float scale) {
        const int64_t e = scores.dim(1);
        for (int64_t t = 0; t < scores.dim(0); ++t) {
            const int64_t k0 = key_begin.as<int32_t>()[t], n = key_count.as<int32_t>()[t];
            if (n == 0) continue;
            indexer_scores(TensorView(scores.f32() + t * e, DType::kF32, Shape{1, n}), q.slice_rows(t, t + 1),
                           keys.slice_rows(k0, k0 + n), weights.slice_rows(t, t + 1), scale);
        }
    }
    virtual void indexer_select_rows(TensorView dst, TensorView starts, TensorView scores, TensorView limits,
                                     TensorView bases, int k) {
        for (int64_t t = 0; t < scores.dim(0); ++t)
            indexer_select(dst, starts.slice_rows(t, t + 1), scores.slice_rows(t, t + 1), limits.slice_rows(t, t + 1),
                           k, bases.as<int32_t>()[t]);
    }
    // Index lists from runs: for each row of runs [R, 5] I32 = (at, a, na, b, nb), dst[at + i] = a + i for i < na,
    // then dst[at + na + j] = b + j for j < nb. Other entries of dst (I32) are not written. A run reaching outside
    // dst is an error (host backends) or writes only its entries inside dst (device backends: the host does not
    // read the runs).
    virtual void fill_index_ranges(TensorView dst, TensorView runs) = 0;
    // Row addresses from runs of equally spaced rows: for each row of runs [R, 4] I64 = (at, address, count,
    // stride in bytes), dst[at + i] = address + i * stride for i < count. Other entries of dst (I64) are not
    // written; a run reaching outside dst as for fill_index_ranges. A sequence's key rows (its window ring, the
    // step's rows, its paged entries) are a few runs, so the host stages a few numbers a run instead of an address a
    // row.
    virtual void fill_row_addresses(TensorView dst, TensorView runs) = 0;
    // Greedy token selection: ids[r] = the index of the largest logit of row r of logits [R, V], the lowest
    // index on ties, NaN entries ignored; -1 when the row's first logit is NaN or no logit exceeds -inf (the
    // host sampler's error cases). ids: [R] I32.
    virtual void argmax_rows(TensorView ids, TensorView logits) = 0;
    // Sampling: ids[r] = the token sample_token() (src/sample/sampler.h) picks from row r of logits [R, V] with
    // rows[r]'s options and token index: temperature, min_p, top_k, top_p, then a Philox draw keyed by
    // (seed, token_index). Device backends compute exp() and the sums with their own rounding, so a draw that
    // falls within rounding of a boundary between two tokens may pick the other one. -1 where the row cannot
    // be decided (as argmax_rows: its first logit NaN, or no logit above -inf); the host sampler reports those.
    struct SampleRow {
        float temperature = 0.0f;  // 0: greedy (argmax_rows' token)
        int32_t top_k = 0;         // 0: every token
        float top_p = 1.0f;
        float min_p = 0.0f;
        uint64_t seed = 0;
        uint64_t token_index = 0;
    };
    virtual void sample_rows(TensorView ids, TensorView logits, const std::vector<SampleRow>& rows) = 0;
    // out [R, I] = silu(min(gate, limit)) * clamp(up, -limit, limit); limit <= 0 disables the clamp.
    virtual void swiglu(TensorView out, TensorView gate, TensorView up, float limit) = 0;
    // Row movement through device addresses (`rows`: [R] I64, each the address of a row of C floats in this
    // backend's memory), so rings, paged buffers and activations are addressed alike.
    // dst [R, C] row i = row rows[i].
    virtual void gather_rows(TensorView dst, TensorView rows) = 0;
    // row rows[i] = src [R, C] row i.
    virtual void scatter_rows(TensorView rows, TensorView src) = 0;
    // Address to address, rows of any widths in one op: row dst_rows[i] (cols[i] floats) = row src_rows[i]
    // (dst_rows, src_rows: [R] I64 addresses; cols: [R] I32). No destination row may overlap a source row.
    virtual void copy_rows(TensorView dst_rows, TensorView src_rows, TensorView cols) = 0;
    // x += y (same shape).
    virtual void add(TensorView x, TensorView y) = 0;
    // x *= s.
    virtual void scale(TensorView x, float s) = 0;
    // dst = src (the same number of bytes; contiguous).
    virtual void copy(TensorView dst, TensorView src) = 0;
    // out [T, D] = shared [T, D] + sum_k weights[t * K + k] * routed[t * K + k], k ascending.
    virtual void moe_combine(TensorView out, TensorView routed, TensorView weights, TensorView shared) = 0;
    // MoE routing of every row of logits [T, E]: scores s = score(logits / gate_temp) (softmax over the row,
    // sigmoid, or sqrt(softplus)); the row's k experts are tid2eid[tokens[t]] (hash routing) or the top k of
    // s + bias, ties to the lower expert id; weights = s[e] / (sum of the k selected s + 1e-20) *
    // routed_scaling, the sum taken in selection order. Each row's k slots are then sorted by ascending
    // expert id (the order moe_combine sums them in). experts [T, k] I32, weights [T, k] f32.
    virtual void moe_route(TensorView experts, TensorView weights, TensorView logits, const MoeRouting& r) = 0;
    // Routed expert products: out [R, N] row r = x row (r / rows_per_input) . W_e^T with e = expert_of_row[r]
    // ([R] I32) and W_e = experts[e] ([N, Kin], every expert in the same format); x [R / rows_per_input, Kin].
    // With rows_per_input = k, slot (t, j) of a routing reads token row t; with 1, each row its own input.
    // Meant for few rows (decode); in batch-invariant mode a row's result does not depend on the other rows.
    // An id outside [0, experts.size()) is an error (CPU) or gives a NaN row (CUDA).
    virtual void expert_linear(TensorView out, TensorView x, TensorView expert_of_row,
                               const std::vector<LinearWeight>& experts, int rows_per_input) = 0;
    // A routed expert's whole FFN from device-side ids (decode): out [R, D] row r = w2[e] . swiglu(w1[e] . x_t,
    // w3[e] . x_t, swiglu_limit) with e = expert_of_row[r] ([R] I32), t = r / rows_per_input, x [R / rows_per_input,
    // D], w1 and w3 [I, D], w2 [D, I]. The default is expert_linear (w1), expert_linear (w3), swiglu, expert_linear
    // (w2, a row per input) over scratch from alloc(); device backends may fuse it. As expert_linear, an id outside
    // [0, w1.size()) is an error (CPU) or gives a NaN row (CUDA); in batch-invariant mode a row's result does not
    // depend on the other rows. act_block > 0 (FP8 activations, model/activation_quant.h): both products' inputs, x
    // and the SwiGLU output, are quantized first as fake_quantize(kFp8Ue8m0, act_block) quantizes them (D and I
    // multiples of act_block); x itself is left as it is.
    virtual void routed_experts(TensorView out, TensorView x, TensorView expert_of_row,
                                const std::vector<LinearWeight>& w1, const std::vector<LinearWeight>& w3,
                                const std::vector<LinearWeight>& w2, int rows_per_input, float swiglu_limit,
                                int act_block = 0);
    // Whether routed_experts over `slots` slots (prefill-sized: more than model/moe.h's kMoeDeviceSlots) runs these
    // experts on the kernels grouped_experts_rows would take, planned on the device: then a caller can skip the
    // host's grouping of the slots, and with it the wait for their ids. The default: no.
    virtual bool routed_experts_take_prefill(int64_t slots, const std::vector<LinearWeight>& w1,
                                             const std::vector<LinearWeight>& w3, const std::vector<LinearWeight>& w2,
                                             int act_block) {
        (void)slots, (void)w1, (void)w3, (void)w2, (void)act_block;
        return false;
    }
    // Routed experts over rows grouped by expert (prefill): x [R, D] holds the rows sorted by expert, counts[e]
    // of them for expert e (sum R, zero for untouched experts); each expert's run x_e is replaced in place by
    // w2[e] . swiglu(w1[e] . x_e, w3[e] . x_e, swiglu_limit), w1 and w3 [I, D], w2 [D, I]. Every product is
    // computed as linear() computes it for that run's rows (device backends may run the experts concurrently);
    // the default runs them one after the other. act_block: as routed_experts'.
    virtual void grouped_experts(TensorView x, const std::vector<int64_t>& counts, const std::vector<LinearWeight>& w1,
                                 const std::vector<LinearWeight>& w3, const std::vector<LinearWeight>& w2,
                                 float swiglu_limit, int act_block = 0);
    // grouped_experts over rows addressed by pointer (as gather_rows and scatter_rows take them): slot i of the
    // runs (counts[e] slots for expert e, in expert order) reads its input row in_rows[i] and writes its output
    // row out_rows[i], each [cols] f32; in_rows, out_rows: [R] I64 in this backend's memory. The default
    // gathers the inputs, runs grouped_experts in place and scatters the outputs; device backends may read and
    // write the rows where they are.
    virtual void grouped_experts_rows(TensorView out_rows, TensorView in_rows, int64_t cols,
                                      const std::vector<int64_t>& counts, const std::vector<LinearWeight>& w1,
                                      const std::vector<LinearWeight>& w3, const std::vector<LinearWeight>& w2,
                                      float swiglu_limit, int act_block = 0);
    // Quantize-dequantize in place over blocks of `block` consecutive elements of the last dim, as the
    // model's quantization-aware training saw its activations (see QuantSim).
    virtual void fake_quantize(TensorView x, QuantSim kind, int block) = 0;

protected:
    // A copy of x quantized as fake_quantize(kind, block) quantizes it (what the default quantized products multiply).
    Tensor quantized_copy(TensorView x, QuantSim kind, int block);
    // Checks routed_experts' act_block against the experts' D and I.
    static void check_act_block(int act_block, const std::vector<LinearWeight>& w1);
    // The first row of each expert's run in grouped_experts' x (R at the end), once its shapes are checked.
    static std::vector<int64_t> expert_run_starts(TensorView x, const std::vector<int64_t>& counts,
                                                  const std::vector<LinearWeight>& w1,
                                                  const std::vector<LinearWeight>& w3,
                                                  const std::vector<LinearWeight>& w2);
};

// A copy of `w` in the backend's memory (`w` itself on host backends); the copies are kept in `storage`.
LinearWeight to_backend(Backend& backend, const LinearWeight& w, std::vector<Tensor>* storage);
// A copy of a host tensor in the backend's memory.
Tensor to_backend(Backend& backend, TensorView host);

// "cpu" (default) or "cuda" when built with it; throws Error naming the choices otherwise. Batch-invariant
// mode starts on when DEEPINFER_BATCH_INVARIANT=1.
std::unique_ptr<Backend> create_backend(const std::string& device, int num_threads = 0);

// Issues the ops between begin() and end() on the backend's side queue; join() makes the ops after it wait for
// them. Declared after the tensors the side ops use, its destructor (which ends and joins a queue left open by
// an exception) runs before theirs, so their memory is never released while the side queue may still use it.
class SideQueue {
public:
    explicit SideQueue(Backend& be) : be_(be) {}
    ~SideQueue();
    SideQueue(const SideQueue&) = delete;
    SideQueue& operator=(const SideQueue&) = delete;
    void begin();
    void end();
    void join();

private:
    enum class State { kIdle, kOpen, kEnded, kJoined };
    Backend& be_;
    State state_ = State::kIdle;
};

}  // namespace deepinfer
