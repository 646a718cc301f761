#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "core/npy.h"

namespace deepinfer {
namespace {

TEST(Npy, WriteReadRoundTrip) {
    std::string path = testing::TempDir() + "/npy_roundtrip.npy";
    float data[6] = {1, 2, 3, 4, 5, -6.5f};
    write_npy(path, data, {2, 3});
    NpyArray a = read_npy(path);
    ASSERT_EQ(a.dtype, DType::kF32);
    ASSERT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
    auto v = a.to_f32();
    for (int i = 0; i < 6; ++i) EXPECT_EQ(v[i], data[i]);

    int32_t ids[3] = {7, -1, 129279};
    write_npy(path, ids, {3});
    NpyArray b = read_npy(path);
    ASSERT_EQ(b.dtype, DType::kI32);
    EXPECT_EQ(b.to_i64(), (std::vector<int64_t>{7, -1, 129279}));
    std::remove(path.c_str());
}

TEST(Npy, RejectsGarbageAndTruncation) {
    const uint8_t junk[] = {'n', 'o', 't', ' ', 'n', 'p', 'y', 0, 0, 0, 0};
    EXPECT_THROW(parse_npy(junk, sizeof junk, "junk"), Error);
    std::string path = testing::TempDir() + "/npy_trunc.npy";
    float data[4] = {1, 2, 3, 4};
    write_npy(path, data, {4});
    NpyArray ok = read_npy(path);
    std::vector<uint8_t> bytes;
    {
        std::FILE* f = std::fopen(path.c_str(), "rb");
        uint8_t buf[4096];
        size_t n = std::fread(buf, 1, sizeof buf, f);
        std::fclose(f);
        bytes.assign(buf, buf + n);
    }
    EXPECT_THROW(parse_npy(bytes.data(), bytes.size() - 3, "truncated"), Error);
    std::remove(path.c_str());
}

}  // namespace
}  // namespace deepinfer
