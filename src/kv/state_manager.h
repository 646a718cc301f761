// Per-sequence state memory (the model's StateSpec, seen by kv as plain buffer descriptions) in fixed-size
// blocks from one BlockPool sized by a memory budget.
//
// Every block has the same size. A sequence holds
//   - `ring_blocks` blocks for its rings (window rows, compressor inputs): rings are packed into blocks once,
//     first-fit by size, and never span two blocks, so each ring is one contiguous view;
//   - one block per `block_tokens` tokens (a "page") for its paged buffers (compressed entries, indexer keys):
//     a page holds block_tokens / tokens_per_row rows of every paged buffer, side by side.
// So the blocks a sequence of n tokens needs are ring_blocks + ceil(n / block_tokens) (Layout::blocks_for),
// which is the formula the scheduler plans with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"
#include "kv/block_pool.h"

namespace deepinfer::kv {

// One state buffer of f32 rows: a ring (ring_rows > 0) or a paged buffer growing by one row per
// tokens_per_row tokens.
struct BufferDesc {
    std::string name;
    int64_t row_elems = 0;
    int64_t ring_rows = 0;
    int64_t tokens_per_row = 0;
};

struct Layout {
    struct Place {
        int64_t block = 0;           // rings: which of the sequence's ring blocks
        size_t offset = 0;           // byte offset inside the ring block, or inside a page
        int64_t rows_per_block = 0;  // paged: rows of this buffer per page
    };
    size_t block_bytes = 0;
    int64_t block_tokens = 0;   // tokens per page; 0 when no buffer grows with length
    int64_t ring_blocks = 0;    // blocks per sequence holding its rings
    size_t ring_bytes = 0;      // the rings' own bytes (without packing slack)
    size_t page_bytes = 0;      // the paged rows' own bytes per page
    std::vector<Place> places;  // per buffer

    // Blocks a sequence holding `tokens` tokens needs.
    int64_t blocks_for(int64_t tokens) const;
    // Tokens `pages` pages hold (unbounded when nothing is paged).
    int64_t tokens_for_pages(int64_t pages) const;
    // Marginal memory per token (a page's block over its tokens, slack included).
    double bytes_per_token() const;
    // Memory every sequence holds regardless of its length.
    size_t fixed_bytes_per_sequence() const { return static_cast<size_t>(ring_blocks) * block_bytes; }
};

// Tokens num_seqs sequences can hold together in num_blocks blocks (each holds its ring blocks and at least one
// page when anything is paged).
int64_t max_concurrent_tokens(const Layout& layout, int64_t num_blocks, int64_t num_seqs);

// block_tokens = 0 picks the smallest multiple of every tokens_per_row (at least 16 tokens) whose page is no
// smaller than the largest ring, so neither kind of block wastes much.
Layout make_layout(std::span<const BufferDesc> buffers, int64_t block_tokens = 0);

class StateManager {
public:
    using SeqId = uint64_t;

    // poison: bind() fills a sequence's new blocks with NaN, so reading state nobody wrote shows up (tests; host
    // memory only). arena: memory for the blocks (e.g. a device backend's), at least
    // budget_bytes / layout.block_bytes blocks; null: host memory the manager allocates.
    StateManager(std::vector<BufferDesc> buffers, size_t budget_bytes, int64_t block_tokens = 0, bool poison = false,
                 void* arena = nullptr);

    const std::vector<BufferDesc>& buffers() const { return buffers_; }
    const Layout& layout() const { return layout_; }
    const BlockPool& pool() const { return pool_; }
    int64_t num_free_blocks() const { return pool_.num_free(); }
    size_t budget_bytes() const { return budget_bytes_; }
    // Tokens one sequence can hold with the whole pool; tokens n sequences can hold together.
    int64_t max_tokens_per_sequence() const { return max_concurrent_tokens(1); }
    int64_t max_concurrent_tokens(int64_t num_seqs) const {
        return kv::max_concurrent_tokens(layout_, pool_.num_blocks(), num_seqs);
    }

    // A new sequence with room for `tokens` tokens. False (and no change) when the pool is short.
    bool allocate(SeqId id, int64_t tokens);
    // Room for `tokens` tokens in total. False (and no change) when the pool is short.
    bool grow(SeqId id, int64_t tokens);
    // Returns every block of the sequence to the pool.
    void release(SeqId id);

    bool contains(SeqId id) const { return tables_.count(id) != 0; }
    int64_t num_sequences() const { return static_cast<int64_t>(tables_.size()); }
    int64_t blocks_held(SeqId id) const;
    int64_t token_capacity(SeqId id) const;
    int64_t num_pages(SeqId id) const;
    // Nothing allocated: every block back in the pool and no sequence table left.
    bool whole() const { return tables_.empty() && pool_.whole(); }

    // Ring buffer `buffer` of the sequence: [ring_rows, row_elems] f32.
    TensorView ring(SeqId id, size_t buffer) const;
    // Page p of paged buffer `buffer`: rows [p * rows_per_block, (p + 1) * rows_per_block), row_elems f32 each.
    float* page(SeqId id, size_t buffer, int64_t p) const;
    // Hands the blocks allocated since the last bind to the model (poison mode: fills them with NaN). Call it
    // only when no running computation reads the sequence's blocks: a block released by one sequence may be
    // allocated to another while the first one's last step still reads it, so nothing may write a block
    // before that step ends.
    void bind(SeqId id);

private:
    struct Table {
        std::vector<int32_t> ring_blocks;
        std::vector<int32_t> pages;
        size_t bound_rings = 0, bound_pages = 0;
    };
    const Table& table(SeqId id) const;
    int64_t pages_for(int64_t tokens) const;

    std::vector<BufferDesc> buffers_;
    Layout layout_;
    size_t budget_bytes_;
    bool poison_;
    BlockPool pool_;
    std::unordered_map<SeqId, Table> tables_;
};

}  // namespace deepinfer::kv
