#include "kv/state_manager.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "deepinfer/error.h"

namespace deepinfer::kv {

namespace {

constexpr size_t kAlign = 64;
constexpr int64_t kMinBlockTokens = 16;
constexpr int64_t kMaxAutoBlockTokens = 1024;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

size_t ring_buffer_bytes(const BufferDesc& b) { return static_cast<size_t>(b.ring_rows * b.row_elems) * 4; }

// Byte offsets of the paged buffers inside a page of block_tokens tokens; returns the page's size.
size_t place_pages(std::span<const BufferDesc> buffers, int64_t block_tokens, std::vector<Layout::Place>* places) {
    size_t offset = 0;
    for (size_t i = 0; i < buffers.size(); ++i) {
        const BufferDesc& b = buffers[i];
        if (b.tokens_per_row == 0) continue;
        const int64_t rows = block_tokens / b.tokens_per_row;
        if (places) (*places)[i] = {0, offset, rows};
        offset = align_up(offset + static_cast<size_t>(rows * b.row_elems) * 4);
    }
    return offset;
}

}  // namespace

int64_t Layout::blocks_for(int64_t tokens) const {
    if (block_tokens == 0) return ring_blocks;
    return ring_blocks + (std::max<int64_t>(tokens, 0) + block_tokens - 1) / block_tokens;
}

int64_t Layout::tokens_for_pages(int64_t pages) const {
    return block_tokens == 0 ? std::numeric_limits<int64_t>::max() : pages * block_tokens;
}

double Layout::bytes_per_token() const {
    return block_tokens == 0 ? 0.0 : static_cast<double>(block_bytes) / static_cast<double>(block_tokens);
}

Layout make_layout(std::span<const BufferDesc> buffers, int64_t block_tokens) {
    DI_CHECK(!buffers.empty(), "the model declares no state buffers");
    Layout layout;
    layout.places.resize(buffers.size());
    int64_t lcm = 1;
    bool paged = false;
    size_t max_ring = 0;
    for (const BufferDesc& b : buffers) {
        DI_CHECK(b.row_elems > 0, "state buffer ", b.name, " has no elements per row");
        DI_CHECK((b.ring_rows > 0) != (b.tokens_per_row > 0), "state buffer ", b.name,
                 " must be either a ring or paged");
        if (b.tokens_per_row > 0) {
            paged = true;
            lcm = std::lcm(lcm, b.tokens_per_row);
        } else {
            max_ring = std::max(max_ring, align_up(ring_buffer_bytes(b)));
            layout.ring_bytes += ring_buffer_bytes(b);
        }
    }
    if (paged) {
        if (block_tokens > 0) {
            DI_CHECK(block_tokens % lcm == 0, "block size of ", block_tokens,
                     " tokens is not a multiple of every compression ratio (", lcm, ")");
        } else {
            block_tokens = lcm;
            while ((block_tokens < kMinBlockTokens || place_pages(buffers, block_tokens, nullptr) < max_ring) &&
                   block_tokens + lcm <= kMaxAutoBlockTokens)
                block_tokens += lcm;
        }
        layout.block_tokens = block_tokens;
        layout.page_bytes = place_pages(buffers, block_tokens, &layout.places);
    }
    layout.block_bytes = align_up(std::max(layout.page_bytes, max_ring));

    // Rings: first-fit decreasing into blocks, in a deterministic order (size, then buffer index).
    std::vector<size_t> order;
    for (size_t i = 0; i < buffers.size(); ++i)
        if (buffers[i].ring_rows > 0) order.push_back(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return ring_buffer_bytes(buffers[a]) > ring_buffer_bytes(buffers[b]); });
    std::vector<size_t> used;  // bytes used per ring block
    for (size_t i : order) {
        const size_t need = align_up(ring_buffer_bytes(buffers[i]));
        size_t blk = 0;
        while (blk < used.size() && used[blk] + need > layout.block_bytes) ++blk;
        if (blk == used.size()) used.push_back(0);
        layout.places[i] = {static_cast<int64_t>(blk), used[blk], 0};
        used[blk] += need;
    }
    layout.ring_blocks = static_cast<int64_t>(used.size());
    return layout;
}

StateManager::StateManager(std::vector<BufferDesc> buffers, size_t budget_bytes, int64_t block_tokens, bool poison,
                           void* arena)
    : buffers_(std::move(buffers)),
      layout_(make_layout(buffers_, block_tokens)),
      budget_bytes_(budget_bytes),
      poison_(poison),
      pool_(layout_.block_bytes, static_cast<int64_t>(budget_bytes / layout_.block_bytes), arena) {
    DI_CHECK(!(poison && arena), "poisoning state memory needs host memory the manager owns");
    DI_CHECK(pool_.num_blocks() >= layout_.blocks_for(1), "a state memory budget of ", budget_bytes,
             " bytes is too small: one sequence needs at least ", layout_.blocks_for(1) * layout_.block_bytes,
             " bytes (", layout_.blocks_for(1), " blocks of ", layout_.block_bytes, ")");
}

int64_t max_concurrent_tokens(const Layout& layout, int64_t num_blocks, int64_t num_seqs) {
    const int64_t pages = num_blocks - num_seqs * layout.ring_blocks;
    if (pages < 0 || (layout.block_tokens > 0 && pages < num_seqs)) return 0;
    return layout.tokens_for_pages(pages);
}

int64_t StateManager::pages_for(int64_t tokens) const { return layout_.blocks_for(tokens) - layout_.ring_blocks; }

const StateManager::Table& StateManager::table(SeqId id) const {
    auto it = tables_.find(id);
    DI_ICHECK(it != tables_.end(), "no state memory for sequence ", id);
    return it->second;
}

bool StateManager::allocate(SeqId id, int64_t tokens) {
    DI_ICHECK(!contains(id), "sequence ", id, " already has state memory");
    Table t;
    if (!pool_.allocate(layout_.ring_blocks + pages_for(tokens), t.ring_blocks)) return false;
    t.pages.assign(t.ring_blocks.begin() + layout_.ring_blocks, t.ring_blocks.end());
    t.ring_blocks.resize(layout_.ring_blocks);
    tables_.emplace(id, std::move(t));
    return true;
}

bool StateManager::grow(SeqId id, int64_t tokens) {
    auto it = tables_.find(id);
    DI_ICHECK(it != tables_.end(), "no state memory for sequence ", id);
    const int64_t missing = pages_for(tokens) - static_cast<int64_t>(it->second.pages.size());
    return missing <= 0 || pool_.allocate(missing, it->second.pages);
}

void StateManager::release(SeqId id) {
    auto it = tables_.find(id);
    DI_ICHECK(it != tables_.end(), "no state memory for sequence ", id);
    pool_.release(it->second.ring_blocks);
    pool_.release(it->second.pages);
    tables_.erase(it);
}

int64_t StateManager::blocks_held(SeqId id) const {
    const Table& t = table(id);
    return static_cast<int64_t>(t.ring_blocks.size() + t.pages.size());
}

int64_t StateManager::num_pages(SeqId id) const { return static_cast<int64_t>(table(id).pages.size()); }

int64_t StateManager::token_capacity(SeqId id) const { return layout_.tokens_for_pages(num_pages(id)); }

TensorView StateManager::ring(SeqId id, size_t buffer) const {
    const BufferDesc& b = buffers_.at(buffer);
    DI_ICHECK(b.ring_rows > 0, "state buffer ", b.name, " is not a ring");
    const Layout::Place& p = layout_.places[buffer];
    auto* base = reinterpret_cast<uint8_t*>(pool_.data(table(id).ring_blocks[p.block]));
    return TensorView(base + p.offset, DType::kF32, Shape{b.ring_rows, b.row_elems});
}

float* StateManager::page(SeqId id, size_t buffer, int64_t p) const {
    const BufferDesc& b = buffers_.at(buffer);
    DI_ICHECK(b.tokens_per_row > 0, "state buffer ", b.name, " is not paged");
    const Table& t = table(id);
    DI_ICHECK(p >= 0 && p < static_cast<int64_t>(t.pages.size()), "page ", p, " of sequence ", id, " not allocated");
    return reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(pool_.data(t.pages[p])) + layout_.places[buffer].offset);
}

void StateManager::bind(SeqId id) {
    auto it = tables_.find(id);
    DI_ICHECK(it != tables_.end(), "no state memory for sequence ", id);
    Table& t = it->second;
    auto fill = [&](int32_t blk) {
        float* f = pool_.data(blk);
        std::fill(f, f + layout_.block_bytes / sizeof(float), std::numeric_limits<float>::quiet_NaN());
    };
    if (poison_) {
        for (size_t i = t.bound_rings; i < t.ring_blocks.size(); ++i) fill(t.ring_blocks[i]);
        for (size_t i = t.bound_pages; i < t.pages.size(); ++i) fill(t.pages[i]);
    }
    t.bound_rings = t.ring_blocks.size();
    t.bound_pages = t.pages.size();
}

}  // namespace deepinfer::kv
