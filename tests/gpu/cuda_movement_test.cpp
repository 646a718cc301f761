// Row movement on the GPU against the CPU backend, bitwise (copies have no rounding): gather_rows and scatter_rows
// over rows of every alignment and width (the float4 path and the scalar one), copy_rows (address pairs of mixed
// widths), fill_index_ranges and fill_row_addresses; the asynchronous download (download_async, wait_downloads).
#include <gtest/gtest.h>

#include <cstdio>
#include <algorithm>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"

namespace deepinfer {
namespace {

std::vector<float> fetch(Backend& be, TensorView t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    be.download(v.data(), t);
    return v;
}

// A fill op (fill_index_ranges, fill_row_addresses) over dst = init with runs [rows, cols] on the CPU and on the GPU:
// the same entries, those the runs leave alone included.
template <typename T>
void expect_fill_matches_cpu(Backend& cpu, Backend& gpu, void (Backend::*fill)(TensorView, TensorView), DType dtype,
                             const std::vector<T>& init, const std::vector<T>& runs, int64_t cols) {
    const int64_t size = static_cast<int64_t>(init.size()), rows = static_cast<int64_t>(runs.size()) / cols;
    Tensor want(dtype, Shape{size}), runs_h(dtype, Shape{rows, cols});
    std::copy(init.begin(), init.end(), want.view().as<T>());
    std::copy(runs.begin(), runs.end(), runs_h.view().as<T>());
    (cpu.*fill)(want, runs_h);
    Tensor got_d = gpu.alloc(dtype, Shape{size}), runs_d = to_backend(gpu, runs_h);
    gpu.upload(got_d, init.data());
    (gpu.*fill)(got_d, runs_d);
    std::vector<T> got(static_cast<size_t>(size));
    gpu.download(got.data(), got_d);
    for (int64_t i = 0; i < size; ++i) ASSERT_EQ(got[i], want.view().as<T>()[i]) << "entry " << i;
}

TEST(CudaMovement, GatherAndScatterMatchTheCpu) {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    auto gpu = create_backend("cuda", 2);
    std::mt19937 rng(17);
    // Widths: float4 rows (512, 4096; 128 and 200 / 256, a warp / two a row, 4 / 2 rows a block), odd ones (scalar
    // path, a warp a row), a row shorter than a warp.
    for (const int64_t c : {512, 4096, 128, 200, 256, 13, 3}) {
        const int64_t pool_rows = 300, r = 70001;  // more than 65,535 rows, not a whole number of blocks of 2 or 4
        std::vector<float> pool(static_cast<size_t>(pool_rows * c + 1));
        for (float& v : pool) v = static_cast<float>(rng() % 100000);
        Tensor pool_d = gpu->alloc(DType::kF32, Shape{static_cast<int64_t>(pool.size())});
        gpu->upload(pool_d, pool.data());
        // Row i reads pool row picks[i], shifted by one float for every third row (misaligned for float4).
        std::vector<int64_t> picks(static_cast<size_t>(r)), offsets(static_cast<size_t>(r));
        std::vector<float*> addresses(static_cast<size_t>(r));
        for (int64_t i = 0; i < r; ++i) {
            picks[i] = static_cast<int64_t>(rng() % pool_rows);
            offsets[i] = picks[i] * c + (i % 3 == 0 ? 1 : 0);
            addresses[i] = pool_d.f32() + offsets[i];
        }
        Tensor rows_d = gpu->alloc(DType::kI64, Shape{r});
        gpu->upload(rows_d, addresses.data());
        Tensor gathered = gpu->alloc(DType::kF32, Shape{r, c});
        gpu->gather_rows(gathered, rows_d);
        const std::vector<float> got = fetch(*gpu, gathered);
        for (int64_t i = 0; i < r; i += 7)
            for (int64_t j = 0; j < c; ++j)
                ASSERT_EQ(got[i * c + j], pool[offsets[i] + j]) << "c " << c << " row " << i << " col " << j;

        // Scatter the first distinct rows back to fresh places (every destination written once).
        const int64_t n = pool_rows - 1;
        std::vector<float*> dst(static_cast<size_t>(n));
        Tensor out_d = gpu->alloc(DType::kF32, Shape{n * (c + 1) + 1});
        for (int64_t i = 0; i < n; ++i) dst[i] = out_d.f32() + (n - 1 - i) * (c + 1) + (i % 2);
        Tensor dst_d = gpu->alloc(DType::kI64, Shape{n});
        gpu->upload(dst_d, dst.data());
        gpu->scatter_rows(dst_d, gathered.view().slice_rows(0, n));
        const std::vector<float> out = fetch(*gpu, out_d);
        for (int64_t i = 0; i < n; ++i)
            for (int64_t j = 0; j < c; ++j)
                ASSERT_EQ(out[(n - 1 - i) * (c + 1) + (i % 2) + j], got[i * c + j]) << "c " << c << " row " << i;
    }
}

// copy_rows: address pairs of mixed widths in one call (the ring and window rows of a layer: 512, 1024, 256 floats,
// and odd widths on the scalar path), sources and destinations misaligned for float4 on some rows, more rows than a
// grid row of blocks covers twice over; every float outside the destinations left as it was, a zero-width row a no-op.
TEST(CudaMovement, CopyRowsOfMixedWidths) {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    auto gpu = create_backend("cuda", 2);
    std::mt19937 rng(23);
    const std::vector<int32_t> widths = {512, 1024, 256, 13, 0, 3, 4096};
    const int64_t r = 5003, slot = 4100;  // each row's source and destination slots of `slot` floats
    std::vector<float> src(static_cast<size_t>(r * slot)), dst_init(static_cast<size_t>(r * slot));
    for (float& v : src) v = static_cast<float>(rng() % 100000);
    for (float& v : dst_init) v = -1.0f - static_cast<float>(rng() % 7);
    Tensor src_d = gpu->alloc(DType::kF32, Shape{r * slot}), dst_d = gpu->alloc(DType::kF32, Shape{r * slot});
    gpu->upload(src_d, src.data());
    gpu->upload(dst_d, dst_init.data());
    std::vector<float*> from(static_cast<size_t>(r)), to(static_cast<size_t>(r));
    std::vector<int32_t> cols(static_cast<size_t>(r));
    std::vector<int64_t> from_at(static_cast<size_t>(r)), to_at(static_cast<size_t>(r));
    for (int64_t i = 0; i < r; ++i) {
        cols[i] = widths[i % widths.size()];
        from_at[i] = i * slot + (i % 5 == 1 ? 1 : 0);
        to_at[i] = (r - 1 - i) * slot + (i % 3 == 2 ? 2 : 0);  // destinations in the other order
        from[i] = src_d.f32() + from_at[i];
        to[i] = dst_d.f32() + to_at[i];
    }
    Tensor from_d = gpu->alloc(DType::kI64, Shape{r}), to_d = gpu->alloc(DType::kI64, Shape{r});
    Tensor cols_d = gpu->alloc(DType::kI32, Shape{r});
    gpu->upload(from_d, from.data());
    gpu->upload(to_d, to.data());
    gpu->upload(cols_d, cols.data());
    gpu->copy_rows(to_d, from_d, cols_d);
    std::vector<float> want = dst_init;
    for (int64_t i = 0; i < r; ++i) std::copy_n(src.begin() + from_at[i], cols[i], want.begin() + to_at[i]);
    const std::vector<float> got = fetch(*gpu, dst_d);
    for (int64_t i = 0; i < r * slot; ++i) ASSERT_EQ(got[i], want[i]) << "float " << i;
}

TEST(CudaMovement, FillIndexRangesMatchesTheCpu) {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    auto cpu = create_backend("cpu", 0);
    auto gpu = create_backend("cuda", 2);
    std::mt19937 rng(5);
    const int64_t rows = 70000;
    std::vector<int32_t> runs;
    int64_t size = 0;
    for (int64_t q = 0; q < rows; ++q) {
        const int32_t na = static_cast<int32_t>(rng() % 130), nb = static_cast<int32_t>(q % 5 == 0 ? 0 : rng() % 600);
        const int32_t gap = static_cast<int32_t>(q % 3 == 0 ? rng() % 512 : 0);  // CSA slots left alone
        runs.insert(runs.end(), {static_cast<int32_t>(size), static_cast<int32_t>(rng() % 100000), na,
                                 static_cast<int32_t>(rng() % 100000), nb});
        size += na + nb + gap;
    }
    std::vector<int32_t> init(static_cast<size_t>(size));
    for (int32_t& v : init) v = -1 - static_cast<int32_t>(rng() % 7);
    expect_fill_matches_cpu(*cpu, *gpu, &Backend::fill_index_ranges, DType::kI32, init, runs, 5);
}

TEST(CudaMovement, FillRowAddressesMatchesTheCpu) {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    auto cpu = create_backend("cpu", 0);
    auto gpu = create_backend("cuda", 2);
    std::mt19937_64 rng(6);
    const int64_t runs_n = 20000;
    std::vector<int64_t> runs;
    int64_t size = 0;
    for (int64_t q = 0; q < runs_n; ++q) {
        const int64_t count =
            q % 7 == 0 ? 0 : static_cast<int64_t>(rng() % 1100);  // one block, up to ~9 passes of its threads
        const int64_t gap = q % 3 == 0 ? static_cast<int64_t>(rng() % 50) : 0;      // entries left alone
        runs.insert(runs.end(),
                    {size, static_cast<int64_t>(rng() >> 8), count, 16 * static_cast<int64_t>(rng() % 600)});
        size += count + gap;
    }
    std::vector<int64_t> init(static_cast<size_t>(size));
    for (int64_t& v : init) v = -1 - static_cast<int64_t>(rng() % 7);
    expect_fill_matches_cpu(*cpu, *gpu, &Backend::fill_row_addresses, DType::kI64, init, runs, 4);
}

// A fill op over the first n entries of a buffer of n + guard entries, all -7 before; the whole buffer after.
template <typename T>
std::vector<T> fill_prefix(Backend& gpu, void (Backend::*fill)(TensorView, TensorView), DType dtype, int64_t n,
                           int64_t guard, const std::vector<T>& runs, int64_t cols) {
    const std::vector<T> init(static_cast<size_t>(n + guard), T{-7});
    Tensor buf = gpu.alloc(dtype, Shape{n + guard});
    Tensor runs_d = gpu.alloc(dtype, Shape{static_cast<int64_t>(runs.size()) / cols, cols});
    gpu.upload(buf, init.data());
    gpu.upload(runs_d, runs.data());
    (gpu.*fill)(buf.view().slice_rows(0, n), runs_d);
    std::vector<T> got(static_cast<size_t>(n + guard));
    gpu.download(got.data(), buf);
    return got;
}

// Runs reaching outside dst (past its end, before its start) write only their entries inside it: dst is the first
// 100 entries of a 164-entry buffer whose last 64 (and the entries the runs leave alone) must keep their values.
TEST(CudaMovement, FillRunsOutsideTheTargetWriteNothingThere) {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    auto gpu = create_backend("cuda", 2);
    const int64_t n = 100, guard = 64;
    // [90, 106) and [-3, 2).
    const std::vector<int32_t> ranges = fill_prefix<int32_t>(*gpu, &Backend::fill_index_ranges, DType::kI32, n, guard,
                                                             {90, 1000, 8, 2000, 8, -3, 500, 5, 0, 0}, 5);
    for (int64_t i = 0; i < n + guard; ++i) {
        const int64_t want = i < 2 ? 503 + i : i >= 90 && i < 98 ? 910 + i : i >= 98 && i < n ? 1902 + i : -7;
        ASSERT_EQ(ranges[i], want) << "entry " << i;
    }
    // [95, 115).
    const std::vector<int64_t> addresses =
        fill_prefix<int64_t>(*gpu, &Backend::fill_row_addresses, DType::kI64, n, guard, {95, 4096, 20, 16}, 4);
    for (int64_t i = 0; i < n + guard; ++i)
        ASSERT_EQ(addresses[i], i >= 95 && i < n ? 4096 + 16 * (i - 95) : -7) << "entry " << i;
}

// download_async: the bytes of the work queued before it, in dst once wait_downloads returns, whatever is queued
// after it (here a scatter that overwrites the source); several at once, the last larger than the pinned buffer
// so far (it grows after the earlier ones land).
TEST(CudaMovement, AsynchronousDownloads) {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    auto gpu = create_backend("cuda", 2);
    std::vector<std::vector<float>> want;
    std::vector<Tensor> src;
    for (int64_t n : {5, 1000, 300000}) {
        std::vector<float> v(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(i * 3 + n);
        src.push_back(gpu->alloc(DType::kF32, Shape{n}));
        gpu->upload(src.back(), v.data());
        want.push_back(std::move(v));
    }
    std::vector<std::vector<float>> got;
    for (const std::vector<float>& w : want) got.emplace_back(w.size(), -1.0f);
    for (size_t i = 0; i < src.size(); ++i) {
        gpu->download_async(got[i].data(), src[i]);
        // Overwrite the source behind the copy: the copy must see the old values.
        std::vector<float> zeros(want[i].size(), 0.0f);
        Tensor z = gpu->alloc(DType::kF32, Shape{1, static_cast<int64_t>(zeros.size())});
        gpu->upload(z, zeros.data());
        float* at = src[i].f32();
        Tensor rows = gpu->alloc(DType::kI64, Shape{1});
        gpu->upload(rows, &at);
        gpu->scatter_rows(rows, z);
    }
    gpu->wait_downloads();
    for (size_t i = 0; i < src.size(); ++i) EXPECT_EQ(got[i], want[i]) << "download " << i;
    EXPECT_EQ(fetch(*gpu, src[0]), std::vector<float>(5, 0.0f)) << "the scatter ran after the copy";
    gpu->wait_downloads();  // nothing pending: returns
}

}  // namespace
}  // namespace deepinfer
