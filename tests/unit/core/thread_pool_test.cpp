#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "core/thread_pool.h"
#include "deepinfer/error.h"

namespace deepinfer {
namespace {

TEST(ThreadPool, CoversRangeExactlyOnce) {
    ThreadPool pool(4);
    for (int64_t n : {1, 7, 64, 1000, 4097}) {
        std::vector<std::atomic<int>> hits(n);
        pool.parallel_for(n, 3, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) hits[i]++;
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
    }
}

TEST(ThreadPool, NestedCallsRunSerially) {
    ThreadPool pool(3);
    std::atomic<int64_t> total{0};
    pool.parallel_for(8, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i)
            pool.parallel_for(10, 1, [&](int64_t b2, int64_t e2) { total += e2 - b2; });
    });
    EXPECT_EQ(total.load(), 80);
}

TEST(ThreadPool, PropagatesExceptions) {
    ThreadPool pool(2);
    EXPECT_THROW(pool.parallel_for(100, 1,
                                   [&](int64_t b, int64_t) {
                                       if (b >= 50) DI_THROW("boom");
                                   }),
                 Error);
    // The pool still works afterwards.
    std::atomic<int> n{0};
    pool.parallel_for(10, 1, [&](int64_t b, int64_t e) { n += static_cast<int>(e - b); });
    EXPECT_EQ(n.load(), 10);
}

}  // namespace
}  // namespace deepinfer
