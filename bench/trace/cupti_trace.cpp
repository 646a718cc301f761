// A kernel timeline for any CUDA program, without Nsight Systems: a CUPTI activity tracer loaded by the CUDA
// driver itself (CUDA_INJECTION64_PATH=libdi_cupti_trace.so), which records every kernel, memory copy and memset
// (device start and end, stream) and every runtime API call (host start and end), both on CUPTI's one clock, and
// writes them as CSV when the program exits:
//   kind,start_ns,end_ns,stream,correlation,name,launch
// kind: kernel / memcpy / memset (device times; name = the kernel's mangled name, quoted, or the copy's direction
// and bytes; launch = a kernel's grid and block, "GXxGYxGZ/BXxBYxBZ", else empty)
// or api (host times of a runtime call; correlation ties a launch to its kernel; name = the callback id).
// The file is DEEPINFER_TRACE_FILE (default di_trace.csv). Kernels are traced concurrently (not serialised), so
// programmatic dependent launch and side streams keep their overlap; the cost is a record a call (DEEPINFER_TRACE_API=0
// drops the runtime calls, the costlier half).
// bench/trace/decode_timeline.py turns a trace of step_bench into per-step figures.
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

constexpr size_t kBufferBytes = 8 << 20;

std::mutex g_mutex;
std::vector<std::string> g_lines;  // CSV rows, appended as CUPTI hands back completed buffers

void check(CUptiResult r, const char* what) {
    if (r == CUPTI_SUCCESS) return;
    const char* msg = nullptr;
    cuptiGetResultString(r, &msg);
    std::fprintf(stderr, "cupti_trace: %s: %s\n", what, msg ? msg : "?");
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
    *size = kBufferBytes;
    *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
    std::vector<std::string> rows;
    CUpti_Activity* rec = nullptr;
    char line[1024];
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        switch (rec->kind) {
            case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
            case CUPTI_ACTIVITY_KIND_KERNEL: {
                const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
                std::snprintf(line, sizeof line, "kernel,%llu,%llu,%u,%u,\"%s\",%dx%dx%d/%dx%dx%d",
                              (unsigned long long)k->start, (unsigned long long)k->end, k->streamId, k->correlationId,
                              k->name ? k->name : "?", k->gridX, k->gridY, k->gridZ, k->blockX, k->blockY, k->blockZ);
                break;
            }
            case CUPTI_ACTIVITY_KIND_MEMCPY: {
                const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
                std::snprintf(line, sizeof line, "memcpy,%llu,%llu,%u,%u,kind%u %llu B,", (unsigned long long)m->start,
                              (unsigned long long)m->end, m->streamId, m->correlationId, m->copyKind,
                              (unsigned long long)m->bytes);
                break;
            }
            case CUPTI_ACTIVITY_KIND_MEMSET: {
                const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
                std::snprintf(line, sizeof line, "memset,%llu,%llu,%u,%u,%llu B,", (unsigned long long)m->start,
                              (unsigned long long)m->end, m->streamId, m->correlationId, (unsigned long long)m->bytes);
                break;
            }
            case CUPTI_ACTIVITY_KIND_RUNTIME: {
                const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(rec);
                std::snprintf(line, sizeof line, "api,%llu,%llu,0,%u,%u,", (unsigned long long)a->start,
                              (unsigned long long)a->end, a->correlationId, a->cbid);
                break;
            }
            default:
                continue;
        }
        rows.emplace_back(line);
    }
    std::free(buffer);
    std::lock_guard<std::mutex> lock(g_mutex);
    for (std::string& r : rows) g_lines.push_back(std::move(r));
}

void write_trace() {
    cuptiActivityFlushAll(1);
    const char* path = std::getenv("DEEPINFER_TRACE_FILE");
    FILE* f = std::fopen(path ? path : "di_trace.csv", "w");
    if (!f) {
        std::perror("cupti_trace: the trace file");
        return;
    }
    std::fputs("kind,start_ns,end_ns,stream,correlation,name,launch\n", f);
    std::lock_guard<std::mutex> lock(g_mutex);
    for (const std::string& r : g_lines) {
        std::fputs(r.c_str(), f);
        std::fputc('\n', f);
    }
    std::fclose(f);
    std::fprintf(stderr, "cupti_trace: %zu records\n", g_lines.size());
}

}  // namespace

// Called by the CUDA driver when this library is named by CUDA_INJECTION64_PATH.
extern "C" int InitializeInjection(void) {
    check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "register callbacks");
    for (CUpti_ActivityKind kind :
         {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET})
        check(cuptiActivityEnable(kind), "enable an activity kind");
    // The runtime calls' records cost the host ~3 us a launch: DEEPINFER_TRACE_API=0 leaves them out, for a
    // program whose GPU would otherwise wait on its host.
    const char* api = std::getenv("DEEPINFER_TRACE_API");
    if (!api || std::strcmp(api, "0") != 0)
        check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME), "enable API records");
    std::atexit(write_trace);
    return 1;
}
