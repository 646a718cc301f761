// The async step worker: jobs run on its thread (or inline), one at a time, and exceptions reach wait().
#include "engine/step_worker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>

#include "deepinfer/error.h"

namespace deepinfer::engine {
namespace {

TEST(StepWorker, RunsJobsOnItsThreadOrInline) {
    for (bool threaded : {true, false}) {
        StepWorker w(threaded);
        std::atomic<int> sum{0};
        std::thread::id where;
        for (int i = 1; i <= 100; ++i) {
            w.submit([&, i] {
                sum += i;
                where = std::this_thread::get_id();
            });
            w.wait();
        }
        EXPECT_EQ(sum, 5050);
        EXPECT_EQ(where != std::this_thread::get_id(), threaded);
    }
}

TEST(StepWorker, ExceptionsReachWaitOnce) {
    for (bool threaded : {true, false}) {
        StepWorker w(threaded);
        w.submit([] { throw std::runtime_error("boom"); });
        EXPECT_THROW(w.wait(), std::runtime_error);
        w.submit([] {});
        EXPECT_NO_THROW(w.wait());
    }
}

TEST(StepWorker, OneJobAtATime) {
    StepWorker w(true);
    std::atomic<bool> release{false};
    w.submit([&] {
        while (!release) std::this_thread::yield();
    });
    EXPECT_THROW(w.submit([] {}), InternalError);
    release = true;
    w.wait();
}

}  // namespace
}  // namespace deepinfer::engine
