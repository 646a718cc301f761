// Tokenizer encode throughput: single-thread MB/s and batch MB/s on all cores, over a JSONL corpus
// (one JSON string per line). Writes a JSON report with per-document id hashes so another implementation
// (Hugging Face tokenizers, bench/tokenizer/hf_bench.py) can check that it produced the same ids.
//
//   bench_tokenizer --tokenizer DIR_OR_FILE --corpus FILE.jsonl [--threads N] [--repeat R] [--json OUT]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/thread_pool.h"
#include "deepinfer/error.h"
#include "tokenizer/tokenizer.h"

namespace {

uint64_t hash_ids(const std::vector<int32_t>& ids) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int32_t id : ids) {
        auto u = static_cast<uint32_t>(id);
        for (int k = 0; k < 4; ++k) {
            h ^= (u >> (8 * k)) & 0xFF;
            h *= 0x100000001b3ull;
        }
    }
    return h;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
    std::string tokenizer_path, corpus_path, json_path;
    int threads = static_cast<int>(std::thread::hardware_concurrency());
    int repeat = 3;
    for (int i = 1; i < argc; ++i) {
        auto arg = [&](const char* name) { return !std::strcmp(argv[i], name) && i + 1 < argc; };
        if (arg("--tokenizer")) {
            tokenizer_path = argv[++i];
        } else if (arg("--corpus")) {
            corpus_path = argv[++i];
        } else if (arg("--json")) {
            json_path = argv[++i];
        } else if (arg("--threads")) {
            threads = std::atoi(argv[++i]);
        } else if (arg("--repeat")) {
            repeat = std::atoi(argv[++i]);
        } else {
            std::fprintf(stderr,
                         "usage: bench_tokenizer --tokenizer PATH --corpus FILE.jsonl [--threads N] "
                         "[--repeat R] [--json OUT]\n");
            return 2;
        }
    }
    if (tokenizer_path.empty() || corpus_path.empty() || repeat < 1) {
        std::fprintf(stderr, "bench_tokenizer: --tokenizer and --corpus are required\n");
        return 2;
    }
    try {
        std::vector<std::string> docs;
        size_t bytes = 0;
        {
            std::ifstream in(corpus_path);
            DI_CHECK(in.good(), "cannot open ", corpus_path);
            std::string line;
            while (std::getline(in, line)) {
                if (line.empty()) continue;
                docs.push_back(nlohmann::json::parse(line).get<std::string>());
                bytes += docs.back().size();
            }
        }
        auto t0 = std::chrono::steady_clock::now();
        auto tok = deepinfer::Tokenizer::from_file(tokenizer_path);
        double load_s = seconds_since(t0);

        std::vector<uint64_t> hashes(docs.size());
        size_t tokens = 0;
        double best_single = 1e30;
        for (int r = 0; r < repeat; ++r) {
            tokens = 0;
            t0 = std::chrono::steady_clock::now();
            for (size_t d = 0; d < docs.size(); ++d) {
                auto ids = tok.encode(docs[d]);
                tokens += ids.size();
                if (r == 0) hashes[d] = hash_ids(ids);
            }
            best_single = std::min(best_single, seconds_since(t0));
        }
        deepinfer::ThreadPool pool(threads);
        double best_batch = 1e30;
        for (int r = 0; r < repeat; ++r) {
            t0 = std::chrono::steady_clock::now();
            auto all = tok.encode_batch(docs, false, &pool);
            best_batch = std::min(best_batch, seconds_since(t0));
            for (size_t d = 0; d < docs.size(); ++d)
                DI_CHECK(hash_ids(all[d]) == hashes[d], "batch encoding differs from single encoding at doc ", d);
        }
        double mb = static_cast<double>(bytes) / 1e6;
        std::printf("corpus: %zu docs, %.2f MB, %zu tokens; load %.2f s\n", docs.size(), mb, tokens, load_s);
        std::printf("deepinfer single-thread: %.2f MB/s (%.3f s)\n", mb / best_single, best_single);
        std::printf("deepinfer batch (%d threads): %.2f MB/s (%.3f s)\n", pool.num_threads(), mb / best_batch,
                    best_batch);
        if (!json_path.empty()) {
            nlohmann::json j;
            j["impl"] = "deepinfer";
            j["docs"] = docs.size();
            j["bytes"] = bytes;
            j["tokens"] = tokens;
            j["load_s"] = load_s;
            j["single_s"] = best_single;
            j["single_mb_s"] = mb / best_single;
            j["batch_threads"] = pool.num_threads();
            j["batch_s"] = best_batch;
            j["batch_mb_s"] = mb / best_batch;
            std::vector<std::string> hs;
            for (uint64_t h : hashes) {
                char buf[24];
                std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
                hs.emplace_back(buf);
            }
            j["hashes"] = hs;
            std::ofstream(json_path) << j.dump() << "\n";
        }
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_tokenizer: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
