// The CUDA sparse attention and lightning-indexer kernels against the CPU ops (the oracle) at the shapes of
// DeepSeek-V4-Flash decode and prefill and at small odd ones, on fresh random inputs each run, outputs poisoned
// with NaN first. Sparse attention has two kernels, each test runs on both:
//  - fp32 SIMT (DEEPINFER_CUDA_GEMM=tiled): max |cuda - cpu| / max |cpu| <= 1e-5 (fp32 on both sides), as in
//    cuda_ops_test.cpp; the indexer (one fp32 kernel in every mode) likewise.
//  - tensor cores (the default mode): 3e-2, the tolerance table's GPU bound, against the CPU op; and 4e-3
//    against the CPU op fed the same bf16-rounded q and keys. What is left then is the rounding of the
//    probabilities to bf16 for the product with V (relative 2^-9 per weight, random in sign, so ~2^-9 / sqrt(3)
//    = 1.1e-3 of the output's size; an emulation of the kernel's arithmetic on the CPU gives 0.7-1.7e-3 over
//    these shapes), while a wrong fragment, tile or rescale moves the output by far more than 1e-2.
// Head dims above 512 take the fp32 kernel in every mode (the tensor-core kernel covers V4's 512).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
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

    void check_indexer(int64_t t, int64_t heads, int64_t c, int64_t entries) {
        Tensor q = normal(Shape{t, heads, c}, 1.0f), keys = normal(Shape{entries, c}, 1.0f);
        Tensor w = normal(Shape{t, heads}, 1.0f);
        const float scale = 1.0f / std::sqrt(static_cast<float>(c));
        Tensor ref = Tensor::f32(Shape{t, entries});
        cpu_->indexer_scores(ref, q, keys, w, scale);
        Tensor qd = on_gpu(q), kd = on_gpu(keys), wd = on_gpu(w), out = nan_filled(Shape{t, entries});
        gpu_->indexer_scores(out, qd, kd, wd, scale);
        EXPECT_LE(rel_error(download(out), host_values(ref)), kBound)
            << "rows " << t << " heads " << heads << " dim " << c << " entries " << entries;
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

// The indexer: one fp32 kernel in every mode.
class CudaIndexer : public AttentionFixture {
public:
    CudaIndexer() : AttentionFixture("auto") {}
};

// V4-Flash decode: 64 heads x 512, 128 window keys + 512 selected of 1024 entries per row (4k context), one
// row (the key list split over a cluster), 8 and 33 rows; some rows have no keys at all (only the sink). On the
// tensor cores (H200) 1 and 8 rows take blocks of 16 heads split 8 and 4 ways, 33 rows blocks of 64 heads split
// 4 ways, all gathering fp32 keys; 70 rows with a larger table take 64-head blocks without a split.
TEST_P(CudaAttention, SparseAttentionDecodeShapes) {
    for (int64_t rows : {1, 8, 33}) {
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

// Every list empty: the sink is the whole denominator and the value is zero.
TEST_P(CudaAttention, SparseAttentionEmptyListsGiveZeros) {
    Tensor q = normal(Shape{5, 64, 512}, 1.0f), keys = normal(Shape{3, 512}, 1.0f), sinks = normal(Shape{64}, 1.0f);
    std::vector<float> ref;
    const std::vector<float> out = attend(q, keys, sinks, KeyLists(5), &ref);
    EXPECT_EQ(out, ref);
    EXPECT_EQ(out, std::vector<float>(out.size(), 0.0f));
}

// Logits far from the sink and from each other: integer inputs make the logits exact on both backends (and
// exact in bf16), so the bound tests the online softmax alone.
TEST_P(CudaAttention, SparseAttentionExtremeLogits) {
    const int64_t heads = 64, d = 512, rows = 3, nkeys = 700;
    const KeyLists lists = decode_lists(rows, 128, 512, nkeys - rows - 128);
    Tensor keys = integers(Shape{nkeys, d}, 1, 2);
    std::vector<float> ref;
    struct Case {
        int q_lo, q_hi;
        float sink;
        const char* what;
    };
    for (Case c : {Case{-1, -1, 0.0f, "logits -45 .. -22, sink 0"}, Case{3, 3, -1e4f, "logits 68 .. 136, sink -1e4"},
                   Case{-40, 40, 0.0f, "logits spread over hundreds"}, Case{1, 1, 1e3f, "sink far above"}}) {
        Tensor q = integers(Shape{rows, heads, d}, c.q_lo, c.q_hi);
        Tensor sinks = Tensor::f32(Shape{heads});
        for (int64_t h = 0; h < heads; ++h) sinks.f32()[h] = c.sink + static_cast<float>(h % 3);
        const std::vector<float> out = attend(q, keys, sinks, lists, &ref);
        expect_close(out, ref, q, keys, sinks, lists, c.what);
    }
}

// A NaN in one query element makes its (row, head) NaN, as on the CPU (its logits are all NaN), and nothing else.
TEST_P(CudaAttention, SparseAttentionNanStaysInItsHead) {
    const int64_t heads = 64, d = 512, rows = 3, bad = 1 * heads + 5;
    const KeyLists lists = decode_lists(rows, 128, 512, 1024);
    Tensor q = normal(Shape{rows, heads, d}, 1.0f), keys = normal(Shape{rows + 128 + 1024, d}, 1.0f);
    Tensor sinks = normal(Shape{heads}, 1.0f);
    q.f32()[bad * d + 7] = std::numeric_limits<float>::quiet_NaN();
    std::vector<float> ref;
    std::vector<float> out = attend(q, keys, sinks, lists, &ref);
    for (size_t i = 0; i < out.size(); ++i) {
        const bool in_head = static_cast<int64_t>(i) / d == bad;
        ASSERT_EQ(std::isnan(ref[i]), in_head) << "CPU element " << i;
        ASSERT_EQ(std::isnan(out[i]), in_head) << "element " << i;
        if (in_head) out[i] = ref[i] = 0.0f;
    }
    EXPECT_LE(rel_error(out, ref), tensor_cores() ? kBf16Bound : kBound);
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

// The indexer's scores of a row are the same alone or among 200 rows.
TEST_F(CudaIndexer, BatchInvariant) {
    const int64_t t = 200, hi = 64, c = 128, entries = 1024;
    Tensor iq = on_gpu(normal(Shape{t, hi, c}, 1.0f)), ik = on_gpu(normal(Shape{entries, c}, 1.0f));
    Tensor iw = on_gpu(normal(Shape{t, hi}, 1.0f));
    Tensor s_all = nan_filled(Shape{t, entries}), s_one = nan_filled(Shape{1, entries});
    gpu_->indexer_scores(s_all, iq, ik, iw, 0.1f);
    gpu_->indexer_scores(s_one, iq.view().slice_rows(7, 8), ik, iw.view().slice_rows(7, 8), 0.1f);
    const std::vector<float> sa = download(s_all), so = download(s_one);
    EXPECT_EQ(std::vector<float>(sa.begin() + 7 * entries, sa.begin() + 8 * entries), so);
}

// V4-Flash indexer (64 heads x 128) and odd ones, from no entries to more than a tile row can hold.
TEST_F(CudaIndexer, ScoresShapes) {
    struct HeadShape {
        int64_t heads, c;
    };
    for (int64_t t : {1, 8, 200})
        for (HeadShape h : {HeadShape{64, 128}, HeadShape{16, 48}, HeadShape{3, 32}, HeadShape{5, 30}})
            for (int64_t entries : {0, 1, 5, 1024, 5000}) check_indexer(t, h.heads, h.c, entries);
    check_indexer(1, 64, 128, 16384);  // long context at decode
}

// Several sequences' rows in one call each (indexer_scores_rows, indexer_select_rows): per row its own keys of
// one table and its own key-list base, as the V4 model batches its CSA layers; the CPU runs the single-sequence
// ops row by row. Rows without entries write nothing; columns past a row's count stay untouched.
TEST_F(CudaIndexer, RowsOfSeveralSequences) {
    const int64_t heads = 64, c = 128, k = 512;
    const std::vector<int64_t> counts = {1024, 0, 37, 2000, 600, 512};  // per row (one decode row per sequence)
    const int64_t t = static_cast<int64_t>(counts.size());
    std::vector<int32_t> begin, count, starts, limits, bases;
    int64_t total = 0, slots = 0, widest = 0;
    for (int64_t r = 0; r < t; ++r) {
        begin.push_back(static_cast<int32_t>(total));
        count.push_back(static_cast<int32_t>(counts[r]));
        limits.push_back(static_cast<int32_t>(counts[r] - (r % 2)));  // some rows see one entry less
        if (counts[r] == 0) limits.back() = 0;
        starts.push_back(static_cast<int32_t>(slots + 3));             // gaps that must stay untouched
        bases.push_back(static_cast<int32_t>(100 * r + 7));
        slots += 3 + std::min<int64_t>(k, limits.back());
        total += counts[r];
        widest = std::max(widest, counts[r]);
    }
    Tensor q = normal(Shape{t, heads, c}, 1.0f), keys = normal(Shape{total, c}, 1.0f), w = normal(Shape{t, heads}, 1.0f);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c));
    auto host_i32 = [](const std::vector<int32_t>& v) {
        Tensor h(DType::kI32, Shape{static_cast<int64_t>(v.size())});
        std::copy(v.begin(), v.end(), h.view().as<int32_t>());
        return h;
    };
    Tensor hb = host_i32(begin), hc = host_i32(count), hs = host_i32(starts), hl = host_i32(limits),
           hbase = host_i32(bases);
    Tensor ref = Tensor::f32(Shape{t, widest});
    std::fill(ref.f32(), ref.f32() + ref.numel(), std::numeric_limits<float>::quiet_NaN());
    cpu_->indexer_scores_rows(ref, q, keys, w, hb, hc, scale);
    Tensor out = nan_filled(Shape{t, widest});
    gpu_->indexer_scores_rows(out, on_gpu(q), on_gpu(keys), on_gpu(w), i32_on_gpu(begin), i32_on_gpu(count), scale);
    const std::vector<float> got = download(out);
    double max_ref = 0, max_diff = 0;
    for (int64_t r = 0; r < t; ++r)
        for (int64_t e = 0; e < widest; ++e) {
            const float a = got[r * widest + e], b = ref.f32()[r * widest + e];
            if (e >= counts[r]) {
                EXPECT_TRUE(std::isnan(a)) << "row " << r << " column " << e << " past its keys was written";
                continue;
            }
            ASSERT_FALSE(std::isnan(a)) << "row " << r << " entry " << e;
            max_ref = std::max(max_ref, static_cast<double>(std::fabs(b)));
            max_diff = std::max(max_diff, static_cast<double>(std::fabs(a - b)));
        }
    EXPECT_LE(max_diff / max_ref, kBound);

    // The picks from the same (CPU) scores, with the rest of the rows made finite: bitwise the CPU's.
    for (int64_t i = 0; i < ref.numel(); ++i)
        if (std::isnan(ref.f32()[i])) ref.f32()[i] = 0.0f;
    Tensor picks_ref(DType::kI32, Shape{slots + 1});
    std::fill(picks_ref.view().as<int32_t>(), picks_ref.view().as<int32_t>() + picks_ref.numel(), -9);
    cpu_->indexer_select_rows(picks_ref, hs, ref, hl, hbase, static_cast<int>(k));
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

}  // namespace
}  // namespace deepinfer
