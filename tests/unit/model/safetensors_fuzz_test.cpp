// Fuzz-style robustness: truncated and bit-flipped safetensors files either parse into in-bounds tensors
// or raise deepinfer::Error. Nothing else may escape, and nothing may crash.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "model/safetensors.h"
#include "support/checkpoint_edit.h"
#include "support/npy_compare.h"

namespace deepinfer {
namespace {

using testing_support::data_path;
using testing_support::read_text;

// Parses the image; returns true if accepted. Any exception other than Error fails the test.
bool parse(const std::string& bytes, const std::string& what) {
    try {
        SafetensorsFile f(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), what);
        for (const auto& [name, t] : f.tensors()) {
            EXPECT_LE(t.begin, t.end) << what;
            EXPECT_LE(f.data(t) + (t.end - t.begin), reinterpret_cast<const uint8_t*>(bytes.data()) + bytes.size())
                << what << " " << name;
        }
        return true;
    } catch (const Error&) {
        return false;
    } catch (const std::exception& e) {
        ADD_FAILURE() << what << ": unexpected exception " << e.what();
        return false;
    }
}

TEST(SafetensorsFuzz, Truncations) {
    const std::string bytes = read_text(data_path("v4/v4_tiny_a/model.safetensors"));
    ASSERT_TRUE(parse(bytes, "intact"));
    uint64_t header = 0;
    for (int i = 7; i >= 0; --i) header = (header << 8) | static_cast<uint8_t>(bytes[i]);
    int rejected = 0, cuts = 0;
    // Every length inside the header and the first bytes of data, then a spread over the rest.
    for (size_t len = 0; len < bytes.size(); len += (len < header + 64 ? 1 : bytes.size() / 97 + 1)) {
        ++cuts;
        rejected += !parse(bytes.substr(0, len), "cut at " + std::to_string(len));
    }
    EXPECT_EQ(rejected, cuts) << "every truncated file must be rejected";
}

TEST(SafetensorsFuzz, BitFlipsInTheHeader) {
    const std::string bytes = read_text(data_path("v4/v4_tiny_a/model.safetensors"));
    uint64_t header = 0;
    for (int i = 7; i >= 0; --i) header = (header << 8) | static_cast<uint8_t>(bytes[i]);
    std::mt19937_64 rng(1234);
    int accepted = 0;
    for (int trial = 0; trial < 3000; ++trial) {
        std::string damaged = bytes;
        const int flips = 1 + static_cast<int>(rng() % 4);
        for (int f = 0; f < flips; ++f) {
            const size_t pos = rng() % (8 + header);
            damaged[pos] = static_cast<char>(damaged[pos] ^ (1 << (rng() % 8)));
        }
        accepted += parse(damaged, "trial " + std::to_string(trial));
    }
    // Flips inside tensor names or padding can leave a valid file; most must be caught.
    EXPECT_LT(accepted, 3000);
    std::printf("bit-flipped headers accepted as valid: %d of 3000\n", accepted);
}

}  // namespace
}  // namespace deepinfer
