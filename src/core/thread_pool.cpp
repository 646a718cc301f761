#include "core/thread_pool.h"

#include <algorithm>
#include <cstdlib>
#include <string>

namespace deepinfer {

namespace {
thread_local bool tls_inside_pool = false;

int default_thread_count() {
    if (const char* env = std::getenv("DEEPINFER_NUM_THREADS")) {
        int n = std::atoi(env);
        if (n > 0) return n;
    }
    unsigned hw = std::thread::hardware_concurrency();
    return hw ? static_cast<int>(hw) : 1;
}
}  // namespace

ThreadPool::ThreadPool(int num_threads) {
    int n = num_threads > 0 ? num_threads : default_thread_count();
    for (int i = 1; i < n; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : workers_) t.join();
}

void ThreadPool::run_chunks() {
    bool was_inside = tls_inside_pool;
    tls_inside_pool = true;
    for (;;) {
        int64_t chunk;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (next_chunk_ >= num_chunks_) break;
            chunk = next_chunk_++;
        }
        int64_t begin = chunk * job_chunk_, end = std::min(job_n_, begin + job_chunk_);
        try {
            (*job_)(begin, end);
        } catch (...) {
            std::lock_guard<std::mutex> lock(mutex_);
            if (!error_) error_ = std::current_exception();
        }
        std::lock_guard<std::mutex> lock(mutex_);
        if (++finished_chunks_ == num_chunks_) done_.notify_all();
    }
    tls_inside_pool = was_inside;
}

void ThreadPool::worker_loop() {
    uint64_t seen = 0;
    for (;;) {
        {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
        }
        run_chunks();
    }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
    if (n <= 0) return;
    grain = std::max<int64_t>(grain, 1);
    int64_t max_chunks = (n + grain - 1) / grain;
    if (workers_.empty() || max_chunks == 1 || tls_inside_pool) {
        fn(0, n);
        return;
    }
    // A few chunks per thread balance uneven work without much locking.
    int64_t chunks = std::min<int64_t>(max_chunks, static_cast<int64_t>(num_threads()) * 4);
    int64_t chunk = (n + chunks - 1) / chunks;
    std::lock_guard<std::mutex> submit(submit_mutex_);
    std::unique_lock<std::mutex> lock(mutex_);
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = chunk;
    num_chunks_ = (n + chunk - 1) / chunk;
    next_chunk_ = 0;
    finished_chunks_ = 0;
    error_ = nullptr;
    ++generation_;
    lock.unlock();
    wake_.notify_all();
    run_chunks();
    lock.lock();
    done_.wait(lock, [&] { return finished_chunks_ == num_chunks_; });
    job_ = nullptr;
    std::exception_ptr err = error_;
    error_ = nullptr;
    lock.unlock();
    if (err) std::rethrow_exception(err);
}

}  // namespace deepinfer
