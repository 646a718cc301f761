// The CUDA sparse attention and lightning-indexer kernels against the CPU ops (the oracle) at the shapes of
// DeepSeek-V4-Flash decode and prefill and at small odd ones, on fresh random inputs each run, outputs poisoned
// with NaN first. Both ops have two kernels, and each test runs on both:
//  - fp32 SIMT (DEEPINFER_CUDA_GEMM=tiled): max |cuda - cpu| / max |cpu| <= 1e-5 (fp32 on both sides), as in
//    cuda_ops_test.cpp.
//  - tensor cores (the default mode): 3e-2, the tolerance table's GPU bound, against the CPU op; and a tight
//    bound against the CPU op fed the same bf16-rounded q and keys. Sparse attention: 4e-3; what is left then is
//    the rounding of the probabilities to bf16 for the product with V (relative 2^-9 per weight, random in sign,
//    so ~2^-9 / sqrt(3) = 1.1e-3 of the output's size; an emulation of the kernel's arithmetic on the CPU gives
//    0.7-1.7e-3 over these shapes), while a wrong fragment, tile or rescale moves the output by far more than 1e-2.
// Head dims above 512 take the fp32 kernel in every mode (the tensor-core kernel covers V4's 512).
//
// The indexer's scores (fixtures CudaIndexer: the default mode, tensor cores; CudaIndexerTiled: fp32) are held to
// the same bounds, but relative to the scale of their rounding: max |cuda - cpu| over the largest score of |q|,
// |k| and |w| (the op on absolute values: every term a score sums, at full size). Against the largest score itself
// a shape of few scores fails by chance: a dot of 0.5 from 128 terms of size ~1 (relu keeps it) moves by its
// terms' rounding, not by 2^-9 of 0.5. bf16 q and keys move a dot by at most 2^-8 of its terms' sum, so the
// tolerance bound holds with room. Against the CPU fed the bf16-rounded q and keys the products are exact and
// only the order of fp32 sums differs (tensor-core adds may truncate): kIndexerSameInputsBound = 1e-5, under
// the worst case of such sums at V4's shape ((c + Hi) 2^-23 = 2.3e-5) and 200x over an emulation of the kernel's
// arithmetic on the CPU (truncating adds: 1e-8 to 5e-8 over these shapes), while the same emulation with a wrong
// B fragment (k halves swapped) or head weights (g and g + 8 swapped) gives 1.5e-2 to 0.5.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gemv_wgmma.h"
#include "core/dtype.h"
#include "cuda_test_support.h"
#include "support/npy_compare.h"

namespace deepinfer {
namespace {

using testing_support::rel_error;
using testing_support::kBf16Bound;
using testing_support::kBound;

// Against the CPU fed the same bf16-rounded inputs: looser than the products' kSameInputsBound, since the kernel
// also rounds its probabilities to bf16.
constexpr double kAttentionSameInputsBound = 4e-3;
// The largest head dim the tensor-core kernel takes (attention_tc.cu's kMaxHeadDim); above, every mode runs the
// fp32 kernel, held to the fp32 bound.
constexpr int64_t kTcMaxHeadDim = 512;
// The tensor-core indexer against the CPU fed the same bf16-rounded q and keys, relative to the scores of the
// absolute values (see the top).
constexpr double kIndexerSameInputsBound = 1e-5;
// The shapes the tensor-core indexer takes (indexer_tc.cu: up to 256 heads and c up to 512; every shape here fits
// its shared memory); others run the fp32 kernel in every mode.
constexpr int64_t kTcIndexerMaxHeads = 256, kTcIndexerMaxDim = 512;

// Per query row, a list of rows of the key table.
using KeyLists = std::vector<std::vector<int32_t>>;

// CPU and CUDA backends, the CUDA one created with DEEPINFER_CUDA_GEMM = `gemm` (restored afterwards).
class AttentionFixture : public ::testing::Test {
protected:
    explicit AttentionFixture(std::string gemm) : gemm_(std::move(gemm)) {}
    void SetUp() override {
        if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
        if (const char* prev = std::getenv("DEEPINFER_CUDA_GEMM")) saved_gemm_ = prev, had_gemm_ = true;
        setenv("DEEPINFER_CUDA_GEMM", gemm_.c_str(), 1);
        cpu_ = create_backend("cpu", 0);  // every core: the references are most of these tests' time
        gpu_ = create_backend("cuda", 2);
        const unsigned seed = std::random_device{}();
        std::printf("seed %u\n", seed);
        rng_.seed(seed);
    }
    void TearDown() override {
        if (had_gemm_) setenv("DEEPINFER_CUDA_GEMM", saved_gemm_.c_str(), 1);
        else unsetenv("DEEPINFER_CUDA_GEMM");
    }
    // The sparse_attention kernel under test computes from bf16 q and keys (every mode but tiled).
    bool tensor_cores() const { return gemm_ != "tiled"; }

    Tensor normal(Shape s, float std) {
        std::normal_distribution<float> dist(0.0f, std);
        Tensor t(DType::kF32, s);
        for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = dist(rng_);
        return t;
    }
    // Integers in [lo, hi]: dot products of such values are exact in fp32 in any order, so the logits are the
    // same on both backends and only the softmax's own rounding differs.
    Tensor integers(Shape s, int lo, int hi) {
        std::uniform_int_distribution<int> dist(lo, hi);
        Tensor t(DType::kF32, s);
        for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = static_cast<float>(dist(rng_));
        return t;
    }
    int32_t below(int64_t n) { return static_cast<int32_t>(rng_() % static_cast<uint64_t>(n)); }

    Tensor on_gpu(const Tensor& host) { return to_backend(*gpu_, host.view()); }
    Tensor nan_filled(Shape s) {
        const std::vector<float> nan(static_cast<size_t>(s.numel()), std::numeric_limits<float>::quiet_NaN());
        Tensor t = gpu_->alloc(DType::kF32, s);
        if (s.numel()) gpu_->upload(t, nan.data());
        return t;
    }
    Tensor i32_on_gpu(const std::vector<int32_t>& v) {
        Tensor t = gpu_->alloc(DType::kI32, Shape{std::max<int64_t>(1, static_cast<int64_t>(v.size()))});
        if (!v.empty()) gpu_->upload(TensorView(t.view().data(), DType::kI32, Shape{int64_t(v.size())}), v.data());
        return t;
    }
    std::vector<float> download(const Tensor& t) {
        std::vector<float> v(static_cast<size_t>(t.numel()));
        if (!v.empty()) gpu_->download(v.data(), t);
        return v;
    }
    static std::vector<float> host_values(const Tensor& t) { return {t.f32(), t.f32() + t.numel()}; }

    // Per-row key lists as sparse_attention's offsets [T + 1] and indices.
    struct FlatLists {
        std::vector<int32_t> offsets{0}, indices;
        explicit FlatLists(const KeyLists& lists) {
            for (const auto& l : lists) {
                indices.insert(indices.end(), l.begin(), l.end());
                offsets.push_back(static_cast<int32_t>(indices.size()));
            }
        }
    };
    static float scale_of(const Tensor& q) { return 1.0f / std::sqrt(static_cast<float>(q.dim(2))); }
    std::vector<float> cpu_attend(const Tensor& q, const Tensor& keys, const Tensor& sinks, const FlatLists& f) {
        Tensor out = Tensor::f32(q.shape());
        cpu_->sparse_attention(out, q, keys, f.offsets.data(), f.indices.data(), sinks.f32(), scale_of(q));
        return host_values(out);
    }
    static Tensor bf16_rounded(const Tensor& t) {
        Tensor r = Tensor::f32(t.shape());
        for (int64_t i = 0; i < t.numel(); ++i) r.f32()[i] = round_to_bf16(t.f32()[i]);
        return r;
    }

    // Runs sparse_attention on both backends; returns the CUDA output and stores the CPU one in *ref.
    std::vector<float> attend(const Tensor& q, const Tensor& keys, const Tensor& sinks, const KeyLists& lists,
                              std::vector<float>* ref) {
        const FlatLists f(lists);
        *ref = cpu_attend(q, keys, sinks, f);
        Tensor qd = on_gpu(q), kd = on_gpu(keys), sd = on_gpu(sinks), out = nan_filled(q.shape());
        Tensor off_d = i32_on_gpu(f.offsets), idx_d = i32_on_gpu(f.indices);
        gpu_->sparse_attention(out, qd, kd, off_d.as<int32_t>(), idx_d.as<int32_t>(), sd.f32(), scale_of(q));
        return download(out);
    }
    // The CUDA output against the CPU one (ref) under the bounds of the kernel under test (see the top); for the
    // tensor cores also against the CPU op on the bf16-rounded q and keys.
    void expect_close(const std::vector<float>& out, const std::vector<float>& ref, const Tensor& q,
                      const Tensor& keys, const Tensor& sinks, const KeyLists& lists, const std::string& what) {
        if (!tensor_cores() || q.dim(2) > kTcMaxHeadDim) {
            EXPECT_LE(rel_error(out, ref), kBound) << what;
            return;
        }
        EXPECT_LE(rel_error(out, ref), kBf16Bound) << what;
        const std::vector<float> ref16 = cpu_attend(bf16_rounded(q), bf16_rounded(keys), sinks, FlatLists(lists));
        EXPECT_LE(rel_error(out, ref16), kAttentionSameInputsBound) << what << " (bf16-rounded inputs)";
    }
    void check_attention(int64_t heads, int64_t d, int64_t nkeys, const KeyLists& lists, float q_std = 1.0f) {
        const int64_t t = static_cast<int64_t>(lists.size());
        Tensor q = normal(Shape{t, heads, d}, q_std), keys = normal(Shape{nkeys, d}, 1.0f);
        Tensor sinks = normal(Shape{heads}, 1.0f);
        std::vector<float> ref;
        const std::vector<float> out = attend(q, keys, sinks, lists, &ref);
        const std::string what =
            "rows " + std::to_string(t) + " heads " + std::to_string(heads) + " head_dim " + std::to_string(d);
        expect_close(out, ref, q, keys, sinks, lists, what);
    }

    // Decode lists: `window` consecutive rows of the key table, then `selected` random rows (repeats allowed)
    // from the `entries` rows that follow the windows.
    KeyLists decode_lists(int64_t rows, int64_t window, int64_t selected, int64_t entries) {
        KeyLists lists(rows);
        for (int64_t t = 0; t < rows; ++t) {
            for (int64_t i = 0; i < window; ++i) lists[t].push_back(static_cast<int32_t>(t + i));
            for (int64_t i = 0; i < selected; ++i)
                lists[t].push_back(static_cast<int32_t>(rows + window + below(entries)));
        }
        return lists;
    }

    // A rotary_attention_rows call's inputs: q [rows, heads, 512] of std 3 and 700 random keys by address, row t
    // attending lens[t % 14] random keys, positions below 10^6 (where sinf and cosf take their slow path), RoPE of
    // width rope_dim with V4's attention factor; the host tensors (q, the CPU's key addresses) and their device copies.
    struct RotaryCall {
        static constexpr int64_t kD = 512, kKeys = 700;
        static constexpr int kLens[14] = {0, 1, 31, 32, 33, 63, 64, 65, 95, 96, 97, 128, 200, 640};
        int64_t rows, heads;
        int rope_dim;
        Tensor q, keys, sinks, inv_freq;
        std::vector<int32_t> positions, offsets, indices;
        Tensor kd, sd, fd, pos_d, off_d, idx_d, rows_d;
        float scale = 0, af = 1.25f, eps = 1e-6f;

        RotaryCall(AttentionFixture& fx, int64_t rows_, int64_t heads_, int rope_dim_)
            : rows(rows_), heads(heads_), rope_dim(rope_dim_) {
            KeyLists lists(rows);
            for (int64_t t = 0; t < rows; ++t)
                for (int i = 0; i < kLens[t % 14]; ++i) lists[t].push_back(fx.below(kKeys));
            const FlatLists f(lists);
            offsets = f.offsets;
            indices = f.indices;
            q = fx.normal(Shape{rows, heads, kD}, 3.0f);
            keys = fx.normal(Shape{kKeys, kD}, 1.0f);
            sinks = fx.normal(Shape{heads}, 1.0f);
            inv_freq = Tensor::f32(Shape{rope_dim / 2});
            for (int i = 0; i < rope_dim / 2; ++i)
                inv_freq.f32()[i] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(rope_dim));
            positions.resize(static_cast<size_t>(rows));
            for (auto& p : positions) p = fx.below(1000000);
            scale = scale_of(q);
            kd = fx.on_gpu(keys), sd = fx.on_gpu(sinks), fd = fx.on_gpu(inv_freq), pos_d = fx.i32_on_gpu(positions);
            off_d = fx.i32_on_gpu(offsets), idx_d = fx.i32_on_gpu(indices);
            rows_d = fx.on_gpu(key_addresses(kd));
        }
        std::string what() const {
            return std::to_string(rows) + " rows, " + std::to_string(heads) + " heads, rope " +
                   std::to_string(rope_dim);
        }
        // [kKeys] I64 on the host: the rows of a key table in memory of the backend that reads them.
        Tensor key_addresses(const Tensor& table) const {
            Tensor a(DType::kI64, Shape{kKeys});
            for (int64_t i = 0; i < kKeys; ++i)
                a.view().as<int64_t>()[i] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(table.f32() + i * kD));
            return a;
        }
        Backend::AttentionRope rope(bool device) const {
            return device ? Backend::AttentionRope{pos_d.as<int32_t>(), fd.f32(), rope_dim, af, eps}
                          : Backend::AttentionRope{positions.data(), inv_freq.f32(), rope_dim, af, eps};
        }
        // The call on the GPU into out, from q_dev (a device copy of q, which the call may norm and rotate); with
        // `apart` Backend's default, the three ops.
        void run_gpu(Backend& gpu, TensorView out, TensorView q_dev, bool apart = false) const {
            const int32_t *off = off_d.as<int32_t>(), *idx = idx_d.as<int32_t>();
            if (apart)
                gpu.Backend::rotary_attention_rows(out, q_dev, rows_d, off, idx, sd.f32(), scale, rope(true));
            else
                gpu.rotary_attention_rows(out, q_dev, rows_d, off, idx, sd.f32(), scale, rope(true));
        }
    };
    // Whether the wgmma kernel takes a rotary call (and so norms and rotates inside): prefill rows, rotary width up to
    // 128, on a compute capability 9.0 device in the default mode, unless DEEPINFER_CUDA_ATTN_WGMMA=0.
    bool fused_rotary_attention(int64_t rows, int rope_dim) const {
        const char* env = std::getenv("DEEPINFER_CUDA_ATTN_WGMMA");
        return tensor_cores() && cuda::gemv_wgmma_device() && rows >= 300 && rope_dim <= 128 &&
               !(env && std::strcmp(env, "0") == 0);
    }

    std::string gemm_, saved_gemm_;
    bool had_gemm_ = false;
    std::unique_ptr<Backend> cpu_, gpu_;
    std::mt19937 rng_;
};

// Sparse attention, once per kernel: "tiled" (fp32) and "auto" (tensor cores).
class CudaAttention : public AttentionFixture, public ::testing::WithParamInterface<const char*> {
public:
    CudaAttention() : AttentionFixture(GetParam()) {}
};
INSTANTIATE_TEST_SUITE_P(Kernels, CudaAttention, ::testing::Values("tiled", "auto"),
                         [](const ::testing::TestParamInfo<const char*>& info) { return std::string(info.param); });

// A sequence of `rows` query rows scoring `count` keys of one table (indexer_scores_rows).
struct IndexerSeq {
    int64_t rows, count;
};

// The indexer, under DEEPINFER_CUDA_GEMM = `gemm`: errors relative to the scores of the absolute values (see the
// top). Each test body runs in both fixtures below.
class IndexerFixture : public AttentionFixture {
protected:
    using AttentionFixture::AttentionFixture;

    // Whether the kernel under test for this shape is the tensor-core one.
    bool tc_indexer(int64_t heads, int64_t c) const {
        return tensor_cores() && heads <= kTcIndexerMaxHeads && c <= kTcIndexerMaxDim;
    }
    static Tensor abs_of(const Tensor& t) {
        Tensor a = Tensor::f32(t.shape());
        for (int64_t i = 0; i < t.numel(); ++i) a.f32()[i] = std::fabs(t.f32()[i]);
        return a;
    }
    // max |out - ref| over max |mag| (any NaN: infinite).
    static double scaled_error(const std::vector<float>& out, const std::vector<float>& ref,
                               const std::vector<float>& mag) {
        if (out.size() != ref.size() || out.size() != mag.size()) return INFINITY;
        double diff = 0, scale = 0;
        for (size_t i = 0; i < out.size(); ++i) {
            if (std::isnan(out[i]) || std::isnan(ref[i])) return INFINITY;
            diff = std::max(diff, static_cast<double>(std::fabs(out[i] - ref[i])));
            scale = std::max(scale, static_cast<double>(std::fabs(mag[i])));
        }
        return scale > 0 ? diff / scale : diff;
    }
    // The CPU's scores of one sequence's rows: of q, keys and w; of q and keys rounded to bf16 (tensor cores
    // only); and of their absolute values.
    struct IndexerRefs {
        std::vector<float> ref, ref16, mag;
    };
    IndexerRefs cpu_indexer(const Tensor& q, const Tensor& keys, const Tensor& w, float scale, bool tc) {
        const Shape s{q.dim(0), keys.dim(0)};
        auto run = [&](const Tensor& qq, const Tensor& kk, const Tensor& ww) {
            Tensor out = Tensor::f32(s);
            cpu_->indexer_scores(out, qq, kk, ww, scale);
            return host_values(out);
        };
        IndexerRefs r;
        r.ref = run(q, keys, w);
        if (tc) r.ref16 = run(bf16_rounded(q), bf16_rounded(keys), w);
        r.mag = run(abs_of(q), abs_of(keys), abs_of(w));
        return r;
    }
    void expect_indexer_close(const std::vector<float>& out, const IndexerRefs& r, int64_t heads, int64_t c,
                              const std::string& what) {
        if (!tc_indexer(heads, c)) {
            EXPECT_LE(scaled_error(out, r.ref, r.mag), kBound) << what;
            return;
        }
        EXPECT_LE(scaled_error(out, r.ref, r.mag), kBf16Bound) << what;
        EXPECT_LE(scaled_error(out, r.ref16, r.mag), kIndexerSameInputsBound) << what << " (bf16-rounded inputs)";
    }
    // A device copy of `host` starting `offset` floats into its buffer (offset 1: off 8- and 16-byte alignment).
    struct Placed {
        Tensor buffer;
        TensorView view;
    };
    Placed on_gpu_at(const Tensor& host, int64_t offset) {
        Placed p{gpu_->alloc(DType::kF32, Shape{host.numel() + offset}), {}};
        p.view = TensorView(static_cast<float*>(p.buffer.view().data()) + offset, DType::kF32, host.shape());
        if (host.numel()) gpu_->upload(p.view, host.f32());
        return p;
    }

    // indexer_scores on t rows of `heads` x c queries and `entries` keys; misaligned: q, keys and w one float off
    // their buffers' alignment (scalar query staging and key loads).
    void check_indexer(int64_t t, int64_t heads, int64_t c, int64_t entries, bool misaligned = false) {
        Tensor q = normal(Shape{t, heads, c}, 1.0f), keys = normal(Shape{entries, c}, 1.0f);
        Tensor w = normal(Shape{t, heads}, 1.0f);
        const float scale = 1.0f / std::sqrt(static_cast<float>(c));
        const IndexerRefs r = cpu_indexer(q, keys, w, scale, tc_indexer(heads, c));
        const int64_t off = misaligned ? 1 : 0;
        const Placed qd = on_gpu_at(q, off), kd = on_gpu_at(keys, off), wd = on_gpu_at(w, off);
        Tensor out = nan_filled(Shape{t, entries});
        gpu_->indexer_scores(out, qd.view, kd.view, wd.view, scale);
        expect_indexer_close(download(out), r, heads, c,
                             "rows " + std::to_string(t) + " heads " + std::to_string(heads) + " dim " +
                                 std::to_string(c) + " entries " + std::to_string(entries) +
                                 (misaligned ? " misaligned" : ""));
    }

    void scores_shapes();
    void batch_invariant();
    void rows_of_several_sequences(const std::vector<IndexerSeq>& seqs);
};

// The default mode (the tensor-core kernel for the shapes it takes) and tiled (the fp32 kernel).
class CudaIndexer : public IndexerFixture {
public:
    CudaIndexer() : IndexerFixture("auto") {}
};
class CudaIndexerTiled : public IndexerFixture {
public:
    CudaIndexerTiled() : IndexerFixture("tiled") {}
};

// V4-Flash decode: 64 heads x 512, 128 window keys + 512 selected of 1024 entries per row (4k context), one
// row (the key list split over a cluster), 8, 32 and 33 rows; some rows have no keys at all (only the sink). On
// the tensor cores (H200) 1 row takes 4 blocks of 16 heads split 8 ways; 8 rows (blocks of 16 heads) and 32-33
// rows (64 heads) make 32-33 clusters planned 4 ways but split 3 ways (30 clusters of 4 run at once), all
// gathering fp32 keys; 70 rows with a larger table take 64-head blocks without a split.
TEST_P(CudaAttention, SparseAttentionDecodeShapes) {
    for (int64_t rows : {1, 8, 32, 33}) {
        KeyLists lists = decode_lists(rows, 128, 512, 1024);
        if (rows > 1) lists[3].clear();
        if (rows > 8) lists[rows - 1].clear();
        check_attention(64, 512, rows + 128 + 1024, lists);
    }
    check_attention(64, 512, 70 + 128 + 4096, decode_lists(70, 128, 256, 4096));
    // HCA-like: the window plus all 32 entries; and a list shorter than one tile.
    check_attention(64, 512, 1 + 128 + 32, {[] {
                        std::vector<int32_t> l;
                        for (int32_t i = 0; i < 161; ++i) l.push_back(i);
                        return l;
                    }()});
    check_attention(64, 512, 40, decode_lists(1, 3, 5, 30));
}

// Prefill-like: 300 consecutive positions, each with its sliding window (up to 128 rows) and the compressed
// entries visible to it (one per 4 positions, up to 512). On the tensor cores the key table is small against the
// rows, so the tiles come by cp.async from its bf16 copy.
TEST_P(CudaAttention, SparseAttentionPrefillShapes) {
    const int64_t rows = 300, window = 128, entries = rows / 4;
    KeyLists lists(rows);
    for (int64_t p = 0; p < rows; ++p) {
        for (int64_t k = std::max<int64_t>(0, p - window + 1); k <= p; ++k) lists[p].push_back(static_cast<int32_t>(k));
        for (int64_t e = 0; e < (p + 1) / 4; ++e) lists[p].push_back(static_cast<int32_t>(rows + e));
    }
    check_attention(64, 512, rows + entries, lists);
}

// The wgmma prefill kernel (attention_wgmma.cu; from 132 rows x 64-head groups with the table copy, 64-head
// groups of head dim 512): list lengths around its tiles of 32 keys and pairs of tiles (an odd tile count leaves
// the second warpgroup without a tile), rows with only the sink, and 128 heads (two items a row).
TEST_P(CudaAttention, SparseAttentionWgmmaPrefillEdges) {
    const int64_t rows = 420, nkeys = 700;  // 3-7 items a CTA on an H200
    const int lens[] = {0, 1, 31, 32, 33, 63, 64, 65, 95, 96, 97, 128, 200, 640};
    KeyLists lists(rows);
    for (int64_t t = 0; t < rows; ++t)
        for (int i = 0; i < lens[t % 14]; ++i) lists[t].push_back(below(nkeys));
    check_attention(64, 512, nkeys, lists);
    check_attention(128, 512, nkeys, lists);
}

// Few heads (fp32: groups of 4 and 8 with missing heads; tensor cores: one 16-head tile, mostly padding), head
// dims that are not multiples of 32 or 128 or even 4 (the scalar staging paths; on the tensor cores padded to
// 128 or 512), and the largest supported head dim (above 512: the fp32 kernel in every mode).
TEST_P(CudaAttention, SparseAttentionOddShapes) {
    check_attention(3, 48, 50, decode_lists(2, 7, 20, 30));
    check_attention(5, 50, 60, decode_lists(4, 9, 33, 40));
    check_attention(5, 50, 300, decode_lists(2, 9, 33, 250));  // tensor cores: gathered without float4 loads
    check_attention(9, 64, 90, decode_lists(1, 16, 70, 60));
    check_attention(12, 96, 200, decode_lists(150, 8, 40, 40));  // 150 rows x 2 groups: 8 heads per block
    check_attention(6, 1000, 100, decode_lists(3, 20, 50, 70));
    check_attention(16, 1000, 100, decode_lists(20, 10, 30, 60));  // 8 heads per block at the largest head dim
    check_attention(4, 260, 100, decode_lists(2, 30, 20, 60));
    check_attention(80, 128, 300, decode_lists(40, 64, 100, 100));  // tensor cores: 64 + 16 heads (two blocks)
}

// Every list empty: the sink is the whole denominator and the value is zero. 1,000 rows take the prefill kernel on
// Hopper, several items a CTA (its query buffer's handshake over many rounds).
TEST_P(CudaAttention, SparseAttentionEmptyListsGiveZeros) {
    for (const int64_t rows : {5, 1000}) {
        Tensor q = normal(Shape{rows, 64, 512}, 1.0f), keys = normal(Shape{3, 512}, 1.0f);
        Tensor sinks = normal(Shape{64}, 1.0f);
        std::vector<float> ref;
        const std::vector<float> out = attend(q, keys, sinks, KeyLists(static_cast<size_t>(rows)), &ref);
        EXPECT_EQ(out, ref) << "rows " << rows;
        EXPECT_EQ(out, std::vector<float>(out.size(), 0.0f)) << "rows " << rows;
    }
}

// Logits far from the sink and from each other: integer inputs make the logits exact on both backends (and
// exact in bf16), so the bound tests the online softmax alone.
// 3 rows take the decode kernels; 150 rows against a small table the prefill one (attention_wgmma.cu on Hopper).
TEST_P(CudaAttention, SparseAttentionExtremeLogits) {
    for (const int64_t rows : {3, 150}) {
        const int64_t heads = 64, d = 512, nkeys = 700;
        const KeyLists lists = decode_lists(rows, 128, 512, nkeys - rows - 128);
        Tensor keys = integers(Shape{nkeys, d}, 1, 2);
        std::vector<float> ref;
        struct Case {
            int q_lo, q_hi;
            float sink;
            const char* what;
        };
        for (Case c :
             {Case{-1, -1, 0.0f, "logits -45 .. -22, sink 0"}, Case{3, 3, -1e4f, "logits 68 .. 136, sink -1e4"},
              Case{-40, 40, 0.0f, "logits spread over hundreds"}, Case{1, 1, 1e3f, "sink far above"}}) {
            Tensor q = integers(Shape{rows, heads, d}, c.q_lo, c.q_hi);
            Tensor sinks = Tensor::f32(Shape{heads});
            for (int64_t h = 0; h < heads; ++h) sinks.f32()[h] = c.sink + static_cast<float>(h % 3);
            const std::vector<float> out = attend(q, keys, sinks, lists, &ref);
            expect_close(out, ref, q, keys, sinks, lists, std::string(c.what) + ", rows " + std::to_string(rows));
        }
    }
}

// A NaN in one query element makes its (row, head) NaN, as on the CPU (its logits are all NaN), and nothing else;
// at 3 rows (decode kernels) and 150 (the prefill kernel on Hopper, whose two warpgroups share each row maximum).
TEST_P(CudaAttention, SparseAttentionNanStaysInItsHead) {
    for (const int64_t rows : {3, 150}) {
        const int64_t heads = 64, d = 512, bad = 1 * heads + 5;
        const KeyLists lists = decode_lists(rows, 128, 512, 1024);
        Tensor q = normal(Shape{rows, heads, d}, 1.0f), keys = normal(Shape{rows + 128 + 1024, d}, 1.0f);
        Tensor sinks = normal(Shape{heads}, 1.0f);
        q.f32()[bad * d + 7] = std::numeric_limits<float>::quiet_NaN();
        std::vector<float> ref;
        std::vector<float> out = attend(q, keys, sinks, lists, &ref);
        for (size_t i = 0; i < out.size(); ++i) {
            const bool in_head = static_cast<int64_t>(i) / d == bad;
            ASSERT_EQ(std::isnan(ref[i]), in_head) << "CPU element " << i << ", rows " << rows;
            ASSERT_EQ(std::isnan(out[i]), in_head) << "element " << i << ", rows " << rows;
            if (in_head) out[i] = ref[i] = 0.0f;
        }
        EXPECT_LE(rel_error(out, ref), tensor_cores() ? kBf16Bound : kBound) << "rows " << rows;
    }
}

// The decode key lists split over clusters merge in rank order: repeated calls agree bitwise.
TEST_P(CudaAttention, SparseAttentionRepeatsBitwise) {
    for (int64_t rows : {1, 8}) {
        const int64_t heads = 64, d = 512;
        const FlatLists f(decode_lists(rows, 128, 512, 1024));
        Tensor q = on_gpu(normal(Shape{rows, heads, d}, 1.0f));
        Tensor keys = on_gpu(normal(Shape{rows + 128 + 1024, d}, 1.0f)), sinks = on_gpu(normal(Shape{heads}, 1.0f));
        Tensor off_d = i32_on_gpu(f.offsets), idx_d = i32_on_gpu(f.indices);
        std::vector<float> first;
        for (int i = 0; i < 3; ++i) {
            Tensor out = nan_filled(Shape{rows, heads, d});
            gpu_->sparse_attention(out, q, keys, off_d.as<int32_t>(), idx_d.as<int32_t>(), sinks.f32(), 0.04f);
            const std::vector<float> v = download(out);
            if (i == 0) first = v;
            else EXPECT_EQ(v, first) << rows << " rows, call " << i;
        }
    }
}

// Keys by address (sparse_attention_rows, as the model calls it): the table's rows in a shuffled order, the indices
// following them, give bitwise sparse_attention's output on the table, on both backends and in batch-invariant
// mode: decode shapes at head dims 512 and 128 (the tensor-core kernel reads the rows in place), a prefill-like
// list (it gathers them into a table and copies it to bf16, as sparse_attention does) and a decode list at a head
// dim that is not a multiple of 4 (in place with scalar loads; rows not 16-byte aligned).
TEST_P(CudaAttention, SparseAttentionByAddressMatchesTheTable) {
    struct Case {
        int64_t heads, d, nkeys;
        KeyLists lists;
    };
    std::vector<Case> cases;
    for (int64_t rows : {1, 8, 32}) cases.push_back({64, 512, rows + 128 + 1024, decode_lists(rows, 128, 512, 1024)});
    KeyLists prefill(96);
    for (int64_t p = 0; p < 96; ++p)
        for (int64_t k = std::max<int64_t>(0, p - 31); k <= p; ++k) prefill[p].push_back(static_cast<int32_t>(k));
    cases.push_back({16, 64, 96, prefill});
    cases.push_back({16, 128, 4 + 32 + 512, decode_lists(4, 32, 64, 512)});
    cases.push_back({8, 30, 3 + 16 + 400, decode_lists(3, 16, 20, 400)});
    for (const bool invariant : {false, true})
        for (const Case& cs : cases) {
            gpu_->set_batch_invariant(invariant);
            const int64_t t = static_cast<int64_t>(cs.lists.size());
            const std::string what =
                std::to_string(t) + " rows, head_dim " + std::to_string(cs.d) + (invariant ? ", batch-invariant" : "");
            Tensor q = normal(Shape{t, cs.heads, cs.d}, 1.0f), keys = normal(Shape{cs.nkeys, cs.d}, 1.0f);
            Tensor sinks = normal(Shape{cs.heads}, 1.0f);
            const FlatLists f(cs.lists);
            std::vector<int32_t> perm(static_cast<size_t>(cs.nkeys)), inv(perm.size());
            std::iota(perm.begin(), perm.end(), 0);
            std::shuffle(perm.begin(), perm.end(), rng_);
            for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<int32_t>(i);
            std::vector<int32_t> remapped(f.indices.size());
            std::transform(f.indices.begin(), f.indices.end(), remapped.begin(), [&](int32_t k) { return inv[k]; });
            // The address lists: entry i is table row perm[i], on the host (CPU) and on the GPU.
            auto addresses = [&](const float* base) {
                Tensor a(DType::kI64, Shape{cs.nkeys});
                for (int64_t i = 0; i < cs.nkeys; ++i)
                    a.view().as<int64_t>()[i] =
                        static_cast<int64_t>(reinterpret_cast<uintptr_t>(base + perm[i] * cs.d));
                return a;
            };
            Tensor cpu_ref(DType::kF32, q.shape()), cpu_out(DType::kF32, q.shape());
            cpu_->sparse_attention(cpu_ref, q, keys, f.offsets.data(), f.indices.data(), sinks.f32(), scale_of(q));
            cpu_->sparse_attention_rows(cpu_out, q, addresses(keys.f32()), f.offsets.data(), remapped.data(),
                                        sinks.f32(), scale_of(q));
            EXPECT_EQ(host_values(cpu_out), host_values(cpu_ref)) << "CPU, " << what;

            Tensor qd = on_gpu(q), kd = on_gpu(keys), sd = on_gpu(sinks);
            Tensor off_d = i32_on_gpu(f.offsets), idx_d = i32_on_gpu(f.indices), remapped_d = i32_on_gpu(remapped);
            Tensor rows_d = on_gpu(addresses(kd.f32()));
            Tensor ref = nan_filled(q.shape()), out = nan_filled(q.shape());
            gpu_->sparse_attention(ref, qd, kd, off_d.as<int32_t>(), idx_d.as<int32_t>(), sd.f32(), scale_of(q));
            gpu_->sparse_attention_rows(out, qd, rows_d, off_d.as<int32_t>(), remapped_d.as<int32_t>(), sd.f32(),
                                        scale_of(q));
            const std::vector<float> got = download(out), want = download(ref);
            EXPECT_EQ(got, want) << "GPU, " << what;
            EXPECT_TRUE(std::none_of(got.begin(), got.end(), [](float v) { return std::isnan(v); })) << what;
        }
    gpu_->set_batch_invariant(false);
}

// rotary_attention_rows (V4's queries normed and rotated, the output rotated back) against its three ops run
// apart on the same backend (Backend's default), bitwise: the wgmma kernel, which applies them as it loads the
// queries and writes the output, at prefill sizes with 64 and 128 heads and rotary widths 64 and 128, lists of 0
// to 640 keys; and the calls it does not take (8 rows; a rotary width of 192) as the default; attention_applies_rope
// says which, and the fused calls leave q as it was. Against the CPU op under the bounds of the kernel under test.
TEST_P(CudaAttention, RotaryAttentionMatchesItsThreeOps) {
    struct Case {
        int64_t rows, heads;
        int rope_dim;
    };
    for (const Case& cs :
         {Case{420, 64, 64}, Case{300, 128, 64}, Case{420, 64, 128}, Case{8, 64, 64}, Case{300, 64, 192}}) {
        const RotaryCall call(*this, cs.rows, cs.heads, cs.rope_dim);
        const int64_t d = RotaryCall::kD;
        const Tensor& q = call.q;
        const std::string what = call.what();

        Tensor cpu_out = Tensor::f32(q.shape()), cpu_q = Tensor::f32(q.shape());
        std::memcpy(cpu_q.f32(), q.f32(), q.nbytes());
        cpu_->rotary_attention_rows(cpu_out, cpu_q, call.key_addresses(call.keys), call.offsets.data(),
                                    call.indices.data(), call.sinks.f32(), call.scale, call.rope(false));

        const bool fuses = fused_rotary_attention(cs.rows, cs.rope_dim);
        EXPECT_EQ(gpu_->attention_applies_rope(cs.rows, cs.heads, d, cs.rope_dim), fuses) << what;
        Tensor q1 = on_gpu(q), q2 = on_gpu(q), fused = nan_filled(q.shape()), apart = nan_filled(q.shape());
        call.run_gpu(*gpu_, fused, q1);
        if (fuses) {
            EXPECT_EQ(download(q1), host_values(q)) << what << ": the queries were normed apart";
        }
        call.run_gpu(*gpu_, apart, q2, true);
        const std::vector<float> got = download(fused), want = download(apart);
        int64_t differ = 0, differ_rotary = 0, heads_differ = 0, last_head = -1;
        double most = 0;
        for (size_t i = 0; i < got.size(); ++i)
            if (got[i] != want[i]) {
                ++differ;
                differ_rotary += static_cast<int64_t>(i % d) >= d - cs.rope_dim;
                heads_differ += static_cast<int64_t>(i / d) != last_head;
                last_head = static_cast<int64_t>(i / d);
                most = std::max(most, static_cast<double>(std::fabs(got[i] - want[i])));
            }
        EXPECT_EQ(differ, 0) << what << ": " << differ << " differ, " << differ_rotary << " in rotary columns, in "
                             << heads_differ << " heads; largest difference " << most << ", relative "
                             << rel_error(got, want);
        EXPECT_TRUE(std::none_of(got.begin(), got.end(), [](float v) { return std::isnan(v); })) << what;
        EXPECT_LE(rel_error(got, host_values(cpu_out)), tensor_cores() ? kBf16Bound : kBound) << what;
    }
}

// A BF16 out (V4's model passes one where wo_a's products round their input to bf16) holds the F32 call's values
// rounded to nearest even, bitwise: written so by the wgmma kernel (420 rows; q left as it was) and rounded after
// the three ops (8 rows, and every call of the tiled mode).
TEST_P(CudaAttention, RotaryAttentionWritesBf16) {
    for (const int64_t rows : {int64_t{420}, int64_t{8}}) {
        const RotaryCall call(*this, rows, 64, 64);
        const std::string what = call.what();
        Tensor q1 = on_gpu(call.q), q2 = on_gpu(call.q), f32 = nan_filled(call.q.shape());
        Tensor b16 = gpu_->alloc(DType::kBF16, call.q.shape());
        const std::vector<uint16_t> nan16(static_cast<size_t>(call.q.numel()), 0x7fc0);
        gpu_->upload(b16, nan16.data());
        call.run_gpu(*gpu_, f32, q1);
        call.run_gpu(*gpu_, b16, q2);
        if (fused_rotary_attention(rows, 64)) {
            EXPECT_EQ(download(q2), host_values(call.q)) << what << ": the queries were normed apart";
        }
        const std::vector<float> want = download(f32);
        std::vector<uint16_t> got(want.size());
        gpu_->download(got.data(), b16);
        int64_t differ = 0;
        for (size_t i = 0; i < got.size(); ++i) differ += got[i] != f32_to_bf16(want[i]);
        EXPECT_EQ(differ, 0) << what << ": " << differ << " of " << got.size() << " values differ";
    }
}

// BF16 queries (V4's model passes them where wq_b's product writes them so) are widened exactly: bitwise the call on
// F32 queries holding the same bf16 values, fused (420 rows; the BF16 q left as it was) or through the three ops
// (8 rows, and every call of the tiled mode); with a BF16 output too, that call's output rounded.
TEST_P(CudaAttention, RotaryAttentionTakesBf16Queries) {
    for (const int64_t rows : {int64_t{420}, int64_t{8}}) {
        const RotaryCall call(*this, rows, 64, 64);
        const std::string what = call.what();
        std::vector<uint16_t> bits(static_cast<size_t>(call.q.numel()));
        Tensor rounded = Tensor::f32(call.q.shape());
        for (size_t i = 0; i < bits.size(); ++i) {
            bits[i] = f32_to_bf16(call.q.f32()[i]);
            rounded.f32()[i] = bf16_to_f32(bits[i]);
        }
        Tensor q32 = on_gpu(rounded), q16 = gpu_->alloc(DType::kBF16, call.q.shape());
        gpu_->upload(q16, bits.data());
        Tensor want = nan_filled(call.q.shape()), got = nan_filled(call.q.shape());
        call.run_gpu(*gpu_, want, q32);
        call.run_gpu(*gpu_, got, q16);
        EXPECT_EQ(download(got), download(want)) << what;
        std::vector<uint16_t> after(bits.size());
        gpu_->download(after.data(), q16);
        EXPECT_EQ(after, bits) << what << ": the bf16 queries were written";

        // Both in bf16 (V4's prefill): the f32 output of the same queries, rounded.
        Tensor both = gpu_->alloc(DType::kBF16, call.q.shape());
        call.run_gpu(*gpu_, both, q16);
        const std::vector<float> f = download(want);
        std::vector<uint16_t> b(f.size());
        gpu_->download(b.data(), both);
        int64_t differ = 0;
        for (size_t i = 0; i < b.size(); ++i) differ += b[i] != f32_to_bf16(f[i]);
        EXPECT_EQ(differ, 0) << what << ": bf16 queries and output, " << differ << " values differ";
    }
}

// In batch-invariant mode a row's attention is bitwise the same alone or among 40 rows (no split of its keys).
// Between the two calls the fp32 kernel changes its head groups (8 and 4 heads), the tensor-core kernel its head
// tiles (64 and 16 heads) and its key staging (the bf16 table copy for 40 rows, the fp32 gather for one).
TEST_P(CudaAttention, BatchInvariantModeIgnoresRowCount) {
    const int64_t rows = 40, heads = 64, d = 512, nkeys = rows + 128 + 1024;
    const FlatLists f(decode_lists(rows, 128, 512, 1024));
    Tensor q = on_gpu(normal(Shape{rows, heads, d}, 1.0f)), keys = on_gpu(normal(Shape{nkeys, d}, 1.0f));
    Tensor sinks = on_gpu(normal(Shape{heads}, 1.0f));
    Tensor off_d = i32_on_gpu(f.offsets), idx_d = i32_on_gpu(f.indices);
    gpu_->set_batch_invariant(true);
    Tensor all = nan_filled(Shape{rows, heads, d});
    gpu_->sparse_attention(all, q, keys, off_d.as<int32_t>(), idx_d.as<int32_t>(), sinks.f32(), 0.04f);
    const std::vector<float> a = download(all);
    for (int64_t r : {0, 17}) {
        Tensor one = nan_filled(Shape{1, heads, d});
        gpu_->sparse_attention(one, q.view().slice_rows(r, r + 1), keys, off_d.as<int32_t>() + r,
                               idx_d.as<int32_t>(), sinks.f32(), 0.04f);
        EXPECT_EQ(std::vector<float>(a.begin() + r * heads * d, a.begin() + (r + 1) * heads * d), download(one))
            << "row " << r;
    }
    gpu_->set_batch_invariant(false);
}

// V4-Flash's indexer (64 heads x 128) at 1 to 300 rows and 0 to 5000 entries (the tensor-core kernel's tiles are
// 128 or 512 entries: partial tiles, warps without entries, several tiles, rows grouped per block), and odd shapes:
// heads 1, 3, 17 (one m16 tile, mostly padding) and 65 (a fifth tile); c = 1, 7, 130, 257 (scalar query staging
// and key loads; padded to 64, 256, 512) and 64; q, keys and weights off their vector alignment; a dim above the
// tensor-core kernel's 512 (the fp32 kernel in every mode).
void IndexerFixture::scores_shapes() {
    for (int64_t t : {1, 2, 37, 300})
        for (int64_t entries : {0, 1, 5, 63, 64, 65, 1024, 5000}) check_indexer(t, 64, 128, entries);
    for (int64_t heads : {1, 3, 17, 65})
        for (int64_t c : {1, 7, 64, 130, 257}) {
            check_indexer(2, heads, c, 63);
            check_indexer(37, heads, c, 129);
            check_indexer(300, heads, c, 5);
        }
    check_indexer(1, 64, 128, 16384);  // long context at decode
    check_indexer(37, 64, 128, 1000, true);
    check_indexer(5, 3, 64, 100, true);
    check_indexer(3, 5, 600, 70);
}

// A row's scores are bitwise the same alone or among many rows (the tensor-core kernel takes other entry tiles
// and row groups then), and in batch-invariant mode.
void IndexerFixture::batch_invariant() {
    struct Case {
        int64_t t, heads, c, entries;
    };
    for (Case k : {Case{200, 64, 128, 1024}, Case{300, 17, 130, 70}}) {
        Tensor iq = on_gpu(normal(Shape{k.t, k.heads, k.c}, 1.0f)), ik = on_gpu(normal(Shape{k.entries, k.c}, 1.0f));
        Tensor iw = on_gpu(normal(Shape{k.t, k.heads}, 1.0f));
        Tensor s_all = nan_filled(Shape{k.t, k.entries});
        gpu_->indexer_scores(s_all, iq, ik, iw, 0.1f);
        const std::vector<float> sa = download(s_all);
        gpu_->set_batch_invariant(true);
        Tensor s_bi = nan_filled(Shape{k.t, k.entries});
        gpu_->indexer_scores(s_bi, iq, ik, iw, 0.1f);
        EXPECT_EQ(download(s_bi), sa) << "heads " << k.heads << ": batch-invariant mode";
        for (int64_t r : {int64_t{0}, int64_t{7}, k.t - 1}) {
            Tensor s_one = nan_filled(Shape{1, k.entries});
            gpu_->indexer_scores(s_one, iq.view().slice_rows(r, r + 1), ik, iw.view().slice_rows(r, r + 1), 0.1f);
            EXPECT_EQ(std::vector<float>(sa.begin() + r * k.entries, sa.begin() + (r + 1) * k.entries),
                      download(s_one))
                << "heads " << k.heads << " row " << r;
        }
        gpu_->set_batch_invariant(false);
    }
}

// Several sequences' rows in one call each (indexer_scores_rows, indexer_select_rows), as the V4 model batches its
// CSA layers: per sequence its own keys of one table and its own key-list base. The CPU runs each sequence
// through the single-sequence ops. Rows without entries write nothing; columns past a row's count stay
// untouched; each sequence's scores are bitwise those of indexer_scores on its rows alone.
void IndexerFixture::rows_of_several_sequences(const std::vector<IndexerSeq>& seqs) {
    const int64_t heads = 64, c = 128, k = 512;
    std::vector<int32_t> begin, count, starts, limits, bases;
    int64_t t = 0, total = 0, slots = 0, widest = 0;
    for (size_t i = 0; i < seqs.size(); ++i) {
        for (int64_t r = 0; r < seqs[i].rows; ++r, ++t) {
            begin.push_back(static_cast<int32_t>(total));
            count.push_back(static_cast<int32_t>(seqs[i].count));
            limits.push_back(static_cast<int32_t>(std::max<int64_t>(0, seqs[i].count - t % 2)));  // one less
            starts.push_back(static_cast<int32_t>(slots + 3));  // gaps that must stay untouched
            bases.push_back(static_cast<int32_t>(100 * i + 7));
            slots += 3 + std::min<int64_t>(k, limits.back());
        }
        total += seqs[i].count;
        widest = std::max(widest, seqs[i].count);
    }
    Tensor q = normal(Shape{t, heads, c}, 1.0f), keys = normal(Shape{total, c}, 1.0f);
    Tensor w = normal(Shape{t, heads}, 1.0f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c));
    Tensor qd = on_gpu(q), kd = on_gpu(keys), wd = on_gpu(w);
    Tensor out = nan_filled(Shape{t, widest});
    gpu_->indexer_scores_rows(out, qd, kd, wd, i32_on_gpu(begin), i32_on_gpu(count), scale);
    const std::vector<float> got = download(out);
    const bool tc = tc_indexer(heads, c);

    // Per sequence: the written columns against the CPU and against the single-sequence op; the rest untouched.
    Tensor ref = Tensor::f32(Shape{t, widest});  // the CPU's scores, zero past each row's count (for the picks)
    std::fill(ref.f32(), ref.f32() + ref.numel(), 0.0f);
    IndexerRefs all;  // the written columns of every row
    std::vector<float> own_all, got_all;
    int64_t row0 = 0, key0 = 0;
    for (const IndexerSeq& sq : seqs) {
        const std::string what = "sequence at row " + std::to_string(row0) + " (" + std::to_string(sq.rows) +
                                 " rows x " + std::to_string(sq.count) + " keys)";
        for (int64_t r = row0; r < row0 + sq.rows; ++r)
            for (int64_t e = sq.count; e < widest; ++e)
                ASSERT_TRUE(std::isnan(got[r * widest + e])) << what << ": row " << r << " column " << e << " written";
        if (sq.count > 0) {
            Tensor qs = Tensor::f32(Shape{sq.rows, heads, c}), ks = Tensor::f32(Shape{sq.count, c});
            Tensor ws = Tensor::f32(Shape{sq.rows, heads});
            std::copy(q.f32() + row0 * heads * c, q.f32() + (row0 + sq.rows) * heads * c, qs.f32());
            std::copy(keys.f32() + key0 * c, keys.f32() + (key0 + sq.count) * c, ks.f32());
            std::copy(w.f32() + row0 * heads, w.f32() + (row0 + sq.rows) * heads, ws.f32());
            const IndexerRefs r = cpu_indexer(qs, ks, ws, scale, tc);
            Tensor own = nan_filled(Shape{sq.rows, sq.count});
            gpu_->indexer_scores(own, qd.view().slice_rows(row0, row0 + sq.rows),
                                 kd.view().slice_rows(key0, key0 + sq.count),
                                 wd.view().slice_rows(row0, row0 + sq.rows), scale);
            const std::vector<float> own_h = download(own);
            for (int64_t i = 0; i < sq.rows; ++i) {
                const float* g = got.data() + (row0 + i) * widest;
                got_all.insert(got_all.end(), g, g + sq.count);
                std::copy(r.ref.begin() + i * sq.count, r.ref.begin() + (i + 1) * sq.count,
                          ref.f32() + (row0 + i) * widest);
            }
            own_all.insert(own_all.end(), own_h.begin(), own_h.end());
            all.ref.insert(all.ref.end(), r.ref.begin(), r.ref.end());
            all.ref16.insert(all.ref16.end(), r.ref16.begin(), r.ref16.end());
            all.mag.insert(all.mag.end(), r.mag.begin(), r.mag.end());
        }
        row0 += sq.rows;
        key0 += sq.count;
    }
    EXPECT_EQ(got_all, own_all) << "the rows form against indexer_scores per sequence";
    expect_indexer_close(got_all, all, heads, c,
                         std::to_string(t) + " rows of " + std::to_string(seqs.size()) + " sequences");

    // The picks from the same (CPU) scores: bitwise the CPU's.
    Tensor hs(DType::kI32, Shape{t}), hl(DType::kI32, Shape{t}), hb(DType::kI32, Shape{t});
    std::copy(starts.begin(), starts.end(), hs.view().as<int32_t>());
    std::copy(limits.begin(), limits.end(), hl.view().as<int32_t>());
    std::copy(bases.begin(), bases.end(), hb.view().as<int32_t>());
    Tensor picks_ref(DType::kI32, Shape{slots + 1});
    std::fill(picks_ref.view().as<int32_t>(), picks_ref.view().as<int32_t>() + picks_ref.numel(), -9);
    cpu_->indexer_select_rows(picks_ref, hs, ref, hl, hb, static_cast<int>(k));
    Tensor picks = gpu_->alloc(DType::kI32, picks_ref.shape());
    const std::vector<int32_t> fill(picks_ref.numel(), -9);
    gpu_->upload(picks, fill.data());
    gpu_->indexer_select_rows(picks, i32_on_gpu(starts), on_gpu(ref), i32_on_gpu(limits), i32_on_gpu(bases),
                              static_cast<int>(k));
    std::vector<int32_t> got_picks(picks_ref.numel());
    gpu_->download(got_picks.data(), picks);
    for (int64_t i = 0; i < picks_ref.numel(); ++i)
        ASSERT_EQ(got_picks[i], picks_ref.view().as<int32_t>()[i]) << "slot " << i;
}

TEST_F(CudaIndexer, BatchInvariant) { batch_invariant(); }
TEST_F(CudaIndexerTiled, BatchInvariant) { batch_invariant(); }
TEST_F(CudaIndexer, ScoresShapes) { scores_shapes(); }
TEST_F(CudaIndexerTiled, ScoresShapes) { scores_shapes(); }

// Sequences of (rows, keys). Decode: one row per sequence, ragged counts, a sequence without entries.
// Prefill-like: sequences of many rows; the tensor-core kernel's row groups (on an H200: 4 and 8 rows) hold
// sequence boundaries, rows of different key ranges and rows whose keys end before a block's entries.
const std::vector<IndexerSeq> kDecodeSeqs = {{1, 1024}, {1, 0}, {1, 37}, {1, 2000}, {1, 600}, {1, 512}};
const std::vector<IndexerSeq> kPrefillSeqs = {{70, 600}, {1, 0}, {3, 37}, {130, 512}, {2, 2000}, {45, 64}, {300, 129}};
const std::vector<IndexerSeq> kLongSeqs = {{1500, 100}, {700, 512}, {5, 0}, {900, 65}};
TEST_F(CudaIndexer, RowsOfSeveralSequences) {
    for (const auto* seqs : {&kDecodeSeqs, &kPrefillSeqs, &kLongSeqs}) rows_of_several_sequences(*seqs);
}
TEST_F(CudaIndexerTiled, RowsOfSeveralSequences) {
    for (const auto* seqs : {&kDecodeSeqs, &kPrefillSeqs, &kLongSeqs}) rows_of_several_sequences(*seqs);
}

}  // namespace
}  // namespace deepinfer
