// The engine's bridge from a model's StateSpec to the KV manager, on the real DeepSeek-V4-Flash shape: bytes
// per token, fixed bytes per sequence and the concurrent tokens a memory budget holds.
#include <gtest/gtest.h>

#include "core/file.h"
#include "kv/state_manager.h"
#include "model/deepseek_v4/config.h"
#include "model/deepseek_v4/state.h"
#include "support/npy_compare.h"

namespace deepinfer {
namespace {

const char* kFlashConfig = "v4/deepseek_v4_flash_config.json";  // DeepSeek-V4-Flash, release keys

std::vector<kv::BufferDesc> buffers_of(const StateSpec& spec) {
    std::vector<kv::BufferDesc> out;
    for (const StateBufferSpec& b : spec.buffers) out.push_back({b.name, b.row_elems, b.ring_rows, b.tokens_per_row});
    return out;
}

TEST(StateLayout, DeepSeekV4Flash) {
    const StateSpec spec = dsv4::state_spec(dsv4::parse_deepseek_v4_config(read_file(testing_support::data_path(kFlashConfig)), kFlashConfig));
    const kv::Layout l = kv::make_layout(buffers_of(spec));
    EXPECT_EQ(l.block_tokens, 128);  // lcm of the ratios 4 and 128
    // Pages carry the model's paged bytes exactly (rows are 64-byte multiples, so no slack).
    EXPECT_DOUBLE_EQ(l.bytes_per_token(), spec.paged_bytes_per_token());
    // Ring packing wastes little: under 10% over the model's ring bytes.
    EXPECT_LT(static_cast<double>(l.fixed_bytes_per_sequence()), 1.10 * static_cast<double>(spec.ring_bytes()));
    const int64_t blocks = static_cast<int64_t>((size_t{64} << 30) / l.block_bytes);  // a 64 GiB budget
    std::printf(
        "V4-Flash fp32 state in kv blocks: block %.2f MiB = %lld tokens; %.0f bytes/token; fixed %.1f MiB per "
        "sequence (model rings %.1f MiB) in %lld blocks\n",
        l.block_bytes / 1048576.0, static_cast<long long>(l.block_tokens), l.bytes_per_token(),
        l.fixed_bytes_per_sequence() / 1048576.0, spec.ring_bytes() / 1048576.0, static_cast<long long>(l.ring_blocks));
    for (int64_t seqs : {1, 16, 64, 256})
        std::printf("  64 GiB budget, %3lld sequences: %lld concurrent tokens\n", static_cast<long long>(seqs),
                    static_cast<long long>(kv::max_concurrent_tokens(l, blocks, seqs)));
    EXPECT_GT(kv::max_concurrent_tokens(l, blocks, 64), 4'000'000);
    EXPECT_EQ(kv::max_concurrent_tokens(l, blocks, 1), (blocks - l.ring_blocks) * l.block_tokens);
}

}  // namespace
}  // namespace deepinfer
