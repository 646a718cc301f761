// The state/KV manager without a model: block layout, allocation accounting, disjoint memory, no leaks.
#include "kv/state_manager.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>

namespace deepinfer::kv {
namespace {

// The buffers of the v4_tiny_c fixture (window 32, HCA ratio 32 on layer 1, CSA ratio 4 on layers 2 and 3,
// head_dim 48, index_head_dim 48), as the model's StateSpec lists them.
std::vector<BufferDesc> tiny_buffers() {
    return {
        {"l0.window", 48, 40, 0},
        {"l1.window", 48, 40, 0},
        {"l1.compressor_inputs", 96, 40, 0},
        {"l1.compressed", 48, 0, 32},
        {"l2.window", 48, 40, 0},
        {"l2.compressor_inputs", 192, 16, 0},
        {"l2.compressed", 48, 0, 4},
        {"l2.indexer_inputs", 192, 16, 0},
        {"l2.index_keys", 48, 0, 4},
        {"l3.window", 48, 40, 0},
        {"l3.compressor_inputs", 192, 16, 0},
        {"l3.compressed", 48, 0, 4},
        {"l3.indexer_inputs", 192, 16, 0},
        {"l3.index_keys", 48, 0, 4},
    };
}

size_t bytes_of(const BufferDesc& b, int64_t rows) { return static_cast<size_t>(rows * b.row_elems) * 4; }

TEST(KvLayout, RingsAndPagesFitTheirBlocksWithoutOverlap) {
    const std::vector<BufferDesc> bufs = tiny_buffers();
    const Layout l = make_layout(bufs);
    EXPECT_EQ(l.block_tokens % 32, 0);  // a multiple of every ratio
    EXPECT_GE(l.block_tokens, 16);
    EXPECT_EQ(l.block_bytes % 64, 0u);
    EXPECT_LE(l.page_bytes, l.block_bytes);
    // Per ring block: the byte intervals of its rings are inside the block and disjoint.
    std::map<int64_t, std::vector<std::pair<size_t, size_t>>> per_block;
    size_t ring_bytes = 0, paged_per_page = 0;
    for (size_t i = 0; i < bufs.size(); ++i) {
        const Layout::Place& p = l.places[i];
        if (bufs[i].ring_rows > 0) {
            const size_t n = bytes_of(bufs[i], bufs[i].ring_rows);
            ring_bytes += n;
            ASSERT_GE(p.block, 0);
            ASSERT_LT(p.block, l.ring_blocks);
            EXPECT_EQ(p.offset % 64, 0u);
            EXPECT_LE(p.offset + n, l.block_bytes) << bufs[i].name;
            per_block[p.block].push_back({p.offset, p.offset + n});
        } else {
            EXPECT_EQ(p.rows_per_block * bufs[i].tokens_per_row, l.block_tokens) << bufs[i].name;
            const size_t n = bytes_of(bufs[i], p.rows_per_block);
            paged_per_page += n;
            EXPECT_LE(p.offset + n, l.page_bytes) << bufs[i].name;
            per_block[-1].push_back({p.offset, p.offset + n});
        }
    }
    for (auto& [blk, v] : per_block) {
        std::sort(v.begin(), v.end());
        for (size_t k = 1; k < v.size(); ++k) EXPECT_LE(v[k - 1].second, v[k].first) << "overlap in block " << blk;
    }
    EXPECT_EQ(l.ring_bytes, ring_bytes);
    // Packing slack: rings take at most one block more than their bytes need.
    EXPECT_LE(l.ring_blocks, static_cast<int64_t>(ring_bytes / l.block_bytes) + 2);
    // Bytes per token: the paged rows' own bytes, plus alignment slack.
    const double own = 4.0 * (48.0 / 32 + 2 * (48.0 / 4 + 48.0 / 4));
    EXPECT_DOUBLE_EQ(static_cast<double>(paged_per_page) / static_cast<double>(l.block_tokens), own);
    EXPECT_GE(l.bytes_per_token(), own);
    std::printf("tiny_c layout: block %zu B, %lld tokens/page, %lld ring blocks; %.1f B/token (model: %.1f)\n",
                l.block_bytes, static_cast<long long>(l.block_tokens), static_cast<long long>(l.ring_blocks),
                l.bytes_per_token(), own);
}

TEST(KvLayout, BlockFormula) {
    const Layout l = make_layout(tiny_buffers(), 64);
    EXPECT_EQ(l.block_tokens, 64);
    EXPECT_EQ(l.blocks_for(0), l.ring_blocks);
    EXPECT_EQ(l.blocks_for(1), l.ring_blocks + 1);
    EXPECT_EQ(l.blocks_for(64), l.ring_blocks + 1);
    EXPECT_EQ(l.blocks_for(65), l.ring_blocks + 2);
}

TEST(KvLayout, RejectsBadInput) {
    EXPECT_THROW(make_layout(tiny_buffers(), 48), Error);  // not a multiple of 32
    EXPECT_THROW(make_layout(std::vector<BufferDesc>{}), Error);
    EXPECT_THROW(make_layout(std::vector<BufferDesc>{{"x", 4, 2, 4}}), Error);  // ring and paged at once
    EXPECT_THROW(StateManager(tiny_buffers(), 1000), Error);                    // budget below one sequence
}

TEST(KvLayout, OnlyRingsMeansNoGrowth) {
    StateManager m({{"w", 8, 10, 0}, {"v", 8, 20, 0}}, 1 << 20);
    EXPECT_EQ(m.layout().block_tokens, 0);
    ASSERT_TRUE(m.allocate(1, 100000));
    EXPECT_EQ(m.blocks_held(1), m.layout().ring_blocks);
    EXPECT_TRUE(m.grow(1, 1 << 30));
    EXPECT_EQ(m.blocks_held(1), m.layout().ring_blocks);
    m.release(1);
    EXPECT_TRUE(m.whole());
}

TEST(KvManager, AllocationFollowsTheFormulaAndFailsWithoutSideEffects) {
    const Layout l = make_layout(tiny_buffers());
    const int64_t blocks = l.blocks_for(1) * 3 + 2;
    StateManager m(tiny_buffers(), blocks * l.block_bytes);
    ASSERT_EQ(m.pool().num_blocks(), blocks);
    ASSERT_TRUE(m.allocate(7, 1));
    EXPECT_EQ(m.blocks_held(7), l.blocks_for(1));
    EXPECT_GE(m.token_capacity(7), 1);
    ASSERT_TRUE(m.grow(7, 3 * l.block_tokens));
    EXPECT_EQ(m.blocks_held(7), l.blocks_for(3 * l.block_tokens));
    EXPECT_EQ(m.token_capacity(7), 3 * l.block_tokens);
    ASSERT_TRUE(m.grow(7, 5));  // shrinking requests keep what is held
    EXPECT_EQ(m.blocks_held(7), l.blocks_for(3 * l.block_tokens));
    const int64_t free_before = m.num_free_blocks();
    EXPECT_FALSE(m.grow(7, 1000 * l.block_tokens));
    EXPECT_EQ(m.num_free_blocks(), free_before);
    EXPECT_EQ(m.blocks_held(7), l.blocks_for(3 * l.block_tokens));
    EXPECT_FALSE(m.allocate(8, 1000 * l.block_tokens));
    EXPECT_FALSE(m.contains(8));
    EXPECT_EQ(m.num_free_blocks(), free_before);
    m.release(7);
    EXPECT_TRUE(m.whole());
    EXPECT_THROW(m.release(7), InternalError);
}

TEST(KvManager, SequencesGetDisjointMemory) {
    const std::vector<BufferDesc> bufs = tiny_buffers();
    StateManager m(bufs, 4 << 20);
    const int64_t bt = m.layout().block_tokens;
    const std::vector<int64_t> lengths = {1, bt, 3 * bt + 5, 2 * bt - 1, 7};
    for (size_t s = 0; s < lengths.size(); ++s) ASSERT_TRUE(m.allocate(s, lengths[s]));
    // Fill every row of every sequence with its id, then check nothing was overwritten by another sequence.
    auto visit = [&](auto&& fn) {
        for (size_t s = 0; s < lengths.size(); ++s)
            for (size_t i = 0; i < bufs.size(); ++i) {
                if (bufs[i].ring_rows > 0) {
                    TensorView v = m.ring(s, i);
                    fn(s, v.f32(), v.numel());
                } else {
                    const int64_t per_page = m.layout().places[i].rows_per_block * bufs[i].row_elems;
                    for (int64_t p = 0; p < m.num_pages(s); ++p) fn(s, m.page(s, i, p), per_page);
                }
            }
    };
    visit([](size_t s, float* f, int64_t n) { std::fill(f, f + n, static_cast<float>(s)); });
    int64_t bad = 0;
    visit([&](size_t s, float* f, int64_t n) {
        for (int64_t k = 0; k < n; ++k) bad += f[k] != static_cast<float>(s);
    });
    EXPECT_EQ(bad, 0);
    for (size_t s = 0; s < lengths.size(); ++s) m.release(s);
    EXPECT_TRUE(m.whole());
}

TEST(KvManager, PoisonFillsOnlyNewlyBoundBlocks) {
    StateManager m(tiny_buffers(), 1 << 20, 0, /*poison=*/true);
    const int64_t bt = m.layout().block_tokens;
    ASSERT_TRUE(m.allocate(1, bt));
    m.bind(1);
    EXPECT_TRUE(std::isnan(m.ring(1, 0).f32()[0]));
    EXPECT_TRUE(std::isnan(m.page(1, 3, 0)[0]));
    m.ring(1, 0).f32()[0] = 1.0f;
    m.page(1, 3, 0)[0] = 2.0f;
    ASSERT_TRUE(m.grow(1, 2 * bt));
    m.bind(1);
    EXPECT_EQ(m.ring(1, 0).f32()[0], 1.0f);  // written state survives a later bind
    EXPECT_EQ(m.page(1, 3, 0)[0], 2.0f);
    EXPECT_TRUE(std::isnan(m.page(1, 3, 1)[0]));
    m.release(1);
    EXPECT_TRUE(m.whole());
}

TEST(KvManager, MaxConcurrentTokens) {
    const Layout l = make_layout(tiny_buffers());
    const int64_t blocks = 100;
    StateManager m(tiny_buffers(), blocks * l.block_bytes + 17);  // a partial block is not used
    EXPECT_EQ(m.pool().num_blocks(), blocks);
    EXPECT_EQ(m.max_tokens_per_sequence(), (blocks - l.ring_blocks) * l.block_tokens);
    EXPECT_EQ(m.max_concurrent_tokens(4), (blocks - 4 * l.ring_blocks) * l.block_tokens);
    EXPECT_EQ(m.max_concurrent_tokens(1000), 0);
    // One sequence can really take that many tokens.
    ASSERT_TRUE(m.allocate(1, m.max_tokens_per_sequence()));
    EXPECT_EQ(m.num_free_blocks(), 0);
    m.release(1);
}

// Random allocate / grow / release: the pool's count always equals what the tables hold, and the pool is whole
// once everything is released.
TEST(KvManager, RandomTrafficNeverLeaks) {
    StateManager m(tiny_buffers(), 2 << 20);
    const int64_t bt = m.layout().block_tokens;
    std::mt19937 rng(1234);
    std::map<uint64_t, int64_t> tokens;
    uint64_t next = 0;
    for (int step = 0; step < 20000; ++step) {
        const int op = rng() % 3;
        if (op == 0 || tokens.empty()) {
            const int64_t n = 1 + rng() % (6 * bt);
            if (m.allocate(next, n)) tokens[next] = n;
            ++next;
        } else {
            auto it = std::next(tokens.begin(), rng() % tokens.size());
            if (op == 1) {
                const int64_t n = it->second + rng() % (2 * bt);
                if (m.grow(it->first, n)) it->second = n;
            } else {
                m.release(it->first);
                tokens.erase(it);
            }
        }
        int64_t held = 0;
        for (const auto& [id, n] : tokens) {
            held += m.blocks_held(id);
            ASSERT_GE(m.token_capacity(id), n);
        }
        ASSERT_EQ(held, m.pool().num_used());
    }
    for (const auto& [id, n] : tokens) m.release(id);
    EXPECT_TRUE(m.whole());
}

}  // namespace
}  // namespace deepinfer::kv
