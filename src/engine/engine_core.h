// The engine's step loop: schedule -> prepare -> run (forward + sample) -> commit -> detokenize and check stops.
//
// Async scheduling (the default): while step n computes on the worker thread, the engine thread schedules
// and prepares step n+1, assuming every sequence sampling in step n yields one token (a placeholder). When
// step n ends, its tokens fill the placeholders, sequences that ended on a token (EOS, stop id, length) leave
// step n+1, and step n+1 starts; step n's detokenization, stop strings and outputs are then processed while
// step n+1 computes. A request that a stop string ends is found one step late: its extra step is discarded.
// Outputs are the same with async scheduling on or off (stop strings aside, the batches are the same too).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "deepinfer/llm.h"
#include "engine/model_runner.h"
#include "engine/request.h"
#include "engine/step_worker.h"
#include "kv/state_manager.h"
#include "sched/scheduler.h"

namespace deepinfer {
class Backend;
}

namespace deepinfer::engine {

class EngineCore {
public:
    explicit EngineCore(EngineOptions options);
    ~EngineCore();

    uint64_t add_request(Prompt prompt, SamplingParams params);
    bool abort_request(uint64_t id);
    std::vector<RequestOutput> step();
    bool has_unfinished() const;
    bool is_finished(uint64_t id) const;

    const ModelSummary& summary() const { return summary_; }
    MemoryReport memory_report() const;
    EngineStats stats() const { return stats_; }
    void reset_stats() { stats_ = {}; }
    bool async_scheduling() const { return async_; }
    const Tokenizer& tokenizer() const;
    std::string apply_chat_template(const std::string& messages_json, const ChatOptions& options) const;

private:
    // Input side.
    void process_input(Request& r, Prompt& prompt);
    void setup_sampling(Request& r);
    grammar::GrammarCompiler& grammar_compiler();

    // Step side.
    std::unique_ptr<StepBatch> plan_step();
    void preempt(Request& r);
    void launch(std::unique_ptr<StepBatch> batch);
    std::unique_ptr<StepBatch> wait_inflight();
    void commit(StepBatch& batch, std::vector<Request*>& touched);
    void finish(Request& r, const std::string& reason);
    void fail(Request& r, const std::string& message);
    void release_state(Request& r);

    // Output side.
    void process_output(Request& r);
    RequestOutput make_output(Request& r);
    void reap();

    // CPU-work accounting: segments recorded while a step computes are overlapped up to its end.
    void cpu_segment(double start, double end);

    EngineOptions options_;
    std::unique_ptr<Backend> backend_;
    std::unique_ptr<CausalLM> model_;
    std::unique_ptr<Tokenizer> tokenizer_;
    std::unique_ptr<grammar::GrammarCompiler> grammar_;
    Tensor state_arena_;  // device backends: the memory of the state blocks
    std::unique_ptr<kv::StateManager> kv_;
    std::unique_ptr<ModelRunner> runner_;
    sched::SchedulerConfig sched_config_;
    sched::MemoryModel memory_model_;
    ModelSummary summary_;
    bool async_ = true;
    bool len_capped_by_memory_ = false;  // the context limit is what the pool holds for one sequence

    uint64_t next_id_ = 1;
    std::map<uint64_t, std::unique_ptr<Request>> requests_;  // until finished, reported and out of flight
    std::vector<Request*> running_, waiting_;                // by id
    std::vector<Request*> touched_;                          // changed outside a step (errors at add, aborts)
    std::vector<std::unique_ptr<ModelSequence>> retired_;    // sequences a step in flight still reads
    std::unique_ptr<StepBatch> inflight_;
    std::vector<std::pair<double, double>> inflight_cpu_;  // CPU segments while inflight_ computes
    EngineStats stats_;
    StepWorker worker_;
};

}  // namespace deepinfer::engine
