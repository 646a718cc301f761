#include "engine/engine_core.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/file.h"
#include "core/log.h"
#include "sample/stop_strings.h"
#include "tokenizer/chat_encoding.h"

namespace deepinfer::engine {

namespace {

constexpr size_t kDefaultMemoryBudget = size_t{1} << 30;

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

bool resolve_async(const EngineOptions& o) {
    if (o.async_scheduling) return *o.async_scheduling;
    const char* env = std::getenv("DEEPINFER_ASYNC_SCHEDULING");
    return !(env && std::string(env) == "0");
}

// SplitMix64: the seed of a request without seq_seed, from the engine's seed and the request id.
uint64_t mix_seed(uint64_t seed, uint64_t id) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (id + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void insert_sorted(std::vector<Request*>& v, Request* r) {
    v.insert(std::upper_bound(v.begin(), v.end(), r, [](const Request* a, const Request* b) { return a->id < b->id; }),
             r);
}

void erase_from(std::vector<Request*>& v, const Request* r) { v.erase(std::remove(v.begin(), v.end(), r), v.end()); }

bool has_tokenizer_file(const std::string& dir) {
    return file_exists(path_join(dir, "tokenizer.json")) || file_exists(path_join(dir, "tokenizer.json.gz"));
}

bool contains(const std::vector<int32_t>& v, int32_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

}  // namespace

EngineCore::EngineCore(EngineOptions options)
    : options_(std::move(options)), async_(resolve_async(options_)), worker_(async_) {
    DI_CHECK(options_.load_format == "auto" || options_.load_format == "random", "load format '", options_.load_format,
             "' is not supported (auto: the checkpoint's weights; random: random weights)");
    const std::string dir = find_model_dir(options_.model);
    backend_ = create_backend(options_.device, options_.num_threads);
    if (options_.batch_invariant) backend_->set_batch_invariant(*options_.batch_invariant);
    LoadOptions load;
    load.format = options_.load_format;
    model_ = load_model(dir, *backend_, load);
    const ModelInfo& info = model_->info();

    std::string tok = options_.tokenizer;
    if (tok.empty() && has_tokenizer_file(dir)) tok = dir;
    if (!tok.empty()) tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_file(tok));

    // State memory: the model's buffers in blocks of a pool sized by the budget.
    std::vector<kv::BufferDesc> buffers;
    for (const StateBufferSpec& b : model_->state_spec().buffers)
        buffers.push_back({b.name, b.row_elems, b.ring_rows, b.tokens_per_row});
    size_t budget = options_.memory_budget;
    if (budget == 0) {
        const char* env = std::getenv("DEEPINFER_MEMORY_BUDGET");
        budget = env && *env ? parse_byte_size(env) : kDefaultMemoryBudget;
    }
    // Host backends: a lazily committed host arena. Device backends: the blocks live in the backend's memory,
    // as every tensor a backend op touches must.
    void* arena = nullptr;
    if (!backend_->is_host()) {
        const kv::Layout layout = kv::make_layout(buffers, options_.block_tokens);
        const size_t bytes = budget / layout.block_bytes * layout.block_bytes;
        DI_CHECK(bytes > 0, "a state memory budget of ", budget, " bytes holds no block of ", layout.block_bytes);
        state_arena_ = backend_->alloc(DType::kU8, Shape{static_cast<int64_t>(bytes)});
        arena = state_arena_.view().data();
    }
    kv_ = std::make_unique<kv::StateManager>(std::move(buffers), budget, options_.block_tokens,
                                             options_.debug_poison_state && backend_->is_host(), arena);
    memory_model_ = {kv_->layout().ring_blocks, kv_->layout().block_tokens};

    sched_config_.max_batch_tokens = options_.max_batch_tokens;
    sched_config_.max_seqs = options_.max_seqs;
    sched_config_.max_prefill_chunk = options_.max_prefill_chunk;
    sched_config_.watermark_blocks = kv_->pool().num_blocks() / 100;
    sched_config_.validate();

    DI_CHECK(options_.max_model_len >= 0 && options_.max_model_len <= info.max_positions, "max_model_len ",
             options_.max_model_len, " is outside [0, ", info.max_positions, "] (the model's maximum positions)");
    int64_t max_len = options_.max_model_len > 0 ? options_.max_model_len : info.max_positions;
    if (kv_->max_tokens_per_sequence() < max_len) {
        DI_LOG(kInfo, "context limit ", max_len, " lowered to ", kv_->max_tokens_per_sequence(),
               " tokens: the state memory budget holds no more for one sequence");
        max_len = kv_->max_tokens_per_sequence();
        len_capped_by_memory_ = true;
    }
    summary_.model_type = info.model_type;
    summary_.dir = dir;
    summary_.vocab_size = info.vocab_size;
    summary_.max_model_len = max_len;
    summary_.eos_token_ids = info.eos_token_ids;
    summary_.has_tokenizer = tokenizer_ != nullptr;
    summary_.weight_bytes = info.weight_bytes;
    summary_.description = info.description;
    runner_ = std::make_unique<ModelRunner>(*model_, *backend_);
}

EngineCore::~EngineCore() {
    if (inflight_) {
        try {
            worker_.wait();
        } catch (...) {
        }
    }
}

const Tokenizer& EngineCore::tokenizer() const {
    DI_CHECK(tokenizer_, "the model directory ", summary_.dir, " has no tokenizer (tokenizer.json)");
    return *tokenizer_;
}

std::string EngineCore::apply_chat_template(const std::string& messages_json, const ChatOptions& options) const {
    nlohmann::ordered_json messages;
    try {
        messages = nlohmann::ordered_json::parse(messages_json);
    } catch (const nlohmann::json::exception& e) {
        DI_THROW("chat messages are not valid JSON: ", e.what());
    }
    DI_CHECK(messages.is_array() && !messages.empty(), "chat messages must be a non-empty JSON array of messages");
    ChatEncodeOptions enc;
    enc.thinking_mode = parse_thinking_mode(options.thinking_mode);
    enc.drop_thinking = options.drop_thinking;
    enc.reasoning_effort = options.reasoning_effort;
    return encode_messages(messages, enc);
}

grammar::GrammarCompiler& EngineCore::grammar_compiler() {
    if (!grammar_) {
        // The model's EOS ids stop generation; tokenizer ids beyond the model's vocabulary are left out.
        const auto model_vocab = static_cast<int32_t>(summary_.vocab_size);
        std::vector<int32_t> stops(summary_.eos_token_ids.begin(), summary_.eos_token_ids.end());
        grammar_ = std::make_unique<grammar::GrammarCompiler>(
            grammar::Vocabulary::from_tokenizer(*tokenizer_, std::move(stops), model_vocab, model_vocab));
    }
    return *grammar_;
}

// ---------------------------------------------------------------------------------------------------------------
// Requests in.

uint64_t EngineCore::add_request(Prompt prompt, SamplingParams params) {
    const double t0 = now();
    auto owned = std::make_unique<Request>();
    Request& r = *owned;
    r.id = next_id_++;
    r.params = std::move(params);
    r.metrics.arrival_time = t0;
    requests_.emplace(r.id, std::move(owned));
    try {
        process_input(r, prompt);
        setup_sampling(r);
        insert_sorted(waiting_, &r);
    } catch (const std::exception& e) {
        r.status = RequestStatus::kFinished;
        r.finish_reason = "error";
        r.error = e.what();
        r.metrics.finished_time = now();
        touched_.push_back(&r);
    }
    cpu_segment(t0, now());
    return r.id;
}

void EngineCore::process_input(Request& r, Prompt& p) {
    r.params.validate();
    const SamplingParams& sp = r.params;
    const int64_t vocab = summary_.vocab_size;
    std::vector<int32_t> ids;
    switch (p.kind) {
        case Prompt::Kind::kText:
            DI_CHECK(!p.text.empty(), "the prompt is empty");
            DI_CHECK(tokenizer_, "a text prompt needs a tokenizer and the model directory ", summary_.dir,
                     " has none: give token ids, or a tokenizer");
            ids = tokenizer_->encode(p.text, /*add_special_tokens=*/true);
            r.prompt_text = std::move(p.text);
            break;
        case Prompt::Kind::kTokenIds:
            DI_CHECK(!p.token_ids.empty(), "the prompt is empty (no token ids)");
            ids = std::move(p.token_ids);
            break;
        case Prompt::Kind::kMessages:
            DI_CHECK(tokenizer_, "chat messages need a tokenizer and the model directory ", summary_.dir, " has none");
            r.prompt_text = apply_chat_template(p.text, p.chat);
            ids = tokenizer_->encode(r.prompt_text, /*add_special_tokens=*/false);
            break;
    }
    DI_CHECK(!ids.empty(), "the prompt is empty (it encodes to no tokens)");
    for (size_t i = 0; i < ids.size(); ++i)
        DI_CHECK(ids[i] >= 0 && ids[i] < vocab, "prompt token id ", ids[i], " at position ", i,
                 " is outside the model's vocabulary [0, ", vocab, ")");
    const auto n = static_cast<int64_t>(ids.size());
    DI_CHECK(n < summary_.max_model_len, "the prompt has ", n, " tokens but the context limit is ",
             summary_.max_model_len, " tokens for prompt and output together",
             len_capped_by_memory_ ? " (all the state memory budget holds for one sequence)" : "");
    DI_CHECK(sp.stop.empty() || tokenizer_, "stop strings need a tokenizer and the model directory ", summary_.dir,
             " has none (use stop_token_ids)");
    for (int32_t t : sp.stop_token_ids)
        DI_CHECK(t < vocab, "stop token id ", t, " is outside the model's vocabulary [0, ", vocab, ")");

    r.tokens = std::move(ids);
    r.num_prompt = n;
    r.max_output = std::min(sp.max_tokens.value_or(std::numeric_limits<int64_t>::max()), summary_.max_model_len - n);
    r.eos_ids = summary_.eos_token_ids;
    r.stop_ids = sp.stop_token_ids;
    if (!sp.ignore_eos) r.stop_ids.insert(r.stop_ids.end(), r.eos_ids.begin(), r.eos_ids.end());
    if (tokenizer_) r.detok = std::make_unique<StreamingDetokenizer>(*tokenizer_, sp.skip_special_tokens);
    r.metrics.num_prompt_tokens = n;
}

void EngineCore::setup_sampling(Request& r) {
    const SamplingParams& sp = r.params;
    SamplerState& s = r.sampler;
    s.options.temperature = sp.temperature;
    s.options.top_k = std::max(sp.top_k, 0);
    s.options.top_p = sp.top_p;
    s.options.min_p = sp.min_p;
    s.options.seed = sp.seq_seed ? *sp.seq_seed : mix_seed(options_.seed, r.id);
    s.penalties = {sp.repetition_penalty, sp.presence_penalty, sp.frequency_penalty};
    if (s.penalties.active()) s.history.set_prompt(std::span<const int32_t>(r.tokens.data(), r.num_prompt));
    s.end_ids = r.stop_ids;
    s.end_ids.insert(s.end_ids.end(), r.eos_ids.begin(), r.eos_ids.end());
    s.min_tokens = sp.min_tokens;
    s.logprobs = sp.logprobs ? *sp.logprobs : -1;
    if (!sp.so_args.empty()) {
        DI_CHECK(tokenizer_, "so_args (structured output) needs a tokenizer and the model directory ", summary_.dir,
                 " has none");
        auto compiled = grammar_compiler().compile(grammar::parse_so_args(sp.so_args));
        s.mask.assign(compiled->vocab().mask_words(), 0);
        s.matcher = std::make_unique<grammar::GrammarMatcher>(std::move(compiled));
    }
}

bool EngineCore::abort_request(uint64_t id) {
    auto it = requests_.find(id);
    if (it == requests_.end() || it->second->finished()) return false;
    finish(*it->second, "abort");
    touched_.push_back(it->second.get());
    return true;
}

bool EngineCore::has_unfinished() const {
    if (inflight_) return true;
    for (const auto& [id, r] : requests_)
        if (!r->finished_reported) return true;
    return false;
}

bool EngineCore::is_finished(uint64_t id) const {
    auto it = requests_.find(id);
    return it == requests_.end() || it->second->finished();
}

// ---------------------------------------------------------------------------------------------------------------
// The step loop.

std::vector<RequestOutput> EngineCore::step() {
    const double t_begin = now();
    std::vector<Request*> touched;
    touched.swap(touched_);
    if (!inflight_) {
        const double t0 = now();
        std::unique_ptr<StepBatch> batch = plan_step();
        if (!batch && running_.empty() && !waiting_.empty() && waiting_.front()->num_pending == 0) {
            // Nothing runs and the first waiting request cannot start: it would wait forever. (The context
            // limit is capped by the pool, so this is a guard against livelock, not an expected path.)
            Request* head = waiting_.front();
            fail(*head, "the request cannot be scheduled: it needs more state memory than the pool has");
            touched.push_back(head);
        }
        cpu_segment(t0, now());
        if (batch) launch(std::move(batch));
    }
    if (inflight_) {
        std::unique_ptr<StepBatch> next;
        if (async_) {  // plan step n+1 while step n computes
            const double t0 = now();
            next = plan_step();
            cpu_segment(t0, now());
        }
        std::unique_ptr<StepBatch> done = wait_inflight();
        const double t0 = now();
        commit(*done, touched);
        // Sequences that ended on their token in step n leave step n+1.
        if (next) std::erase_if(next->items, [](const StepItem& it) { return it.req->finished(); });
        cpu_segment(t0, now());
        if (next && !next->items.empty()) {
            ++stats_.steps_prepared_ahead;
            launch(std::move(next));
        }
    }
    // Detokenization, stop strings and outputs of the finished step (overlapping the next one).
    const double t0 = now();
    std::sort(touched.begin(), touched.end(), [](const Request* a, const Request* b) { return a->id < b->id; });
    touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
    std::vector<RequestOutput> outputs;
    for (Request* r : touched) process_output(*r);
    for (Request* r : touched)
        if (!r->finished_reported) outputs.push_back(make_output(*r));
    reap();
    cpu_segment(t0, now());
    stats_.wall_seconds += now() - t_begin;
    return outputs;
}

std::unique_ptr<StepBatch> EngineCore::plan_step() {
    std::vector<sched::SeqState> running, waiting;
    running.reserve(running_.size());
    for (const Request* r : running_)
        running.push_back({r->id, r->target_tokens(), r->num_computed, r->num_pending, kv_->blocks_held(r->id)});
    for (const Request* r : waiting_) waiting.push_back({r->id, r->target_tokens(), 0, r->num_pending, 0});
    const sched::StepPlan plan =
        sched::schedule(sched_config_, memory_model_, running, waiting, kv_->num_free_blocks());
    for (uint64_t id : plan.preempted) preempt(*requests_.at(id));
    if (plan.empty()) return nullptr;

    auto batch = std::make_unique<StepBatch>();
    const StateSpec& spec = model_->state_spec();
    const double t = now();
    for (const sched::ScheduledSeq& s : plan.scheduled) {
        Request& r = *requests_.at(s.id);
        const int64_t end = r.num_computed + s.num_new_tokens;
        if (s.admitted) {
            DI_ICHECK(kv_->allocate(r.id, end), "the scheduler admitted request ", r.id, " beyond free memory");
            // Rings are views now; pages are attached when the step is launched.
            SequenceMemory memory;
            memory.rings.resize(spec.buffers.size());
            memory.pages.resize(spec.buffers.size());
            for (size_t i = 0; i < spec.buffers.size(); ++i) {
                const StateBufferSpec& b = spec.buffers[i];
                if (b.ring_rows > 0)
                    memory.rings[i] = kv_->ring(r.id, i);
                else
                    memory.pages[i] = PagedRows{{}, kv_->layout().places[i].rows_per_block, b.row_elems};
            }
            r.seq = model_->new_sequence(std::move(memory));
            r.has_state = true;
            r.pages_bound = 0;
            r.status = RequestStatus::kRunning;
            erase_from(waiting_, &r);
            insert_sorted(running_, &r);
            if (r.metrics.first_scheduled_time == 0) r.metrics.first_scheduled_time = t;
        } else {
            DI_ICHECK(kv_->grow(r.id, end), "the scheduler grew request ", r.id, " beyond free memory");
        }
        const bool decode = s.num_new_tokens == 1 && r.num_computed >= r.num_prompt;
        if (!decode) stats_.prompt_tokens += s.num_new_tokens;
        batch->items.push_back({&r, nullptr, nullptr, r.num_computed, s.num_new_tokens, s.samples, {}});
        batch->num_tokens += s.num_new_tokens;
        r.num_computed = end;
        if (s.samples) ++r.num_pending;
    }
    return batch;
}

void EngineCore::preempt(Request& r) {
    release_state(r);
    r.num_computed = 0;
    r.status = RequestStatus::kWaiting;
    erase_from(running_, &r);
    insert_sorted(waiting_, &r);
    ++r.metrics.num_preemptions;
    ++stats_.preemptions;
}

void EngineCore::release_state(Request& r) {
    if (r.has_state) kv_->release(r.id);
    r.has_state = false;
    r.pages_bound = 0;
    if (r.seq) {
        if (r.in_flight) retired_.push_back(std::move(r.seq));  // the running step still reads it
        r.seq.reset();
    }
}

void EngineCore::launch(std::unique_ptr<StepBatch> batch) {
    const double t0 = now();
    const StateSpec& spec = model_->state_spec();
    for (StepItem& it : batch->items) {
        Request& r = *it.req;
        DI_ICHECK(r.seq && !r.in_flight, "request ", r.id, " is not ready to run");
        DI_ICHECK(it.start + it.count <= static_cast<int64_t>(r.tokens.size()), "request ", r.id,
                  " scheduled past its known tokens");
        // Attach the pages allocated since the last step (no step reads this sequence now).
        kv_->bind(r.id);
        const int64_t pages = kv_->num_pages(r.id);
        SequenceMemory& memory = r.seq->memory();
        for (size_t i = 0; i < spec.buffers.size(); ++i) {
            if (spec.buffers[i].tokens_per_row == 0) continue;
            for (int64_t p = r.pages_bound; p < pages; ++p) memory.pages[i].blocks.push_back(kv_->page(r.id, i, p));
        }
        r.pages_bound = pages;
        it.tokens.assign(r.tokens.begin() + it.start, r.tokens.begin() + it.start + it.count);
        it.seq = r.seq.get();
        it.sampler = &r.sampler;
        r.in_flight = true;
    }
    ++stats_.steps;
    cpu_segment(t0, now());
    inflight_ = std::move(batch);
    StepBatch* b = inflight_.get();
    worker_.submit([this, b] { runner_->execute(*b); });
}

std::unique_ptr<StepBatch> EngineCore::wait_inflight() {
    const double t0 = now();
    worker_.wait();
    stats_.wait_seconds += now() - t0;
    std::unique_ptr<StepBatch> done = std::move(inflight_);
    stats_.compute_seconds += done->compute_end - done->compute_start;
    for (const auto& [a, b] : inflight_cpu_)
        stats_.cpu_overlapped_seconds +=
            std::max(0.0, std::min(b, done->compute_end) - std::max(a, done->compute_start));
    inflight_cpu_.clear();
    retired_.clear();
    return done;
}

void EngineCore::commit(StepBatch& batch, std::vector<Request*>& touched) {
    const double t = now();
    for (size_t i = 0; i < batch.items.size(); ++i) {
        const StepItem& it = batch.items[i];
        Request& r = *it.req;
        r.in_flight = false;
        if (it.samples) --r.num_pending;
        if (r.finished()) {
            if (r.seq) release_state(r);
            continue;
        }
        if (!batch.error.empty()) {
            fail(r, "the model step failed: " + batch.error);
            touched.push_back(&r);
            continue;
        }
        if (!it.samples) continue;
        const SampleResult& res = batch.results[i];
        touched.push_back(&r);
        if (!res.error.empty()) {
            fail(r, res.error);
            continue;
        }
        r.tokens.push_back(res.token);
        ++stats_.generated_tokens;
        if (r.num_output() == 1) r.metrics.first_token_time = t;
        r.metrics.last_token_time = t;
        r.metrics.num_generated_tokens = r.num_output();
        if (res.logprobs) {
            r.logprobs.push_back({res.token, res.logprobs->logprob, res.logprobs->rank, res.logprobs->top});
            r.cumulative_logprob += res.logprobs->logprob;
        }
        // Ends decided by the token alone, so that the next step never runs a finished sequence.
        const bool eos = std::find(r.eos_ids.begin(), r.eos_ids.end(), res.token) != r.eos_ids.end();
        if (contains(r.stop_ids, res.token)) {
            if (!eos) r.stop_token_id = res.token;
            r.skip_last_text = true;
            finish(r, "stop");
        } else if (res.grammar_terminated) {
            r.skip_last_text = true;
            finish(r, "stop");
        } else if (r.num_output() >= r.max_output) {
            finish(r, "length");
        }
    }
}

void EngineCore::finish(Request& r, const std::string& reason) {
    r.status = RequestStatus::kFinished;
    r.finish_reason = reason;
    r.metrics.finished_time = now();
    erase_from(running_, &r);
    erase_from(waiting_, &r);
    release_state(r);
}

void EngineCore::fail(Request& r, const std::string& message) {
    r.error = message;
    finish(r, "error");
}

void EngineCore::reap() {
    for (auto it = requests_.begin(); it != requests_.end();) {
        const Request& r = *it->second;
        if (r.finished() && r.finished_reported && !r.in_flight)
            it = requests_.erase(it);
        else
            ++it;
    }
}

void EngineCore::cpu_segment(double start, double end) {
    stats_.cpu_seconds += end - start;
    if (inflight_) inflight_cpu_.emplace_back(start, end);
}

// ---------------------------------------------------------------------------------------------------------------
// Outputs.

void EngineCore::process_output(Request& r) {
    if (!r.detok) return;
    const std::vector<std::string>& stops = r.params.stop;
    const int64_t limit = r.num_output() - (r.skip_last_text ? 1 : 0);
    for (; static_cast<int64_t>(r.ids_detokenized) < limit; ++r.ids_detokenized) {
        const int32_t t = r.tokens[r.num_prompt + r.ids_detokenized];
        if (t < tokenizer_->vocab_size()) r.text += r.detok->push(t);  // ids past the tokenizer have no text
    }
    const bool can_stop = !r.finished() || r.finish_reason == "length";
    if (!stops.empty() && can_stop && r.stop_str.empty() && r.num_output() >= r.params.min_tokens) {
        if (auto m = find_stop_string(r.text, r.stop_checked, stops)) {
            r.text.resize(m->pos + (r.params.include_stop_str_in_output ? stops[m->index].size() : 0));
            r.stop_str = stops[m->index];
            if (r.finished())
                r.finish_reason = "stop";
            else
                finish(r, "stop");
        }
    }
    r.stop_checked = r.text.size();
    if (r.finished() && r.stop_str.empty() && !r.detok_flushed) r.text += r.detok->finish();
    if (r.finished()) r.detok_flushed = true;
}

RequestOutput EngineCore::make_output(Request& r) {
    RequestOutput o;
    o.request_id = r.id;
    o.prompt = r.prompt_text;
    o.prompt_token_ids.assign(r.tokens.begin(), r.tokens.begin() + std::min<int64_t>(r.num_prompt, r.tokens.size()));
    o.finished = r.finished();
    o.error = r.error;
    CompletionOutput c;
    // A running stream holds back text that may still turn into a stop string.
    size_t visible = r.text.size();
    if (!r.finished()) {
        const size_t hold = stop_string_holdback(r.params.stop);
        visible = utf8_safe_prefix(r.text, r.text.size() > hold ? r.text.size() - hold : 0);
    }
    visible = std::max(visible, r.text_reported);
    c.text = r.text.substr(0, visible);
    c.delta_text = r.text.substr(r.text_reported, visible - r.text_reported);
    r.text_reported = visible;
    if (r.num_output() > 0) c.token_ids.assign(r.tokens.begin() + r.num_prompt, r.tokens.end());
    c.delta_token_ids.assign(c.token_ids.begin() + std::min(r.ids_reported, c.token_ids.size()), c.token_ids.end());
    r.ids_reported = c.token_ids.size();
    c.finish_reason = r.finish_reason;
    c.stop_str = r.stop_str;
    c.stop_token_id = r.stop_token_id;
    c.logprobs = r.logprobs;
    c.cumulative_logprob = r.cumulative_logprob;
    o.outputs.push_back(std::move(c));
    o.metrics = r.metrics;
    if (o.finished) r.finished_reported = true;
    return o;
}

MemoryReport EngineCore::memory_report() const {
    const kv::Layout& l = kv_->layout();
    MemoryReport m;
    m.budget_bytes = kv_->budget_bytes();
    m.block_bytes = l.block_bytes;
    m.num_blocks = kv_->pool().num_blocks();
    m.block_tokens = l.block_tokens;
    m.fixed_blocks_per_seq = l.ring_blocks;
    m.fixed_bytes_per_seq = l.fixed_bytes_per_sequence();
    m.bytes_per_token = l.bytes_per_token();
    m.model_bytes_per_token = model_->state_spec().paged_bytes_per_token();
    m.model_ring_bytes = model_->state_spec().ring_bytes();
    m.max_tokens_one_seq = kv_->max_tokens_per_sequence();
    m.max_concurrent_tokens = kv_->max_concurrent_tokens(sched_config_.max_seqs);
    m.free_blocks = kv_->num_free_blocks();
    return m;
}

}  // namespace deepinfer::engine
