#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cuda/block_cache.h"
#include "backend/cuda/experts_fp8.h"
#include "backend/cuda/experts_wgmma.h"
#include "backend/cuda/gemm_fp8.h"
#include "backend/cuda/gemm_policy.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/lanes.h"
#include "backend/cuda/op_profiler.h"
#include "core/log.h"
#include "core/thread_pool.h"

namespace deepinfer {

namespace cuda {

WeightDesc describe_weight(const LinearWeight& w) {
    WeightDesc d{};
    d.data = static_cast<const uint8_t*>(w.data.data());
    d.scale = static_cast<const uint8_t*>(w.scale.data());
    d.rows = w.rows;
    d.cols = w.cols;
    d.block_rows = w.block_rows;
    d.block_cols = w.block_cols;
    switch (w.format) {
        case WeightFormat::kDense:
            d.format = 0;
            d.dtype = w.data.dtype() == DType::kF32 ? 0 : w.data.dtype() == DType::kBF16 ? 1 : 2;
            DI_ICHECK(w.data.dtype() == DType::kF32 || w.data.dtype() == DType::kBF16 || w.data.dtype() == DType::kF16,
                      "dense weight ", w.name, " has dtype ", dtype_name(w.data.dtype()));
            break;
        case WeightFormat::kFp8Block:
            d.format = 1;
            d.scale_f32 = w.scale.dtype() == DType::kF32;
            d.scale_cols = w.scale.dim(1);
            break;
        case WeightFormat::kFp4Group:
            d.format = 2;
            d.scale_cols = w.scale.dim(1);
            break;
    }
    return d;
}

}  // namespace cuda

namespace {

using cuda::WeightDesc;

cuda::HcDesc describe(const HcParams& p) {
    return cuda::HcDesc{p.fn, p.base, p.scale, p.n, p.sinkhorn_iters, p.hc_eps, p.norm_eps};
}

// The experts that have rows, dealt to at most `lanes` lanes so that the lanes' rows balance: the largest first,
// each to the lane with the fewest rows so far (the lower lane on ties). Every lane dealt to gets an expert, and
// its first is its widest.
std::vector<std::vector<int>> deal_experts(const std::vector<int64_t>& counts, int lanes) {
    std::vector<int> order;
    for (int e = 0; e < static_cast<int>(counts.size()); ++e)
        if (counts[e] > 0) order.push_back(e);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return counts[a] > counts[b]; });
    std::vector<std::vector<int>> dealt(std::min(order.size(), static_cast<size_t>(lanes)));
    std::vector<int64_t> rows(dealt.size(), 0);
    for (int e : order) {
        const size_t lane = std::min_element(rows.begin(), rows.end()) - rows.begin();
        dealt[lane].push_back(e);
        rows[lane] += counts[e];
    }
    return dealt;
}

// f(lane, expert) for every dealt expert, round-robin over the lanes (each lane's first, then each one's second,
// ...): issued in this order, every lane has work queued while the host issues the rest.
template <class F>
void round_robin(const std::vector<std::vector<int>>& dealt, F f) {
    size_t longest = 0;
    for (const std::vector<int>& experts : dealt) longest = std::max(longest, experts.size());
    for (size_t i = 0; i < longest; ++i)
        for (size_t lane = 0; lane < dealt.size(); ++lane)
            if (i < dealt[lane].size()) f(static_cast<int>(lane), dealt[lane][i]);
}

class CudaBackend final : public Backend {
public:
    CudaBackend(int device, int host_threads) : device_(device), pool_(host_threads) {
        // DEEPINFER_CUDA_GEMM picks the kernel of the products that the GEMV does not take (see matmul()):
        // auto (default): cuBLAS from cuda::kCublasMinRows rows, else tc; cublas: always cuBLAS; tc: our bf16
        // tensor-core kernel; tiled: fp32 SIMT (~1e-6 of the CPU). auto, cublas and tc compute from bf16 inputs
        // (the GPU bound of the tolerance table), and so does their sparse_attention (tensor cores; tiled keeps
        // the fp32 kernel). In auto mode the products of quantized activations (quantized_linears) take FP8
        // cuBLASLt from kCublasMinRows rows (fp8_products()).
        // DEEPINFER_CUDA_EXPERT_LANES: grouped_experts' side streams (default kExpertLanes; 1 runs the experts one
        // after the other).
        if (const char* lanes = std::getenv("DEEPINFER_CUDA_EXPERT_LANES"); lanes && *lanes) {
            expert_lanes_count_ = std::atoi(lanes);
            DI_CHECK(expert_lanes_count_ >= 1 && expert_lanes_count_ <= 16,
                     "DEEPINFER_CUDA_EXPERT_LANES must be 1 to 16, not '", lanes, "'");
        }
        const char* gemm = std::getenv("DEEPINFER_CUDA_GEMM");
        const std::string mode = gemm && *gemm ? gemm : "auto";
        DI_CHECK(mode == "auto" || mode == "cublas" || mode == "tc" || mode == "tiled",
                 "DEEPINFER_CUDA_GEMM must be auto, cublas, tc or tiled, not '", mode, "'");
        gemm_mode_ = mode == "auto"     ? GemmMode::kAuto
                     : mode == "cublas" ? GemmMode::kCublas
                     : mode == "tc"     ? GemmMode::kTc
                                        : GemmMode::kTiled;
        // DEEPINFER_CUDA_DECODE_EXPERTS: routed_experts on the fused wgmma kernels where they apply (wgmma, the
        // default) or always as expert_linear x 3 + swiglu (linear).
        const char* decode = std::getenv("DEEPINFER_CUDA_DECODE_EXPERTS");
        const std::string decode_mode = decode && *decode ? decode : "wgmma";
        DI_CHECK(decode_mode == "wgmma" || decode_mode == "linear",
                 "DEEPINFER_CUDA_DECODE_EXPERTS must be wgmma or linear, not '", decode_mode, "'");
        decode_experts_wgmma_ = decode_mode == "wgmma";
        // DEEPINFER_CUDA_HC_POST_MIX=1: hc_post_pre_norm's expand made by the mix's tensor-core dots (off by default)
        const char* post_mix = std::getenv("DEEPINFER_CUDA_HC_POST_MIX");
        const std::string post_mix_mode = post_mix && *post_mix ? post_mix : "0";
        DI_CHECK(post_mix_mode == "0" || post_mix_mode == "1", "DEEPINFER_CUDA_HC_POST_MIX must be 0 or 1, not '",
                 post_mix_mode, "'");
        hc_post_mix_ = post_mix_mode == "1";
        // DEEPINFER_CUDA_DECODE_GEMV: FP8 products of 2..128 rows on the wgmma GEMV where it applies (wgmma, the
        // default), or those of 2..32 rows on the mma.sync GEMV and the larger ones on the GEMM kernels (tc).
        const char* gemv = std::getenv("DEEPINFER_CUDA_DECODE_GEMV");
        const std::string gemv_mode = gemv && *gemv ? gemv : "wgmma";
        DI_CHECK(gemv_mode == "wgmma" || gemv_mode == "tc", "DEEPINFER_CUDA_DECODE_GEMV must be wgmma or tc, not '",
                 gemv_mode, "'");
        decode_gemv_wgmma_ = gemv_mode == "wgmma";
        // DEEPINFER_CUDA_FP8_GEMM: the products of quantized activations on cuBLASLt's FP8 GEMM where it applies
        // (1, the default; fp8_products()), or on the bf16 kernels from the quantized activations (0).
        const char* fp8 = std::getenv("DEEPINFER_CUDA_FP8_GEMM");
        const std::string fp8_mode = fp8 && *fp8 ? fp8 : "1";
        DI_CHECK(fp8_mode == "0" || fp8_mode == "1", "DEEPINFER_CUDA_FP8_GEMM must be 0 or 1, not '", fp8_mode, "'");
        fp8_gemm_ = fp8_mode == "1";
        // DEEPINFER_CUDA_BLOCK_CACHE_MB: how much freed tensor memory the host-side block cache keeps for reuse
        // (default 1024; 0: every alloc and free goes to the stream-ordered allocator).
        size_t cache_mb = 1024;
        if (const char* mb = std::getenv("DEEPINFER_CUDA_BLOCK_CACHE_MB"); mb && *mb) {
            char* end = nullptr;
            const long long v = std::strtoll(mb, &end, 10);
            DI_CHECK(*end == '\0' && v >= 0 && v <= (1 << 20),
                     "DEEPINFER_CUDA_BLOCK_CACHE_MB must be 0 to 1048576, not '", mb, "'");
            cache_mb = static_cast<size_t>(v);
        }
        DI_CUDA_CHECK(cudaSetDevice(device_));
        DI_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
        main_lane_.device = device_;
        main_lane_.stream = stream_;
        // Keep freed blocks in the stream-ordered pool instead of returning them to the driver.
        cudaMemPool_t pool;
        DI_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device_));
        uint64_t threshold = UINT64_MAX;
        DI_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
        void* staging = nullptr;
        DI_CUDA_CHECK(cudaHostAlloc(&staging, kStagingBytes, cudaHostAllocDefault));
        staging_ = static_cast<uint8_t*>(staging);
        DI_CUDA_CHECK(cudaEventCreateWithFlags(&downloads_done_, cudaEventDisableTiming));
        profiler_ = std::make_unique<cuda::OpProfiler>(stream_);
        blocks_ = new cuda::BlockCache(cache_mb << 20, kCachedBlockMax);  // detached, not deleted, by ~CudaBackend
        blocks_->set_current_stream(&stream_);
    }
    ~CudaBackend() override {
        side_fork_.reset();  // joins a side queue left forked
        use_lane(main_lane_);
        cudaStreamSynchronize(stream_);
        blocks_->release_all();  // while the side streams the blocks were freed on exist
        side_.reset();
        expert_lanes_.reset();      // joined into stream_: idle
        main_lane_.release_handles();  // before its stream goes
        expert_tables_.clear();     // their memory goes back on the stream
        wgmma_tables_.clear();
        fp8_experts_tables_.clear();
        cudaStreamSynchronize(stream_);
        cuda::BlockCache::detach(blocks_);  // tensors still alive (a model's weights) free themselves later
        profiler_.reset();
        cudaStreamDestroy(stream_);
        cudaFreeHost(staging_);
        cudaEventDestroy(downloads_done_);
        if (pending_buf_) cudaFreeHost(pending_buf_);
    }

    std::string name() const override { return "cuda:" + std::to_string(device_); }
    bool is_host() const override { return false; }
    ThreadPool& pool() override { return pool_; }
    // Every kernel is row-independent; invariant mode also fixes the matmul kernel (see matmul()).
    void set_batch_invariant(bool on) override { batch_invariant_ = on; }
    bool batch_invariant() const override { return batch_invariant_; }

    Tensor alloc(DType dtype, Shape shape) override {
        const size_t bytes = std::max<size_t>(TensorView(nullptr, dtype, shape).nbytes(), 1);
        const auto host = profiler_->host_scope("alloc (between ops)");
        void* p = blocks_->take(bytes, stream_);
        return Tensor::adopt(p, dtype, shape, &cuda::BlockCache::release, blocks_);
    }
    // Small uploads (the per-step index arrays) are copied into a pinned staging arena and queued without
    // waiting, so they overlap the kernels already queued; the arena is recycled whenever the stream has
    // drained. Large ones (weights) go straight from the caller's memory and are waited for. Either way
    // the caller may reuse src as soon as this returns.
    void upload(TensorView dst, const void* src) override {
        DI_ICHECK(!side_open_, "upload: not on the side queue");
        const size_t n = dst.nbytes();
        if (n == 0) return;
        std::lock_guard<std::mutex> lock(staging_mu_);
        const auto op = profiler_->scope("upload");
        if (n > kStagingBytes / 8) {
            DI_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src, n, cudaMemcpyHostToDevice, stream_));
            drain_locked();
            return;
        }
        if (staging_used_ + n > kStagingBytes) drain_locked();  // every staged copy has landed
        uint8_t* p = staging_ + staging_used_;
        std::memcpy(p, src, n);
        staging_used_ += (n + 255) / 256 * 256;
        DI_CUDA_CHECK(cudaMemcpyAsync(dst.data(), p, n, cudaMemcpyHostToDevice, stream_));
    }
    void download(void* dst, TensorView src) override {
        DI_ICHECK(!side_open_, "download: not on the side queue");
        {
            std::lock_guard<std::mutex> lock(staging_mu_);
            const auto op = profiler_->scope("download");
            DI_CUDA_CHECK(cudaMemcpyAsync(dst, src.data(), src.nbytes(), cudaMemcpyDeviceToHost, stream_));
        }
        synchronize();
    }
    // Copies into a pinned buffer (so the copy is asynchronous), moved to dst by wait_downloads().
    void download_async(void* dst, TensorView src) override {
        DI_ICHECK(!side_open_, "download_async: not on the side queue");
        const size_t n = src.nbytes();
        if (n == 0) return;
        std::lock_guard<std::mutex> lock(staging_mu_);
        const auto op = profiler_->scope("download");
        if (pending_used_ + n > pending_capacity_) {
            finish_downloads_locked();  // the pending copies land in the old buffer first
            if (pending_buf_) DI_CUDA_CHECK(cudaFreeHost(pending_buf_));
            pending_capacity_ = std::max(n, 2 * pending_capacity_);
            void* p = nullptr;
            DI_CUDA_CHECK(cudaHostAlloc(&p, pending_capacity_, cudaHostAllocDefault));
            pending_buf_ = static_cast<uint8_t*>(p);
        }
        uint8_t* p = pending_buf_ + pending_used_;
        DI_CUDA_CHECK(cudaMemcpyAsync(p, src.data(), n, cudaMemcpyDeviceToHost, stream_));
        DI_CUDA_CHECK(cudaEventRecord(downloads_done_, stream_));
        pending_.push_back({dst, p, n});
        pending_used_ += (n + 255) / 256 * 256;
    }
    void wait_downloads() override {
        std::lock_guard<std::mutex> lock(staging_mu_);
        finish_downloads_locked();
    }
    // The side queue (Backend::side_begin): while it is open, stream_ and lane_ are its lane's, so that every op
    // issues there as it would on the main stream; it forks from the main stream's work so far and joins back
    // with an event. With the profiler on, the ops stay on the main stream (its per-op times assume one queue).
    void side_begin() override {
        DI_ICHECK(!side_open_ && !side_fork_, "side_begin: a side queue is open or not joined");
        side_open_ = true;
        if (profiler_->enabled()) return;
        if (!side_) side_ = std::make_unique<cuda::SideLanes>(device_, 1);
        side_fork_.emplace(*side_, stream_, 1);
        use_lane((*side_)[0]);
    }
    void side_end() override {
        DI_ICHECK(side_open_, "side_end: no side queue is open");
        side_open_ = false;
        use_lane(main_lane_);
    }
    void side_join() override {
        DI_ICHECK(!side_open_, "side_join: the side queue is still open");
        if (side_fork_) side_fork_->join();
        side_fork_.reset();
    }
    void synchronize() override {
        std::lock_guard<std::mutex> lock(staging_mu_);
        drain_locked();
        finish_downloads_locked();
    }
    std::string take_profile() override {
        synchronize();
        return profiler_->take_report();
    }

    void linear(TensorView out, TensorView x, const LinearWeight& w) override { linear_on(*lane_, out, x, w); }
    void linear_on(cuda::Lane& lane, TensorView out, TensorView x, const LinearWeight& w) {
        const int64_t t = x.dim(0);
        DI_ICHECK(x.ndim() == 2 && x.dim(1) == w.cols && out.numel() == t * w.rows, "linear ", w.name);
        matmul(lane, out.f32(), w.rows, x.f32(), w.cols, t, cuda::describe_weight(w), 0, w.rows);
    }
    // A bf16 x goes to cuBLAS as it is (takes_bf16_inputs); an f32 x that cuBLAS takes is converted once for all
    // groups, so that both forms make the same calls (the conversion a launch instead of one per group; its scratch,
    // [T, groups x K] bf16, half of x, where each group's run() would take an eighth of it at 8 groups).
    void grouped_linear(TensorView out, TensorView x, const LinearWeight& w, int groups) override {
        const int64_t t = x.dim(0), r = w.rows / groups, k = w.cols;
        DI_ICHECK(w.rows % groups == 0 && x.numel() == t * groups * k && out.numel() == t * w.rows, "grouped_linear");
        const WeightDesc d = cuda::describe_weight(w);
        const bool bf16 = x.dtype() == DType::kBF16;
        DI_CHECK(!bf16 || takes_bf16_inputs(t, w), "grouped_linear ", w.name, ": a bf16 input at ", t,
                 " rows, which this product does not take");
        if (bf16 || (on_cublas(t, d) && k % 8 == 0)) {
            const auto op = scope(*lane_, "matmul cublas");
            Tensor converted;  // groups x K is a multiple of 8: the copy is unpadded, groups k apart as in x
            if (!bf16) converted = bf16_copy(x.reshape(Shape{t, groups * k}));
            const uint16_t* xb = bf16 ? x.as<uint16_t>() : converted.as<uint16_t>();
            for (int g = 0; g < groups; ++g)
                lane_->gemm().run_bf16(out.f32() + g * r, w.rows, xb + g * k, groups * k, t, d, g * r, r);
            return;
        }
        if (gemv_for(t, d) != Gemv::kNone) {  // the groups in one launch
            std::vector<cuda::GemvJob> jobs;
            for (int g = 0; g < groups; ++g)
                jobs.push_back({out.f32() + g * r, w.rows, x.f32() + g * k, groups * k, d, g * r, r});
            gemv_jobs(jobs.data(), jobs.size(), t, *lane_);
            return;
        }
        for (int g = 0; g < groups; ++g)
            matmul(*lane_, out.f32() + g * r, w.rows, x.f32() + g * k, groups * k, t, d, g * r, r);
    }
    // The projections a GEMV takes share its launches (gemv_jobs()); those cuBLAS takes share one bf16 copy of x
    // (CublasGemm::run_bf16 from the packed copy run() would make: the same calls) and may write BF16 outs
    // (takes_bf16_inputs); the others run as linear() runs them.
    void linears(TensorView x, const std::vector<Projection>& projections) override {
        const int64_t t = x.dim(0);
        std::vector<cuda::GemvJob> jobs;
        std::vector<const Projection*> on_blas;
        for (const Projection& p : projections) {
            DI_ICHECK(x.ndim() == 2 && x.dim(1) == p.w->cols && p.out.numel() == t * p.w->rows, "linears ",
                      p.w->name);
            const WeightDesc d = cuda::describe_weight(*p.w);
            DI_CHECK(p.out.dtype() == DType::kF32 || (p.out.dtype() == DType::kBF16 && on_cublas(t, d)), "linears ",
                     p.w->name, ": a ", dtype_name(p.out.dtype()), " output at ", t, " rows, which it cannot write");
            if (gemv_for(t, d) != Gemv::kNone)
                jobs.push_back({p.out.f32(), p.w->rows, x.f32(), p.w->cols, d, 0, p.w->rows});
            else if (on_cublas(t, d))
                on_blas.push_back(&p);
            else
                matmul(*lane_, p.out.f32(), p.w->rows, x.f32(), p.w->cols, t, d, 0, p.w->rows);
        }
        if (!on_blas.empty()) {
            const auto op = scope(*lane_, "matmul cublas");
            const Tensor xb = bf16_copy(x);
            for (const Projection* p : on_blas)
                lane_->gemm().run_bf16(p->out.data(), p->w->rows, xb.as<uint16_t>(), xb.dim(1), t,
                                       cuda::describe_weight(*p->w), 0, p->w->rows, p->out.dtype() == DType::kBF16);
        }
        gemv_jobs(jobs.data(), jobs.size(), t, *lane_);
    }
    // x [T, K] f32 rounded to bf16 into [T, K rounded up to 8] with zeros past K: the copy CublasGemm::run makes,
    // for cuBLAS products that share it (run_bf16).
    Tensor bf16_copy(TensorView x) {
        const int64_t t = x.dim(0), k = x.dim(1), kp = (k + 7) / 8 * 8;
        Tensor xb = alloc(DType::kBF16, Shape{t, kp});
        cuda::launch_to_bf16(xb.as<uint16_t>(), kp, x.f32(), k, t, k, stream_);
        return xb;
    }
    // K a multiple of 8: a grouped input's groups then start 16 bytes apart, as cuBLAS's bf16 operands must.
    bool takes_bf16_inputs(int64_t rows, const LinearWeight& w) const override {
        return w.cols % 8 == 0 && on_cublas(rows, cuda::describe_weight(w));
    }
    void quantized_linears(TensorView x, QuantSim kind, int block,
                           const std::vector<Projection>& projections) override {
        std::vector<Fp8Product> products;
        for (const Projection& p : projections) {
            DI_ICHECK(x.ndim() == 2 && x.dim(1) == p.w->cols && p.out.numel() == x.dim(0) * p.w->rows,
                      "quantized_linears ", p.w->name);
            products.push_back({p.out.f32(), p.w->rows, cuda::describe_weight(*p.w), 0, p.w->rows, 0});
        }
        if (!fp8_products(x, kind, block, x.dim(1), products)) Backend::quantized_linears(x, kind, block, projections);
    }
    void quantized_grouped_linear(TensorView out, TensorView x, QuantSim kind, int block, const LinearWeight& w,
                                  int groups) override {
        DI_ICHECK(groups > 0 && w.rows % groups == 0, "quantized_grouped_linear ", w.name, ": ", groups, " groups");
        const int64_t t = x.dim(0), r = w.rows / groups, k = w.cols;
        DI_ICHECK(x.ndim() == 2 && x.dim(1) == groups * k && out.numel() == t * w.rows, "quantized_grouped_linear ",
                  w.name);
        const WeightDesc d = cuda::describe_weight(w);
        std::vector<Fp8Product> products;
        for (int g = 0; g < groups; ++g) products.push_back({out.f32() + g * r, w.rows, d, g * r, r, g * k});
        if (!fp8_products(x, kind, block, k, products))
            Backend::quantized_grouped_linear(out, x, kind, block, w, groups);
    }
    // A product of quantized activations: out [T, n_out] (row stride ldc) = x[:, x_col0 .. x_col0 + K] . W[w_row0 ..
    // w_row0 + n_out, :]^T.
    struct Fp8Product {
        float* out;
        int64_t ldc;
        WeightDesc w;
        int64_t w_row0, n_out, x_col0;
    };
    // FP8 activations on cuBLASLt (gemm_fp8.h), where the default GEMM mode would take cuBLAS anyway (auto, from
    // kCublasMinRows rows), the quantization is DeepSeek's FP8 one in blocks of 128, and cuBLASLt takes every product
    // (fp8_gemm_applies: FP8 with 128 x 128 scales, as the release checkpoints hold them; Fp8Gemm::supports). x [T,
    // cols] goes to e4m3 codes and scales, then the products from them; cuBLASLt takes a multiple of 4 rows, so the
    // last T % 4 rows take matmul() (their GEMV) from a quantized copy. Each product's K is `group_cols`, its columns
    // of x from x_col0. False, with nothing done, where it does not apply.
    bool fp8_products(TensorView x, QuantSim kind, int block, int64_t group_cols, const std::vector<Fp8Product>& ps) {
        const int64_t t = x.dim(0), cols = x.ndim() == 2 ? x.dim(1) : 0, t4 = t / 4 * 4;
        bool applies = !ps.empty() && group_cols > 0 && fp8_gemm_ && kind == QuantSim::kFp8Ue8m0 && block == 128 &&
                       !batch_invariant_ && gemm_mode_ == GemmMode::kAuto && t >= cuda::kCublasMinRows &&
                       x.ndim() == 2 && cols % group_cols == 0 && group_cols % 128 == 0 && cuda::aligned16(x.f32());
        for (const Fp8Product& p : ps)
            applies = applies && cuda::fp8_gemm_applies(p.w) && p.w.cols == group_cols && p.w_row0 % 128 == 0 &&
                      p.n_out % 128 == 0 && p.x_col0 % 128 == 0;
        if (!applies) return false;
        Tensor xq = alloc(DType::kU8, Shape{t4, cols});
        Tensor sx = alloc(DType::kF32, Shape{cols / 128, t4});
        cuda::Fp8Gemm& gemm = lane_->fp8_gemm();
        for (const Fp8Product& p : ps)
            if (!gemm.supports(p.out, p.ldc, xq.as<uint8_t>() + p.x_col0, cols, t4, p.w, p.w_row0, p.n_out))
                return false;
        {
            const auto op = scope(*lane_, "quantize fp8 activations");
            cuda::launch_quantize_fp8_rows(x.f32(), xq.as<uint8_t>(), sx.f32(), t4, cols, stream_);
        }
        {
            const auto op = scope(*lane_, "matmul fp8 cublaslt");
            for (const Fp8Product& p : ps)
                gemm.run(p.out, p.ldc, xq.as<uint8_t>() + p.x_col0, cols, sx.f32() + p.x_col0 / 128 * t4, t4, p.w,
                         p.w_row0, p.n_out);
        }
        if (t4 < t) {  // the last rows quantized in a copy, on matmul() (their GEMV)
            const Tensor tail =
                quantized_copy(TensorView(x.f32() + t4 * cols, DType::kF32, Shape{t - t4, cols}), kind, block);
            for (const Fp8Product& p : ps)
                matmul(*lane_, p.out + t4 * p.ldc, p.ldc, tail.f32() + p.x_col0, cols, t - t4, p.w, p.w_row0, p.n_out);
        }
        return true;
    }
    // The weight-streaming GEMV a product of `rows` rows takes, if any (else matmul()'s GEMM kernels).
    enum class Gemv { kNone, kFp32, kTc, kWgmma, kFp8Mma };
    Gemv gemv_for(int64_t rows, const WeightDesc& d) const {
        if (fp8_mma_gemv(rows, d)) return Gemv::kFp8Mma;
        if (wgmma_gemv(rows, d)) return Gemv::kWgmma;
        if (tc_gemv(rows, d)) return Gemv::kTc;
        if (fp32_gemv(rows, d)) return Gemv::kFp32;
        return Gemv::kNone;
    }
    // Products that each take a GEMV (gemv_for()), on `lane`: each run of consecutive jobs on one GEMV shares
    // launches (the kernels group them further by weight kind and K).
    void gemv_jobs(const cuda::GemvJob* jobs, size_t count, int64_t t, cuda::Lane& lane) {
        Gemv g = count ? gemv_for(t, jobs[0].w) : Gemv::kNone;
        for (size_t i = 0; i < count;) {
            DI_ICHECK(g != Gemv::kNone, "gemv_jobs: a product no GEMV takes");
            size_t end = i + 1;
            Gemv next = Gemv::kNone;  // the kind of the job after the run
            while (end < count && (next = gemv_for(t, jobs[end].w)) == g) ++end;
            const int n = static_cast<int>(end - i);
            if (g == Gemv::kFp32) {
                const auto op = scope(lane, t == 1 ? "matmul gemv 1 row" : "matmul gemv 2-8 rows");
                cuda::launch_gemv_jobs(jobs + i, n, t, lane.stream);
            } else if (g == Gemv::kFp8Mma) {
                const auto op = scope(lane, "matmul gemv fp8 mma 1-4 rows");
                cuda::launch_gemv_fp8_mma_jobs(jobs + i, n, t, lane.stream);
            } else {
                tc_gemv_launch(jobs + i, n, t, g == Gemv::kWgmma, lane);
            }
            i = end;
            g = next;
        }
    }
    // The tensor-core GEMV's jobs on `lane`: the wgmma kernel (wgmma_gemv()) or the mma.sync one.
    void tc_gemv_launch(const cuda::GemvJob* jobs, int count, int64_t t, bool wgmma, cuda::Lane& lane) {
        if (wgmma) {
            const auto op = scope(lane, t <= 32 ? "matmul gemv wgmma 2-32 rows" : "matmul gemv wgmma 33-128 rows");
            cuda::launch_gemv_wgmma_jobs(jobs, count, t, lane.stream);
        } else {
            const auto op =
                scope(lane, t <= 16 ? "matmul gemv tensor cores 2-16 rows" : "matmul gemv tensor cores 17-32 rows");
            cuda::launch_gemv_tc_jobs(jobs, count, t, lane.stream);
        }
    }
    // FP8 products of the tensor-core GEMV on the wgmma kernel (gemv_wgmma.cu) where it applies, unless
    // DEEPINFER_CUDA_DECODE_GEMV=tc: the same numerics (bf16 activations and weights, fp32 sums) in another order.
    // 33..128 rows too in the auto and tc modes (a launch per 64 rows), where the products would otherwise take the
    // mma.sync GEMM (33..127 rows) or dequantize the whole weight for cuBLAS (from kCublasMinRows).
    bool wgmma_gemv(int64_t rows, const WeightDesc& d) const {
        const bool mode = rows <= 32
                              ? tc_gemv(rows, d)
                              : !batch_invariant_ && (gemm_mode_ == GemmMode::kAuto || gemm_mode_ == GemmMode::kTc);
        return decode_gemv_wgmma_ && mode && cuda::gemv_wgmma_applies(rows, d);
    }
    // FP8 products of 2..cuda::kGemvFp8MmaMaxRows rows on the FP8 tensor cores (gemv_fp8_mma.cu) where the
    // tensor-core GEMVs would take them, unless DEEPINFER_CUDA_GEMV_FP8_MMA=0 (read per call; 1 also takes one row,
    // which otherwise stays on the fp32 GEMV). The bf16 GEMVs' numerics but for the FP8 tensor cores' sums inside a
    // 128-k block (~1e-6 relative). H200, 8-layer decode step, one process alternating (step_bench --variants;
    // bench/results/decode_gemv_experiments_2026-12-03d.txt): batch 2 2.09 / 2.10 ms against 2.21 / 2.22, batch 4
    // 2.56 / 2.57 against 2.65 / 2.66; at batch 1 1.69 / 1.69 against 1.68 / 1.69 (so not by default there).
    bool fp8_mma_gemv(int64_t rows, const WeightDesc& d) const {
        if (rows > cuda::kGemvFp8MmaMaxRows || !cuda::gemv_fp8_mma_applies(rows, d)) return false;
        const char* v = std::getenv("DEEPINFER_CUDA_GEMV_FP8_MMA");
        const bool one_row = v && !std::strcmp(v, "1");
        if (v && *v) {
            DI_CHECK(!std::strcmp(v, "0") || one_row, "DEEPINFER_CUDA_GEMV_FP8_MMA must be 0 or 1, not '", v, "'");
            if (!one_row) return false;
        }
        if (rows == 1)
            return one_row && !batch_invariant_ && gemm_mode_ != GemmMode::kTiled && cuda::gemv_applies(1, d);
        return tc_gemv(rows, d);
    }
    // 2..32 rows go to the tensor-core GEMV where the GEMM mode computes from bf16 inputs anyway; one row stays
    // on the fp32 GEMV (memory-bound either way, and exact). Batch-invariant mode takes neither (see matmul()).
    bool tc_gemv(int64_t rows, const WeightDesc& d) const {
        return !batch_invariant_ && gemm_mode_ != GemmMode::kTiled && !wide_bf16_on_cublas(rows, d) &&
               cuda::gemv_tc_applies(rows, d);
    }
    // Wide BF16 weights (the head) on cuBLAS from 2 rows in the default mode (see kCublasBf16MinFeatures).
    bool wide_bf16_on_cublas(int64_t rows, const WeightDesc& d) const {
        return !batch_invariant_ && gemm_mode_ == GemmMode::kAuto && rows >= 2 && d.format == 0 && d.dtype == 1 &&
               d.rows >= cuda::kCublasBf16MinFeatures;
    }
    // The routed experts (expert_linear) on the tensor cores where the GEMM mode computes from bf16 inputs: always
    // in tc and batch-invariant modes (its per-row sums do not depend on the other rows, so a row's result then
    // never depends on the batch), in auto and cublas modes only for more than cuda::kExpertTcMinRows rows: below,
    // few rows share an expert and the fp32 kernel streams the weights faster (H200, 8-layer V4-Flash decode:
    // 21.9 vs 30.0 us a call at batch 1, 104 vs 148 at batch 8; 292 vs 218 at batch 32).
    bool tc_experts(int64_t rows) const {
        if (gemm_mode_ == GemmMode::kTiled) return false;
        return gemm_mode_ == GemmMode::kTc || batch_invariant_ || rows > cuda::kExpertTcMinRows;
    }
    bool fp32_gemv(int64_t rows, const WeightDesc& d) const {
        return !batch_invariant_ && !tc_gemv(rows, d) && !wide_bf16_on_cublas(rows, d) && cuda::gemv_applies(rows, d);
    }
    // Few rows: the weight-streaming GEMVs (tc_gemv(), its FP8 products on wgmma: wgmma_gemv(); fp32_gemv()); else,
    // by DEEPINFER_CUDA_GEMM, cuBLAS (from kCublasMinRows rows in auto mode, where dequantizing the weight to bf16
    // first pays off, and for wide BF16 weights from 2 rows: wide_bf16_on_cublas()), our tensor-core kernel or the
    // exact fp32 tiled kernel. Batch-invariant mode keeps one kernel for every row count, so that a row's result
    // never depends on how many rows share the step: the tensor-core kernel without split-K (its per-output reduction
    // order then depends only on K) in every mode but tiled (likewise), since cuBLAS picks its algorithm per shape.
    // The kernels go to `lane`: the kernel choice, and so the result, does not depend on it.
    void matmul(cuda::Lane& lane, float* out, int64_t ldc, const float* x, int64_t lda, int64_t rows,
                const WeightDesc& d, int64_t w_row0, int64_t n_out) {
        const bool cublas = cublas_mode(rows, d);
        if (gemv_for(rows, d) != Gemv::kNone) {
            const cuda::GemvJob job{out, ldc, x, lda, d, w_row0, n_out};
            gemv_jobs(&job, 1, rows, lane);
        } else if (gemm_mode_ == GemmMode::kTiled) {
            const auto op = scope(lane, "matmul tiled");
            cuda::launch_gemm(out, ldc, x, lda, rows, d, w_row0, n_out, lane.stream);
        } else if (cublas) {
            cuda::CublasGemm& gemm = lane.gemm();
            const auto op = scope(lane, "matmul cublas");
            gemm.run(out, ldc, x, lda, rows, d, w_row0, n_out);
        } else {
            const auto op = scope(lane, "matmul tensor cores");
            cuda::launch_gemm_tc(out, ldc, x, lda, rows, d, w_row0, n_out, !batch_invariant_, lane.stream);
        }
    }
    bool cublas_mode(int64_t rows, const WeightDesc& d) const {
        return !batch_invariant_ && (gemm_mode_ == GemmMode::kCublas || wide_bf16_on_cublas(rows, d) ||
                                     (gemm_mode_ == GemmMode::kAuto && rows >= cuda::kCublasMinRows));
    }
    // Whether matmul() hands a product of `rows` rows with d to cuBLAS.
    bool on_cublas(int64_t rows, const WeightDesc& d) const {
        return gemv_for(rows, d) == Gemv::kNone && gemm_mode_ != GemmMode::kTiled && cublas_mode(rows, d);
    }
    // The profiler's scope of an op issued on `lane`. The profiler times ops on the backend's stream, so work on a
    // side lane is timed only as part of the op that forked it.
    cuda::OpProfiler::Scope scope(const cuda::Lane& lane, const char* name) {
        if (lane.stream != stream_) return cuda::OpProfiler::Scope(nullptr, name, nullptr);
        return profiler_->scope(name);
    }
    void embedding(TensorView out, const LinearWeight& table, const int32_t* ids) override {
        const auto op = profiler_->scope("embedding");
        cuda::launch_embedding(out.f32(), cuda::describe_weight(table), ids, out.dim(0), stream_);
    }
    void rms_norm(TensorView out, TensorView x, const float* weight, float eps) override {
        const auto op = profiler_->scope("rms_norm");
        const int64_t c = x.dim(-1);
        cuda::launch_rms_norm(out.f32(), x.f32(), weight, x.numel() / c, c, eps, batch_invariant_, stream_);
    }
    void rope(TensorView x, const int32_t* positions, const float* inv_freq, int rope_dim, float attention_factor,
              bool inverse) override {
        const auto op = profiler_->scope("rope");
        cuda::launch_rope(x.f32(), positions, inv_freq, x.dim(0), x.dim(1), x.dim(2), rope_dim, attention_factor,
                          inverse, stream_);
    }
    void rms_norm_rope(TensorView x, const float* weight, float eps, const int32_t* positions, const float* inv_freq,
                       int rope_dim, float attention_factor) override {
        DI_ICHECK(x.ndim() == 3, "rms_norm_rope: x must be [T, heads, head_dim]");
        if (!cuda::rms_norm_rope_applies(x.f32(), weight, x.dim(0), x.dim(1), x.dim(2), rope_dim, batch_invariant_)) {
            Backend::rms_norm_rope(x, weight, eps, positions, inv_freq, rope_dim, attention_factor);
            return;
        }
        const auto op = profiler_->scope("rms_norm_rope");
        cuda::launch_rms_norm_rope(x.f32(), weight, eps, positions, inv_freq, x.dim(0), x.dim(1), x.dim(2), rope_dim,
                                   attention_factor, batch_invariant_, stream_);
    }
    void hc_pre(TensorView collapsed, TensorView post, TensorView comb, TensorView streams,
                const HcParams& p) override {
        Tensor pre = alloc(DType::kF32, Shape{streams.dim(0), p.n});
        hc_mix(pre, post, comb, streams, p);
        hc_collapse(collapsed, streams, pre);
    }
    // The collapse and the norm in one kernel where it applies (the same arithmetic as hc_collapse + rms_norm); for
    // a few tokens, with the mix's finish in that launch too (launch_hc_pre_norm_fused).
    void hc_pre_norm(TensorView normed, TensorView post, TensorView comb, TensorView streams, const HcParams& p,
                     const float* norm_weight, float eps) override {
        const int64_t t = streams.dim(0), d = streams.dim(2);
        DI_ICHECK(streams.ndim() == 3 && streams.dim(1) == p.n && normed.numel() == t * d, "hc_pre_norm shapes");
        if (!cuda::hc_collapse_norm_applies(p.n, d, normed.f32(), streams.f32(), norm_weight)) {
            Backend::hc_pre_norm(normed, post, comb, streams, p, norm_weight, eps);
            return;
        }
        if (cuda::hc_pre_norm_fused_applies(p.n, t, d, normed.f32(), streams.f32(), norm_weight)) {
            const auto op = profiler_->scope("hc_pre_norm");
            cuda::launch_hc_pre_norm_fused(normed.f32(), post.f32(), comb.f32(), streams.f32(), t, d, hc_describe(p),
                                           norm_weight, eps, stream_);
            return;
        }
        Tensor pre = alloc(DType::kF32, Shape{t, p.n});
        hc_mix(pre, post, comb, streams, p);
        const auto op = profiler_->scope("hc_collapse_norm");
        cuda::launch_hc_collapse_norm(normed.f32(), streams.f32(), pre.f32(), norm_weight, t, p.n, d, eps, stream_);
    }
    void hc_mix(TensorView pre, TensorView post, TensorView comb, TensorView streams, const HcParams& p) override {
        const auto op = profiler_->scope("hc_mix");
        cuda::launch_hc_mix(pre.f32(), post.f32(), comb.f32(), streams.f32(), streams.dim(0), streams.dim(2),
                            hc_describe(p), stream_);
    }
    void hc_collapse(TensorView collapsed, TensorView streams, TensorView pre) override {
        const auto op = profiler_->scope("hc_collapse");
        cuda::launch_hc_collapse(collapsed.f32(), streams.f32(), pre.f32(), streams.dim(0), streams.dim(1),
                                 streams.dim(2), stream_);
    }
    void hc_post(TensorView out, TensorView y, TensorView post, TensorView comb, TensorView streams) override {
        const auto op = profiler_->scope("hc_post");
        cuda::launch_hc_post(out.f32(), y.f32(), post.f32(), comb.f32(), streams.f32(), streams.dim(0), streams.dim(1),
                             streams.dim(2), stream_);
    }
    // Up to 64 tokens, the expand made by the few-token mix dots as they stage it (hc_post_dots). Above that, with
    // DEEPINFER_CUDA_HC_POST_MIX=1, the expand made by the mix's tensor-core dots as they load it
    // (launch_hc_post_mix: bitwise hc_post then hc_pre_norm, with one read of the new streams fewer) where that
    // applies. Off by default: slower so far (1.39 against 1.28 ms a call at 16K tokens; hc_dots_tc.cu says why).
    void hc_post_pre_norm(TensorView out, TensorView y, TensorView post, TensorView comb, TensorView streams,
                          TensorView normed, const HcParams& p, const float* norm_weight, float eps) override {
        const cuda::HcDesc desc = hc_describe(p);
        const int64_t t = streams.dim(0), d = streams.ndim() == 3 ? streams.dim(2) : 0;
        const bool shapes = streams.ndim() == 3 && streams.dim(1) == p.n && out.numel() == streams.numel() &&
                            y.numel() == t * d && normed.numel() == t * d;
        if (shapes && hc_post_dots() &&
            cuda::hc_post_pre_norm_fused_applies(p.n, t, d, out.f32(), y.f32(), streams.f32(), normed.f32(),
                                                 norm_weight, desc)) {
            const auto op = profiler_->scope("hc_post_pre_norm");
            cuda::launch_hc_post_pre_norm_fused(normed.f32(), post.f32(), comb.f32(), out.f32(), y.f32(), streams.f32(),
                                                t, d, desc, norm_weight, eps, stream_);
            return;
        }
        if (!hc_post_mix_ || !shapes || !cuda::hc_collapse_norm_applies(p.n, d, normed.f32(), out.f32(), norm_weight) ||
            !cuda::hc_post_mix_applies(t, d, out.f32(), y.f32(), streams.f32(), desc)) {
            Backend::hc_post_pre_norm(out, y, post, comb, streams, normed, p, norm_weight, eps);
            return;
        }
        Tensor pre = alloc(DType::kF32, Shape{t, p.n});
        {
            const auto op = profiler_->scope("hc_post_mix");
            cuda::launch_hc_post_mix(pre.f32(), post.f32(), comb.f32(), out.f32(), y.f32(), streams.f32(), t, d, desc,
                                     stream_);
        }
        const auto op = profiler_->scope("hc_collapse_norm");
        cuda::launch_hc_collapse_norm(normed.f32(), out.f32(), pre.f32(), norm_weight, t, p.n, d, eps, stream_);
    }
    // The few-token expand made by the next mix's dots (launch_hc_post_pre_norm_fused); DEEPINFER_CUDA_HC_POST_DOTS=0
    // keeps hc_post's own launch (read each call, so that one process can time both).
    static bool hc_post_dots() {
        const char* v = std::getenv("DEEPINFER_CUDA_HC_POST_DOTS");
        return !(v && !std::strcmp(v, "0"));
    }
    void hc_head(TensorView out, TensorView streams, const HcParams& p) override {
        const auto op = profiler_->scope("hc_head");
        Tensor pre = alloc(DType::kF32, Shape{streams.dim(0), p.n});
        cuda::launch_hc_head_pre(pre.f32(), streams.f32(), streams.dim(0), streams.dim(2), hc_describe(p), stream_);
        hc_collapse(out, streams, pre);
    }
    // The mix dots of many rows on the 3xTF32 tensor cores (fp32-level accuracy) except in batch-invariant mode
    // (a row's result would depend on the row count) and in tiled mode (the SIMT kernels: fp32 FMAs throughout).
    cuda::HcDesc hc_describe(const HcParams& p) const {
        cuda::HcDesc d = describe(p);
        d.tensor_cores = !batch_invariant_ && gemm_mode_ != GemmMode::kTiled;
        return d;
    }
    void sparse_attention(TensorView out, TensorView q, TensorView keys, const int32_t* offsets,
                          const int32_t* indices, const float* sinks, float scale) override {
        DI_ICHECK(out.shape() == q.shape() && keys.dim(1) == q.dim(2), "sparse_attention shapes");
        if (tc_attention(q.dim(2))) {
            const auto op = profiler_->scope("sparse_attention tensor cores");
            cuda::launch_sparse_attention_tc(out.f32(), q.f32(), keys.f32(), keys.dim(0), offsets, indices, sinks,
                                             q.dim(0), q.dim(1), q.dim(2), scale, batch_invariant_, stream_);
            return;
        }
        const auto op = profiler_->scope("sparse_attention");
        cuda::launch_sparse_attention(out.f32(), q.f32(), keys.f32(), offsets, indices, sinks, q.dim(0), q.dim(1),
                                      q.dim(2), scale, batch_invariant_, stream_);
    }
    // The modes that compute products from bf16 inputs take the tensor-core kernel (bf16 q and keys); tiled, the
    // exact mode, and head dims it does not cover keep the fp32 kernel.
    bool tc_attention(int64_t d) const {
        return gemm_mode_ != GemmMode::kTiled && cuda::sparse_attention_tc_applies(d);
    }
    // Keys by address: where the tensor-core kernel would gather them from a table (decode: most keys serve one
    // row), it reads them in place and the table's copy goes (H200, batch 32: gather_rows 0.36 ms a step); else as
    // the default (prefill stages a bf16 copy of the table; tiled mode keeps the fp32 kernel). The same results.
    void sparse_attention_rows(TensorView out, TensorView q, TensorView key_rows, const int32_t* offsets,
                               const int32_t* indices, const float* sinks, float scale) override {
        const int64_t nkeys = key_rows.numel();
        DI_ICHECK(out.shape() == q.shape() && key_rows.dtype() == DType::kI64, "sparse_attention_rows shapes");
        if (tc_attention(q.dim(2)) && !cuda::sparse_attention_tc_copies_table(nkeys, q.dim(0))) {
            const auto op = profiler_->scope("sparse_attention tensor cores");
            cuda::launch_sparse_attention_tc(out.f32(), q.f32(), nullptr, nkeys, offsets, indices, sinks, q.dim(0),
                                             q.dim(1), q.dim(2), scale, batch_invariant_, stream_,
                                             cuda::AttnKeyStaging::kGather, key_rows.as<const float* const>());
            return;
        }
        Backend::sparse_attention_rows(out, q, key_rows, offsets, indices, sinks, scale);
    }
    // Prefill's wgmma attention norms and rotates the queries as it loads them and rotates the output back as it
    // writes it: q's 2 GB (V4-Flash, 16,384 rows) are read once instead of three times and written not at all.
    // Bitwise the default's three calls (the CUDA op test checks). Elsewhere as the default.
    void rotary_attention_rows(TensorView out, TensorView q, TensorView key_rows, const int32_t* offsets,
                               const int32_t* indices, const float* sinks, float scale,
                               const AttentionRope& rope) override {
        const int64_t nkeys = key_rows.numel(), rows = q.dim(0), heads = q.dim(1), d = q.dim(2);
        DI_ICHECK(out.shape() == q.shape() && key_rows.dtype() == DType::kI64, "rotary_attention_rows shapes");
        const bool bf16 = out.dtype() == DType::kBF16, q_bf16 = q.dtype() == DType::kBF16;
        DI_ICHECK(bf16 || out.dtype() == DType::kF32, "rotary_attention_rows: out must be F32 or BF16");
        DI_ICHECK(!bf16 || ((heads * d) % 8 == 0 && cuda::aligned16(out.data())),
                  "rotary_attention_rows: a bf16 out needs 16-byte aligned rows of a multiple of 8 values");
        DI_ICHECK(q_bf16 || q.dtype() == DType::kF32, "rotary_attention_rows: q must be F32 or BF16");
        if (attention_applies_rope(rows, heads, d, rope.rope_dim) &&
            cuda::sparse_attention_tc_copies_table(nkeys, rows) &&
            cuda::sparse_attention_wgmma_applies(rows, heads, d, batch_invariant_, true, q.data(), out.data())) {
            Tensor keys = alloc(DType::kF32, Shape{nkeys, d});
            gather_rows(keys.view(), key_rows);
            const auto op = profiler_->scope("sparse_attention rotary");  // the norm and both rotations included
            const cuda::AttnRope r{rope.positions, rope.inv_freq, rope.rope_dim, rope.attention_factor,
                                   rope.eps,       bf16,          q_bf16};
            cuda::launch_sparse_attention_tc(out.data(), q.data(), keys.f32(), nkeys, offsets, indices, sinks, rows,
                                             heads, d, scale, batch_invariant_, stream_, cuda::AttnKeyStaging::kTable,
                                             nullptr, &r);
            return;
        }
        if (q_bf16) {  // widened (exactly) for the ops run apart
            const Tensor q32 = alloc(DType::kF32, q.shape());
            {
                const auto op = profiler_->scope("from_bf16");
                cuda::launch_from_bf16(q32.f32(), q.as<uint16_t>(), q.numel(), stream_);
            }
            rotary_attention_rows(out, q32.view(), key_rows, offsets, indices, sinks, scale, rope);
            return;
        }
        if (!bf16) {
            Backend::rotary_attention_rows(out, q, key_rows, offsets, indices, sinks, scale, rope);
            return;
        }
        // The F32 result, then rounded.
        const Tensor o = alloc(DType::kF32, out.shape());
        Backend::rotary_attention_rows(o.view(), q, key_rows, offsets, indices, sinks, scale, rope);
        const int64_t cols = heads * d;
        const auto op = profiler_->scope("to_bf16");
        cuda::launch_to_bf16(out.as<uint16_t>(), cols, o.f32(), cols, rows, cols, stream_);
    }
    // The wgmma kernel's shapes (it takes every call it applies to without splits: it needs a row per SM). The
    // key table's size (prefill's is small against the rows) and the tensors' alignment are checked per call, so a
    // decode batch of a row per SM or more answers true and then norms its queries in the call, just before the
    // attention, instead of on the model's side queue.
    bool attention_applies_rope(int64_t rows, int64_t heads, int64_t head_dim, int rope_dim) const override {
        return tc_attention(head_dim) && cuda::sparse_attention_wgmma_takes_rope(rope_dim) &&
               cuda::sparse_attention_wgmma_applies(rows, heads, head_dim, batch_invariant_, true, nullptr, nullptr);
    }
    void gated_pool(TensorView out, TensorView kv, TensorView gate) override {
        const auto op = profiler_->scope("gated_pool");
        cuda::launch_gated_pool(out.f32(), kv.f32(), gate.f32(), kv.dim(0), kv.dim(1), kv.dim(2), stream_);
    }
    // The indexer's scores on the tensor cores (bf16 q and keys) in the modes that compute products from bf16
    // inputs, batch-invariant mode included (each output's summation order depends only on the head count and c);
    // tiled, the exact mode, and shapes the kernel does not take keep the fp32 kernel. (At one decode row of
    // 1,024 entries the fp32 kernel is faster, 4.5 vs 10.6 us on an H200, but one kernel for every row count
    // keeps a row's scores independent of the batch.)
    bool tc_indexer(TensorView q) const {
        return gemm_mode_ != GemmMode::kTiled && cuda::indexer_scores_tc_applies(q.dim(1), q.dim(2));
    }
    void indexer_scores(TensorView scores, TensorView q, TensorView keys, TensorView weights, float scale) override {
        if (tc_indexer(q)) {
            const auto op = profiler_->scope("indexer_scores tensor cores");
            cuda::launch_indexer_scores_tc(scores.f32(), q.f32(), keys.f32(), weights.f32(), q.dim(0), q.dim(1),
                                           q.dim(2), keys.dim(0), scale, stream_);
            return;
        }
        const auto op = profiler_->scope("indexer_scores");
        cuda::launch_indexer_scores(scores.f32(), q.f32(), keys.f32(), weights.f32(), q.dim(0), q.dim(1), q.dim(2),
                                    keys.dim(0), scale, stream_);
    }
    void indexer_scores_rows(TensorView scores, TensorView q, TensorView keys, TensorView weights,
                             TensorView key_begin, TensorView key_count, float scale) override {
        DI_ICHECK(key_begin.numel() == q.dim(0) && key_count.numel() == q.dim(0) && scores.dim(0) == q.dim(0),
                  "indexer_scores_rows shapes");
        if (tc_indexer(q)) {
            const auto op = profiler_->scope("indexer_scores tensor cores");
            cuda::launch_indexer_scores_tc(scores.f32(), q.f32(), keys.f32(), weights.f32(), q.dim(0), q.dim(1),
                                           q.dim(2), scores.dim(1), scale, stream_, key_begin.as<int32_t>(),
                                           key_count.as<int32_t>(), keys.dim(0));
            return;
        }
        const auto op = profiler_->scope("indexer_scores");
        cuda::launch_indexer_scores(scores.f32(), q.f32(), keys.f32(), weights.f32(), q.dim(0), q.dim(1), q.dim(2),
                                    scores.dim(1), scale, stream_, key_begin.as<int32_t>(), key_count.as<int32_t>());
    }
    void indexer_select_rows(TensorView dst, TensorView starts, TensorView scores, TensorView limits, TensorView bases,
                             int k) override {
        const auto op = profiler_->scope("indexer_select");
        DI_ICHECK(starts.numel() == scores.dim(0) && limits.numel() == scores.dim(0) &&
                      bases.numel() == scores.dim(0) && k >= 0,
                  "indexer_select_rows shapes");
        cuda::launch_indexer_select(dst.as<int32_t>(), starts.as<int32_t>(), scores.f32(), scores.dim(0),
                                    scores.dim(1), limits.as<int32_t>(), k, 0, stream_, bases.as<int32_t>());
    }
    void fill_index_ranges(TensorView dst, TensorView runs) override {
        const auto op = profiler_->scope("fill_index_ranges");
        DI_ICHECK(runs.numel() % 5 == 0 && dst.dtype() == DType::kI32, "fill_index_ranges shapes");
        cuda::launch_fill_index_ranges(dst.as<int32_t>(), dst.numel(), runs.as<const int32_t>(), runs.numel() / 5,
                                       stream_);
    }
    void fill_row_addresses(TensorView dst, TensorView runs) override {
        const auto op = profiler_->scope("fill_row_addresses");
        DI_ICHECK(runs.numel() % 4 == 0 && runs.dtype() == DType::kI64 && dst.dtype() == DType::kI64,
                  "fill_row_addresses shapes");
        cuda::launch_fill_row_addresses(dst.as<int64_t>(), dst.numel(), runs.as<const int64_t>(), runs.numel() / 4,
                                        stream_);
    }
    void argmax_rows(TensorView ids, TensorView logits) override {
        const auto op = profiler_->scope("argmax_rows");
        DI_ICHECK(ids.numel() == logits.dim(0) && logits.dim(1) > 0, "argmax_rows shapes");
        cuda::launch_argmax_rows(ids.as<int32_t>(), logits.f32(), logits.dim(0), logits.dim(1), stream_);
    }
    void sample_rows(TensorView ids, TensorView logits, const std::vector<SampleRow>& rows) override {
        const int64_t n = logits.dim(0);
        DI_ICHECK(ids.numel() == n && static_cast<int64_t>(rows.size()) == n && logits.dim(1) > 0, "sample_rows shapes");
        if (n == 0) return;
        std::vector<cuda::SampleRowDesc> desc;
        for (const SampleRow& o : rows)
            desc.push_back({o.temperature, o.top_p,
                            o.min_p > 0 ? o.temperature * std::log(o.min_p) : -std::numeric_limits<float>::infinity(),
                            o.top_k, o.seed, o.token_index});
        Tensor params = alloc(DType::kU8, Shape{static_cast<int64_t>(desc.size() * sizeof(cuda::SampleRowDesc))});
        upload(params, desc.data());
        const auto op = profiler_->scope("sample_rows");
        cuda::launch_sample_rows(ids.as<int32_t>(), logits.f32(), n, logits.dim(1), params.as<const cuda::SampleRowDesc>(),
                                 stream_);
    }
    void indexer_select(TensorView dst, TensorView starts, TensorView scores, TensorView limits, int k,
                        int32_t base) override {
        const auto op = profiler_->scope("indexer_select");
        DI_ICHECK(starts.numel() == scores.dim(0) && limits.numel() == scores.dim(0) && k >= 0,
                  "indexer_select shapes");
        cuda::launch_indexer_select(dst.as<int32_t>(), starts.as<int32_t>(), scores.f32(), scores.dim(0),
                                    scores.dim(1), limits.as<int32_t>(), k, base, stream_);
    }
    void swiglu(TensorView out, TensorView gate, TensorView up, float limit) override {
        const auto op = profiler_->scope("swiglu");
        cuda::launch_swiglu(out.f32(), gate.f32(), up.f32(), out.numel(), limit, stream_);
    }
    void fake_quantize(TensorView x, QuantSim kind, int block) override {
        const auto op = profiler_->scope("fake_quantize");
        DI_ICHECK(block > 0 && x.dim(-1) % block == 0, "fake_quantize block ", block);
        cuda::launch_fake_quantize(x.f32(), x.numel(), block, static_cast<int>(kind), stream_);
    }

    void gather_rows(TensorView dst, TensorView rows) override {
        const auto op = profiler_->scope("gather_rows");
        const int64_t r = rows.numel();
        cuda::launch_gather_rows(dst.f32(), rows.as<const float* const>(), r, r ? dst.numel() / r : 0, stream_);
    }
    void scatter_rows(TensorView rows, TensorView src) override {
        const auto op = profiler_->scope("scatter_rows");
        const int64_t r = rows.numel();
        cuda::launch_scatter_rows(rows.as<float* const>(), src.f32(), r, r ? src.numel() / r : 0, stream_);
    }
    void copy_rows(TensorView dst_rows, TensorView src_rows, TensorView cols) override {
        const int64_t r = dst_rows.numel();
        DI_ICHECK(src_rows.numel() == r && cols.numel() == r && cols.dtype() == DType::kI32, "copy_rows: ", r,
                  " destinations, ", src_rows.numel(), " sources, ", cols.numel(), " widths");
        const auto op = profiler_->scope("copy_rows");
        cuda::launch_copy_row_pairs(dst_rows.as<float* const>(), src_rows.as<const float* const>(),
                                    cols.as<const int32_t>(), r, stream_);
    }
    void add(TensorView x, TensorView y) override {
        const auto op = profiler_->scope("add");
        cuda::launch_add(x.f32(), y.f32(), x.numel(), stream_);
    }
    void scale(TensorView x, float s) override {
        const auto op = profiler_->scope("scale");
        cuda::launch_scale(x.f32(), s, x.numel(), stream_);
    }
    void copy(TensorView dst, TensorView src) override {
        DI_ICHECK(dst.nbytes() == src.nbytes(), "copy: ", dst.nbytes(), " bytes from ", src.nbytes());
        const auto op = profiler_->scope("copy");
        DI_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), src.nbytes(), cudaMemcpyDeviceToDevice, stream_));
    }
    void moe_combine(TensorView out, TensorView routed, TensorView weights, TensorView shared) override {
        const auto op = profiler_->scope("moe_combine");
        const int64_t t = out.dim(0);
        cuda::launch_moe_combine(out.f32(), routed.f32(), weights.f32(), shared.f32(), t, t ? weights.numel() / t : 0,
                                 out.dim(1), stream_);
    }

    void moe_route(TensorView experts, TensorView weights, TensorView logits, const MoeRouting& r) override {
        const auto op = profiler_->scope("moe_route");
        const int64_t t = logits.dim(0), e = logits.dim(1);
        DI_ICHECK(logits.ndim() == 2 && r.k > 0 && r.k <= e && experts.numel() == t * r.k &&
                      weights.numel() == t * r.k && (!r.tid2eid || r.tokens),
                  "moe_route: logits ", logits.shape().str(), ", k ", r.k, ", experts ", experts.shape().str());
        const cuda::MoeRouteDesc d{r.bias, r.tid2eid, r.tokens, r.vocab, static_cast<int>(r.scoring), r.k,
                                   r.gate_temp, r.routed_scaling};
        cuda::launch_moe_route(experts.as<int32_t>(), weights.f32(), logits.f32(), t, e, d, stream_);
    }
    void expert_linear(TensorView out, TensorView x, TensorView expert_of_row, const std::vector<LinearWeight>& experts,
                       int rows_per_input) override {
        const auto op = profiler_->scope("expert_linear");
        const int64_t r = expert_of_row.numel();
        DI_ICHECK(!experts.empty() && rows_per_input > 0 && x.ndim() == 2 && r % rows_per_input == 0 &&
                      x.dim(0) == r / rows_per_input && x.dim(1) == experts[0].cols &&
                      out.numel() == r * experts[0].rows,
                  "expert_linear: x ", x.shape().str(), ", out ", out.shape().str(), ", ", r, " rows, ",
                  rows_per_input, " per input");
        if (r == 0) return;
        const ExpertTable& table = expert_table(experts);
        const cuda::ExpertLinearDesc d{out.f32(),
                                       x.f32(),
                                       expert_of_row.as<const int32_t>(),
                                       table.device.as<const WeightDesc>(),
                                       r,
                                       experts[0].rows,
                                       experts[0].cols,
                                       static_cast<int>(experts.size()),
                                       rows_per_input};
        cuda::launch_expert_linear(d, table.host[0], table.streams, tc_experts(r), stream_);
    }
    // Decode's routed experts on the fused wgmma kernels with their plan built on the device (experts_wgmma.cu,
    // "Decode") wherever they take the experts, from kRoutedWgmmaMinTokens tokens (moe_forward sends up to
    // kMoeDeviceSlots slots): one expert's weights are read once for all its slots, by an 8-stage asynchronous ring,
    // where expert_linear reads them once per product at 30-45% of the HBM's rate (measured figures at
    // kRoutedWgmmaMinTokens). Up to few_token_experts() tokens (without FP8 activations) each slot runs as its own item
    // on experts_few_tokens.cu's mma.sync kernels instead, with the same table.
    // DEEPINFER_CUDA_DECODE_EXPERTS=linear keeps the default sequence. With FP8 activations (act_block 128) the kernels
    // read a quantized copy of x and quantize h between their two products.
    void routed_experts(TensorView out, TensorView x, TensorView expert_of_row, const std::vector<LinearWeight>& w1,
                        const std::vector<LinearWeight>& w3, const std::vector<LinearWeight>& w2, int rows_per_input,
                        float swiglu_limit, int act_block) override {
        check_act_block(act_block, w1);
        const ExpertTable &t1 = expert_table(w1), &t3 = expert_table(w3), &t2 = expert_table(w2);
        const int64_t tokens = rows_per_input > 0 ? expert_of_row.numel() / rows_per_input : 0;
        const bool enough = tokens >= cuda::kRoutedWgmmaMinTokens;
        const bool few = tokens <= few_token_experts() && act_block == 0 && !w1.empty() &&
                         cuda::routed_experts_few_tokens_applies(w1[0].cols, w1[0].rows) &&
                         reinterpret_cast<uintptr_t>(x.data()) % 16 == 0;
        const void* table =
            decode_experts_wgmma_ && (enough || few) && wgmma_mode() && (act_block == 0 || act_block == 128)
                ? wgmma_table(w1, t1, t3, t2)
                : nullptr;
        if (!table) {
            Backend::routed_experts(out, x, expert_of_row, w1, w3, w2, rows_per_input, swiglu_limit, act_block);
            return;
        }
        const int64_t r = expert_of_row.numel(), d = w1[0].cols;
        DI_ICHECK(rows_per_input > 0 && expert_of_row.dtype() == DType::kI32 && x.ndim() == 2 &&
                      r % rows_per_input == 0 && x.dim(0) == r / rows_per_input && x.dim(1) == d &&
                      out.numel() == r * d,
                  "routed_experts: x ", x.shape().str(), ", out ", out.shape().str(), ", ", r, " rows, ",
                  rows_per_input, " per input");
        if (r == 0) return;
        if (few) {
            const auto op = profiler_->scope("routed_experts few tokens");
            cuda::launch_routed_experts_few_tokens(out.f32(), x.f32(), expert_of_row.as<const int32_t>(), r,
                                                   rows_per_input, table, static_cast<int>(w1.size()), d, w1[0].rows,
                                                   swiglu_limit, stream_);
            return;
        }
        // FP8 activations: the kernels read a quantized copy of x and quantize h themselves (quantize_h).
        const Tensor xq = act_block > 0 ? quantized_copy(x, QuantSim::kFp8Ue8m0, act_block) : Tensor();
        const void* fp8_table = act_block == 0 && r <= cuda::kRoutedDecodeMaxSlots && fp8_decode_experts()
                                    ? fp8_decode_table(w1, t1, t3, t2)
                                    : nullptr;
        const auto op = profiler_->scope(fp8_table ? "routed_experts fp8 decode" : "routed_experts wgmma");
        cuda::launch_routed_experts_wgmma(
            out.f32(), act_block > 0 ? xq.f32() : x.f32(), expert_of_row.as<const int32_t>(), r, rows_per_input, table,
            static_cast<int>(w1.size()), d, w1[0].rows, swiglu_limit, stream_, act_block > 0, fp8_table);
    }
    // DEEPINFER_CUDA_FP8_DECODE_EXPERTS=1 (the default): decode's routed experts (the wgmma path, without FP8
    // activations) on the FP8 tensor cores with exact activations (experts_fp8_decode.cu) where their FP8 table
    // applies; 0: the bf16 decode rings. Read per call: tests and benchmarks switch it. H200, 8-layer V4-Flash decode
    // step: 2.35 / 3.22 / 6.33 ms at batches 4 / 8 / 32 against 2.54 / 3.60 / 7.30 on the bf16 rings.
    static bool fp8_decode_experts() {
        const char* v = std::getenv("DEEPINFER_CUDA_FP8_DECODE_EXPERTS");
        const std::string mode = v && *v ? v : "1";
        DI_CHECK(mode == "0" || mode == "1", "DEEPINFER_CUDA_FP8_DECODE_EXPERTS must be 0 or 1, not '", mode, "'");
        return mode == "1";
    }
    // Prefill-sized routed_experts run launch_grouped_experts_wgmma's kernels (prefill's rings, the same tiles) with
    // their plan built on the device, where the wgmma experts apply; FP8 activations keep the host's grouping (their
    // prefill kernels, experts_fp8.cu, take a host-built plan).
    bool routed_experts_take_prefill(int64_t slots, const std::vector<LinearWeight>& w1,
                                     const std::vector<LinearWeight>& w3, const std::vector<LinearWeight>& w2,
                                     int act_block) override {
        if (act_block != 0 || slots <= cuda::kRoutedDecodeMaxSlots || !decode_experts_wgmma_ || !wgmma_mode())
            return false;
        return wgmma_table(w1, expert_table(w1), expert_table(w3), expert_table(w2)) != nullptr;
    }
    // The experts dealt to side lanes (deal_experts()), each lane running its experts' chains one after the
    // other on its own scratch, forked from and joined back into stream_.
    void grouped_experts(TensorView x, const std::vector<int64_t>& counts, const std::vector<LinearWeight>& w1,
                         const std::vector<LinearWeight>& w3, const std::vector<LinearWeight>& w2, float swiglu_limit,
                         int act_block) override {
        const std::vector<int64_t> starts = expert_run_starts(x, counts, w1, w3, w2);
        const ExpertTable &t1 = expert_table(w1), &t3 = expert_table(w3), &t2 = expert_table(w2);
        if (act_block > 0) {  // the FP8 experts where they apply (which takes blocks of 128 only), else the default
            if (const void* table = fp8_experts_table(w1, t1, t3, t2, act_block))
                run_fp8_experts(starts, table, w1[0], swiglu_limit, x.f32(), nullptr, nullptr);
            else
                Backend::grouped_experts(x, counts, w1, w3, w2, swiglu_limit, act_block);
            return;
        }
        if (wgmma_experts(t1, t3, t2)) {
            run_wgmma_experts(starts, t1, t3, t2, w1[0], swiglu_limit, x.f32(), nullptr, nullptr);
            return;
        }
        const std::vector<std::vector<int>> dealt = deal_experts(counts, expert_lanes_count_);
        if (dealt.empty()) return;
        const auto op = profiler_->scope("grouped_experts");
        // Each lane's gate and up scratch, as wide as its widest run: allocated on stream_ before the fork and
        // freed on it after the join (they outlive `fork`).
        std::vector<Tensor> gates, ups;
        for (const std::vector<int>& experts : dealt) {
            gates.push_back(alloc(DType::kF32, Shape{counts[experts[0]], w1[0].rows}));
            ups.push_back(alloc(DType::kF32, Shape{counts[experts[0]], w1[0].rows}));
        }
        if (!expert_lanes_) expert_lanes_ = std::make_unique<cuda::SideLanes>(device_, expert_lanes_count_);
        cuda::SideLanes::Fork fork(*expert_lanes_, stream_, static_cast<int>(dealt.size()));
        round_robin(dealt, [&](int lane, int e) {
            expert_chain((*expert_lanes_)[lane], x.slice_rows(starts[e], starts[e + 1]),
                         gates[lane].view().slice_rows(0, counts[e]), ups[lane].view().slice_rows(0, counts[e]), w1[e],
                         w3[e], w2[e], swiglu_limit);
        });
        fork.join();
    }

    // The wgmma experts read the slots' token rows and write their outputs where they are (no gather and
    // scatter passes: 2 x 1.6 GB of f32 rows a layer at prefill 8 x 2048); other paths take the default.
    void grouped_experts_rows(TensorView out_rows, TensorView in_rows, int64_t cols, const std::vector<int64_t>& counts,
                              const std::vector<LinearWeight>& w1, const std::vector<LinearWeight>& w3,
                              const std::vector<LinearWeight>& w2, float swiglu_limit, int act_block) override {
        const ExpertTable &t1 = expert_table(w1), &t3 = expert_table(w3), &t2 = expert_table(w2);
        const void* fp8_table = act_block > 0 ? fp8_experts_table(w1, t1, t3, t2, act_block) : nullptr;
        if (act_block > 0 ? !fp8_table : !wgmma_experts(t1, t3, t2)) {
            Backend::grouped_experts_rows(out_rows, in_rows, cols, counts, w1, w3, w2, swiglu_limit, act_block);
            return;
        }
        DI_ICHECK(in_rows.ndim() == 1 && out_rows.ndim() == 1 && in_rows.dim(0) == out_rows.dim(0) &&
                      in_rows.dtype() == DType::kI64 && out_rows.dtype() == DType::kI64,
                  "grouped_experts_rows: in_rows ", in_rows.shape().str(), ", out_rows ", out_rows.shape().str());
        const std::vector<int64_t> starts =
            expert_run_starts(TensorView(nullptr, DType::kF32, Shape{in_rows.dim(0), cols}), counts, w1, w3, w2);
        if (fp8_table)
            run_fp8_experts(starts, fp8_table, w1[0], swiglu_limit, nullptr, in_rows.as<const float* const>(),
                            out_rows.as<float* const>());
        else
            run_wgmma_experts(starts, t1, t3, t2, w1[0], swiglu_limit, nullptr, in_rows.as<const float* const>(),
                              out_rows.as<float* const>());
    }

private:
    static constexpr size_t kStagingBytes = size_t{32} << 20;
    static constexpr size_t kCachedBlockMax = size_t{256} << 20;  // larger tensors (prefill's) are not cached
    // grouped_experts' side lanes. One prefill expert's product is a small grid (V4-Flash at 16K tokens: ~384 rows
    // x 2048 outputs, a few dozen blocks for 132 SMs), so experts one at a time leave most SMs idle; four at once
    // bring about one wave. More lanes would mostly add memory (a 32 MiB cuBLAS workspace and a chain's scratch
    // each) and contend for bandwidth with the dequantization passes, whose grids fill the GPU on their own.
    static constexpr int kExpertLanes = 4;

    // One expert's products over its run x [n, D] on `lane`, in the order of the default grouped_experts:
    // g = w1 . x, u = w3 . x, g = swiglu(g, u), then x = w2 . g over the inputs that w1 and w3 have consumed.
    void expert_chain(cuda::Lane& lane, TensorView x, TensorView g, TensorView u, const LinearWeight& w1,
                      const LinearWeight& w3, const LinearWeight& w2, float swiglu_limit) {
        linear_on(lane, g, x, w1);
        linear_on(lane, u, x, w3);
        cuda::launch_swiglu(g.f32(), g.f32(), u.f32(), g.numel(), swiglu_limit, lane.stream);
        linear_on(lane, x, g, w2);
    }

    // The descriptions of a list of experts in device memory, for expert_linear's kernels to index.
    struct ExpertTable {
        std::vector<WeightDesc> host;
        Tensor device;         // [experts] WeightDesc
        bool streams = false;  // cuda::expert_linear_streams()
        uint64_t version = 0;  // a new number each time the list is described again
    };
    static bool same_weight(const WeightDesc& d, const LinearWeight& w) {
        return d.data == w.data.data() && d.scale == w.scale.data() && d.rows == w.rows && d.cols == w.cols &&
               d.format == static_cast<int>(w.format) && d.block_rows == w.block_rows && d.block_cols == w.block_cols;
    }
    // Built on the first use of an expert list and kept, keyed by the list's address; a list found at a known
    // address but holding other weights (a model loaded after another was freed) is described again.
    const ExpertTable& expert_table(const std::vector<LinearWeight>& experts) {
        ExpertTable& t = expert_tables_[experts.data()];
        bool same = t.host.size() == experts.size();
        for (size_t i = 0; same && i < experts.size(); ++i) same = same_weight(t.host[i], experts[i]);
        if (same) return t;
        t.host.clear();
        for (const LinearWeight& w : experts) {
            DI_ICHECK(w.rows == experts[0].rows && w.cols == experts[0].cols, "expert_linear: expert ", w.name, " is [",
                      w.rows, ", ", w.cols, "], the first [", experts[0].rows, ", ", experts[0].cols, "]");
            t.host.push_back(cuda::describe_weight(w));
        }
        static_assert(sizeof(WeightDesc) % 4 == 0, "WeightDesc is stored as I32 words");
        t.streams = cuda::expert_linear_streams(t.host.data(), static_cast<int64_t>(t.host.size()));
        t.version = ++table_versions_;
        t.device = alloc(DType::kI32, Shape{static_cast<int64_t>(t.host.size() * sizeof(WeightDesc) / 4)});
        upload(t.device, t.host.data());
        return t;
    }

    // DEEPINFER_CUDA_FEW_TOKEN_EXPERTS (read per call): the most tokens for which routed_experts takes
    // experts_few_tokens.cu's kernels where they apply. Unset or "auto": cuda::kRoutedFewTokensAuto (2); "1":
    // cuda::kRoutedFewTokensMax (4); "0": none (expert_linear x 3 + swiglu at one token, the wgmma kernels from
    // kRoutedWgmmaMinTokens). H200, 8-layer decode step, one process alternating the settings (step_bench --variants;
    // bench/results/decode_few_token_experts_2026-12-03.txt): batch 1 1.686 / 1.684 ms against 1.737 / 1.734 off,
    // batch 2 2.225 / 2.276 against 2.319 / 2.329, but batch 4 2.821 / 2.837 against 2.678 / 2.671 (the shared expert
    // on the side queue waits for their blocks, which fill every SM).
    static int64_t few_token_experts() {
        const char* v = std::getenv("DEEPINFER_CUDA_FEW_TOKEN_EXPERTS");
        const std::string mode = v && *v ? v : "auto";
        DI_CHECK(mode == "0" || mode == "1" || mode == "auto",
                 "DEEPINFER_CUDA_FEW_TOKEN_EXPERTS must be 0, 1 or auto, not '", mode, "'");
        return mode == "0" ? 0 : mode == "1" ? cuda::kRoutedFewTokensMax : cuda::kRoutedFewTokensAuto;
    }
    // Prefill's routed experts on the fused wgmma kernels (experts_wgmma.cu: FP4 decoded into the tensor cores'
    // operands, about twice the rate of dequantizing each expert for cuBLAS) in the auto and tc modes, where they
    // apply; batch-invariant mode keeps the tensor-core GEMM (the wgmma tile width follows a run's length), cublas
    // and tiled modes their kernels.
    bool wgmma_mode() const {
        return !batch_invariant_ && (gemm_mode_ == GemmMode::kAuto || gemm_mode_ == GemmMode::kTc);
    }
    bool wgmma_experts(const ExpertTable& t1, const ExpertTable& t3, const ExpertTable& t2) const {
        return wgmma_mode() && wgmma_takes(t1, t3, t2);
    }
    // Whether the wgmma kernels take the three expert lists (FP4 of their shapes, a compute capability 9.0 GPU),
    // whatever the mode.
    static bool wgmma_takes(const ExpertTable& t1, const ExpertTable& t3, const ExpertTable& t2) {
        return t1.host.size() == t3.host.size() && t1.host.size() == t2.host.size() &&
               cuda::grouped_experts_wgmma_applies(t1.host.data(), t3.host.data(), t2.host.data(),
                                                   static_cast<int>(t1.host.size()));
    }

    // bytes (a plan or a table of the expert kernels) in a new device tensor of I32 words.
    Tensor device_bytes(const std::vector<uint8_t>& bytes) {
        DI_ICHECK(bytes.size() % 4 == 0, "expert kernels: ", bytes.size(), " bytes of plan or table");
        Tensor t = alloc(DType::kI32, Shape{static_cast<int64_t>(bytes.size() / 4)});
        upload(t, bytes.data());
        return t;
    }
    // The ExpertTable versions a table derived from three expert lists was built from (first use: none).
    struct ListVersions {
        uint64_t v1 = 0, v3 = 0, v2 = 0;
        // Whether t1, t3 and t2 are not the versions recorded (one of the lists was described again), recording them.
        bool refresh(const ExpertTable& t1, const ExpertTable& t3, const ExpertTable& t2) {
            if (v1 == t1.version && v3 == t3.version && v2 == t2.version) return false;
            v1 = t1.version, v3 = t3.version, v2 = t2.version;
            return true;
        }
    };

    // The fused wgmma experts over runs starting at `starts` (expert_run_starts): the plan built on the host and
    // uploaded, then the kernels over x in place, or over rows read from in_rows and written to out_rows.
    void run_wgmma_experts(const std::vector<int64_t>& starts, const ExpertTable& t1, const ExpertTable& t3,
                           const ExpertTable& t2, const LinearWeight& w1, float swiglu_limit, float* x,
                           const float* const* in_rows, float* const* out_rows) {
        const auto op = profiler_->scope("grouped_experts wgmma");
        const std::vector<uint8_t> plan =
            cuda::grouped_experts_wgmma_plan(starts.data(), static_cast<int>(starts.size() - 1), t1.host.data(),
                                             t3.host.data(), t2.host.data(), w1.cols, w1.rows);
        DI_ICHECK(plan.size() % 16 == 0, "grouped_experts: a plan of ", plan.size(), " bytes");
        const Tensor device_plan = device_bytes(plan);
        cuda::launch_grouped_experts_wgmma(x, starts.back(), plan, device_plan.view().data(), w1.cols, w1.rows,
                                           swiglu_limit, stream_, in_rows, out_rows);
    }

    // The FP8 experts (experts_fp8.cu) over runs starting at `starts`, as run_wgmma_experts.
    void run_fp8_experts(const std::vector<int64_t>& starts, const void* table, const LinearWeight& w1,
                         float swiglu_limit, float* x, const float* const* in_rows, float* const* out_rows) {
        const auto op = profiler_->scope("grouped_experts fp8");
        const std::vector<uint8_t> plan =
            cuda::experts_fp8_plan(starts.data(), static_cast<int>(starts.size() - 1), w1.cols, w1.rows);
        DI_ICHECK(plan.size() % 16 == 0, "grouped_experts: a plan of ", plan.size(), " bytes");
        const Tensor device_plan = device_bytes(plan);
        cuda::launch_grouped_experts_fp8(x, starts.back(), plan, device_plan.view().data(), table, w1.cols, w1.rows,
                                         swiglu_limit, stream_, in_rows, out_rows);
    }

    // The FP8 experts' device table for three expert lists, or null where they do not apply: the FP8 tensor cores
    // off (DEEPINFER_CUDA_FP8_GEMM=0), blocks other than 128 (prefill's kernels, fp8_experts_table) or decode's
    // conditions (fp8_decode_table), shapes or formats the kernels do not take, or a weight row whose scales span more
    // binades than e4m3 holds exactly (experts_fp8_prepare, said once). Decided and built on the first use of a w1
    // list, as wgmma_table.
    struct Fp8ExpertsTable {
        ListVersions built_from;
        bool applies = false;
        bool decode = false;  // experts_fp8_decode_applies as well
        Tensor row_max;  // experts_fp8_row_bytes, as I32 words
        Tensor device;   // [experts] cuda::ExpertsFp8Ptrs, as I32 words
    };
    const void* fp8_experts_table(const std::vector<LinearWeight>& w1, const ExpertTable& t1, const ExpertTable& t3,
                                  const ExpertTable& t2, int act_block) {
        if (act_block != 128 || gemm_mode_ != GemmMode::kAuto) return nullptr;
        const Fp8ExpertsTable* t = fp8_experts_entry(w1, t1, t3, t2);
        return t && t->applies ? t->device.view().data() : nullptr;
    }
    // The table for decode's FP8 products (experts_fp8_decode.cu), or null where they do not apply.
    const void* fp8_decode_table(const std::vector<LinearWeight>& w1, const ExpertTable& t1, const ExpertTable& t3,
                                 const ExpertTable& t2) {
        const Fp8ExpertsTable* t = fp8_experts_entry(w1, t1, t3, t2);
        return t && t->decode ? t->device.view().data() : nullptr;
    }
    // The lists' entry, built or rebuilt as needed; null with the FP8 tensor cores switched off.
    const Fp8ExpertsTable* fp8_experts_entry(const std::vector<LinearWeight>& w1, const ExpertTable& t1,
                                             const ExpertTable& t3, const ExpertTable& t2) {
        if (!fp8_gemm_) return nullptr;
        Fp8ExpertsTable& t = fp8_experts_tables_[w1.data()];
        if (t.built_from.refresh(t1, t3, t2)) {
            const int n = static_cast<int>(t1.host.size());
            t.applies = t3.host.size() == t1.host.size() && t2.host.size() == t1.host.size() &&
                        cuda::experts_fp8_shapes_ok(t1.host.data(), t3.host.data(), t2.host.data(), n);
            t.row_max = Tensor(), t.device = Tensor();
            if (t.applies) {
                const int64_t bytes = cuda::experts_fp8_row_bytes(n, t1.host[0].cols, t1.host[0].rows);
                t.row_max = alloc(DType::kI32, Shape{(bytes + 3) / 4});
                uint8_t* row_max = static_cast<uint8_t*>(t.row_max.view().data());
                t.applies =
                    cuda::experts_fp8_prepare(t1.host.data(), t3.host.data(), t2.host.data(), n, row_max, stream_);
                if (!t.applies) {
                    DI_LOG(kWarn,
                           "FP8 experts: a weight row's scales span more than e4m3 holds exactly; these experts "
                           "take the bf16 path from quantized activations");
                    t.row_max = Tensor();
                }
            }
            t.decode = t.applies && cuda::experts_fp8_decode_applies(t1.host.data(), t3.host.data(), t2.host.data(), n);
            if (t.applies) {
                t.device = device_bytes(cuda::experts_fp8_table(t1.host.data(), t3.host.data(), t2.host.data(), n,
                                                                static_cast<const uint8_t*>(t.row_max.view().data())));
            }
        }
        return &t;
    }

    // routed_experts on the wgmma kernels: whether they take the three expert lists (wgmma_takes(), at most
    // kRoutedWgmmaMaxExperts) and the device table of the experts' weight pointers.
    // Decided and built on the first use of a w1 list, keyed by its address, and again only when one of the three
    // lists was described again (expert_table()): a decode step pays no O(experts) check for it.
    struct WgmmaTable {
        ListVersions built_from;
        bool applies = false;
        Tensor device;  // [experts] cuda::routed_experts_wgmma_table's bytes, as I32 words
    };
    const void* wgmma_table(const std::vector<LinearWeight>& w1, const ExpertTable& t1, const ExpertTable& t3,
                            const ExpertTable& t2) {
        WgmmaTable& t = wgmma_tables_[w1.data()];
        if (t.built_from.refresh(t1, t3, t2)) {
            t.applies =
                t1.host.size() <= static_cast<size_t>(cuda::kRoutedWgmmaMaxExperts) && wgmma_takes(t1, t3, t2);
            t.device = Tensor();
            if (t.applies) {
                t.device = device_bytes(cuda::routed_experts_wgmma_table(t1.host.data(), t3.host.data(), t2.host.data(),
                                                                         static_cast<int>(t1.host.size())));
            }
        }
        return t.applies ? t.device.view().data() : nullptr;
    }

    void finish_downloads_locked() {
        if (pending_.empty()) return;
        DI_CUDA_CHECK(cudaEventSynchronize(downloads_done_));
        for (const PendingDownload& d : pending_) std::memcpy(d.dst, d.src, d.n);
        pending_.clear();
        pending_used_ = 0;
    }

    // Ops issue on `lane` from now on (stream_ is always lane_'s stream).
    void use_lane(cuda::Lane& lane) {
        lane_ = &lane;
        stream_ = lane.stream;
    }

    void drain_locked() {
        if (side_fork_) DI_CUDA_CHECK(cudaStreamSynchronize((*side_)[0].stream));  // forked, not yet joined
        DI_CUDA_CHECK(cudaStreamSynchronize(main_lane_.stream));                   // stream_ may be the side's
        staging_used_ = 0;
        profiler_->collect();
    }

    int device_;
    cudaStream_t stream_ = nullptr;       // where ops (and frees) issue: lane_'s stream
    cuda::BlockCache* blocks_ = nullptr;  // alloc()'s memory: frees onto stream_ (see BlockCache::release)
    std::mutex staging_mu_;
    uint8_t* staging_ = nullptr;  // pinned, kStagingBytes
    std::unique_ptr<cuda::OpProfiler> profiler_;
    size_t staging_used_ = 0;
    // download_async's copies in flight: their pinned bytes and where they go.
    struct PendingDownload {
        void* dst;
        const uint8_t* src;
        size_t n;
    };
    std::vector<PendingDownload> pending_;
    uint8_t* pending_buf_ = nullptr;  // pinned, pending_capacity_ bytes
    size_t pending_capacity_ = 0, pending_used_ = 0;
    cudaEvent_t downloads_done_ = nullptr;  // recorded after the last queued copy
    ThreadPool pool_;
    bool batch_invariant_ = false;
    enum class GemmMode { kAuto, kCublas, kTc, kTiled };
    GemmMode gemm_mode_ = GemmMode::kAuto;  // products the GEMV does not take (see matmul())
    cuda::Lane main_lane_;                  // the main stream and its cuBLAS handle
    cuda::Lane* lane_ = &main_lane_;        // where ops issue: the main lane, or the side queue's while it is open
    std::unique_ptr<cuda::SideLanes> side_;           // the side queue's lane, created on its first use
    std::optional<cuda::SideLanes::Fork> side_fork_;  // forked by side_begin, joined by side_join
    bool side_open_ = false;
    int expert_lanes_count_ = kExpertLanes;
    std::unique_ptr<cuda::SideLanes> expert_lanes_;  // grouped_experts' lanes, created on its first use
    std::unordered_map<const LinearWeight*, ExpertTable> expert_tables_;
    uint64_t table_versions_ = 0;       // ExpertTable::version's last number
    bool decode_experts_wgmma_ = true;  // DEEPINFER_CUDA_DECODE_EXPERTS
    bool hc_post_mix_ = false;          // DEEPINFER_CUDA_HC_POST_MIX
    bool decode_gemv_wgmma_ = true;     // DEEPINFER_CUDA_DECODE_GEMV
    bool fp8_gemm_ = true;              // DEEPINFER_CUDA_FP8_GEMM
    std::unordered_map<const LinearWeight*, WgmmaTable> wgmma_tables_;
    std::unordered_map<const LinearWeight*, Fp8ExpertsTable> fp8_experts_tables_;
};

}  // namespace

int cuda_device_count() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky error of a missing driver
        return 0;
    }
    return n;
}

std::unique_ptr<Backend> make_cuda_backend(int device_index, int host_threads) {
    const int n = cuda_device_count();
    DI_CHECK(n > 0, "device 'cuda': no CUDA device is available (driver or GPU missing)");
    DI_CHECK(device_index >= 0 && device_index < n, "device 'cuda:", device_index, "': only ", n,
             " CUDA device(s) are visible");
    return std::make_unique<CudaBackend>(device_index, host_threads);
}

}  // namespace deepinfer
