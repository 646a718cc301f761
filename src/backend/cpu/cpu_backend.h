// The CPU backend: fp32 arithmetic on host memory, multithreaded with a ThreadPool. Matrix products go
// through OpenBLAS sgemm (single-threaded per call, parallel over output tiles); weights stay in their
// stored format and each tile is dequantized into a thread-local fp32 buffer right before its sgemm.
#pragma once

#include "backend/backend.h"
#include "core/thread_pool.h"

namespace deepinfer {

class CpuBackend final : public Backend {
public:
    explicit CpuBackend(int num_threads = 0);

    std::string name() const override { return "cpu"; }
    bool is_host() const override { return true; }
    Tensor alloc(DType dtype, Shape shape) override { return Tensor(dtype, shape); }
    void upload(TensorView dst, const void* src) override;
    void download(void* dst, TensorView src) override;
    void synchronize() override {}
    ThreadPool& pool() override { return pool_; }
    void set_batch_invariant(bool on) override { batch_invariant_ = on; }
    bool batch_invariant() const override { return batch_invariant_; }

    void linear(TensorView out, TensorView x, const LinearWeight& w) override;
    void grouped_linear(TensorView out, TensorView x, const LinearWeight& w, int groups) override;
    void embedding(TensorView out, const LinearWeight& table, const int32_t* ids) override;
    void rms_norm(TensorView out, TensorView x, const float* weight, float eps) override;
    void rope(TensorView x, const int32_t* positions, const float* inv_freq, int rope_dim, float attention_factor,
              bool inverse) override;
    void hc_pre(TensorView collapsed, TensorView post, TensorView comb, TensorView streams,
                const HcParams& p) override;
    void hc_mix(TensorView pre, TensorView post, TensorView comb, TensorView streams, const HcParams& p) override;
    void hc_collapse(TensorView collapsed, TensorView streams, TensorView pre) override;
    void hc_post(TensorView out, TensorView y, TensorView post, TensorView comb, TensorView streams) override;
    void hc_head(TensorView out, TensorView streams, const HcParams& p) override;
    void sparse_attention(TensorView out, TensorView q, TensorView keys, const int32_t* offsets,
                          const int32_t* indices, const float* sinks, float scale) override;
    void gated_pool(TensorView out, TensorView kv, TensorView gate) override;
    void indexer_scores(TensorView scores, TensorView q, TensorView keys, TensorView weights, float scale) override;
    void indexer_select(TensorView dst, TensorView starts, TensorView scores, TensorView limits, int k,
                        int32_t base) override;
    void swiglu(TensorView out, TensorView gate, TensorView up, float limit) override;
    void fake_quantize(TensorView x, QuantSim kind, int block) override;
    void gather_rows(TensorView dst, TensorView rows) override;
    void scatter_rows(TensorView rows, TensorView src) override;
    void copy_rows(TensorView dst_rows, TensorView src_rows, TensorView cols) override;
    void add(TensorView x, TensorView y) override;
    void scale(TensorView x, float s) override;
    void copy(TensorView dst, TensorView src) override;
    void argmax_rows(TensorView ids, TensorView logits) override;
    void fill_index_ranges(TensorView dst, TensorView runs) override;
    void fill_row_addresses(TensorView dst, TensorView runs) override;
    void sample_rows(TensorView ids, TensorView logits, const std::vector<SampleRow>& rows) override;
    void moe_combine(TensorView out, TensorView routed, TensorView weights, TensorView shared) override;
    void moe_route(TensorView experts, TensorView weights, TensorView logits, const MoeRouting& r) override;
    void expert_linear(TensorView out, TensorView x, TensorView expert_of_row, const std::vector<LinearWeight>& experts,
                       int rows_per_input) override;

private:
    // out[:, n0:n1] (row stride ldc) = x (row stride lda) . W[w_row0 + n0 : w_row0 + n1, :]^T for T rows.
    void gemm_rows(float* out, int64_t ldc, const float* x, int64_t lda, int64_t t, const LinearWeight& w,
                   int64_t w_row0, int64_t n);

    ThreadPool pool_;
    bool batch_invariant_ = false;
};

}  // namespace deepinfer
