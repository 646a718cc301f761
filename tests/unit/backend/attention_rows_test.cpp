// Backend::sparse_attention_rows on the CPU backend (the default: the rows gathered into a table) gives bitwise
// sparse_attention's output on that table when the rows are the table's in another order and the indices follow
// them; a row list of I32 instead of I64 addresses is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "backend/backend.h"
#include "deepinfer/error.h"

namespace deepinfer {
namespace {

TEST(SparseAttentionRows, AddressedRowsMatchTheTable) {
    auto be = create_backend("cpu", 1);
    const int64_t t = 3, heads = 4, d = 8, nkeys = 20;
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    Tensor q(DType::kF32, Shape{t, heads, d}), keys(DType::kF32, Shape{nkeys, d}), sinks(DType::kF32, Shape{heads});
    for (Tensor* x : {&q, &keys, &sinks})
        for (int64_t i = 0; i < x->numel(); ++i) x->f32()[i] = normal(rng);
    // Row lists: repeats, an empty list, keys from anywhere in the table.
    const std::vector<int32_t> offsets = {0, 5, 5, 12};
    const std::vector<int32_t> indices = {0, 3, 3, 19, 7, 1, 2, 4, 8, 16, 11, 19};
    Tensor ref(DType::kF32, q.shape());
    be->sparse_attention(ref, q, keys, offsets.data(), indices.data(), sinks.f32(), 0.35f);

    // Address list: entry i is table row perm[i]; an index k of the table becomes inv[k].
    std::vector<int32_t> perm(nkeys), inv(nkeys);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int32_t i = 0; i < nkeys; ++i) inv[perm[i]] = i;
    Tensor rows(DType::kI64, Shape{nkeys});
    for (int64_t i = 0; i < nkeys; ++i)
        rows.view().as<int64_t>()[i] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(keys.f32() + perm[i] * d));
    std::vector<int32_t> remapped(indices.size());
    std::transform(indices.begin(), indices.end(), remapped.begin(), [&](int32_t k) { return inv[k]; });
    Tensor out(DType::kF32, q.shape());
    std::fill_n(out.f32(), out.numel(), NAN);
    be->sparse_attention_rows(out, q, rows, offsets.data(), remapped.data(), sinks.f32(), 0.35f);
    EXPECT_EQ(std::vector<float>(out.f32(), out.f32() + out.numel()),
              std::vector<float>(ref.f32(), ref.f32() + ref.numel()));

    Tensor wrong(DType::kI32, Shape{nkeys});
    EXPECT_THROW(be->sparse_attention_rows(out, q, wrong, offsets.data(), remapped.data(), sinks.f32(), 0.35f), Error);
}

}  // namespace
}  // namespace deepinfer
