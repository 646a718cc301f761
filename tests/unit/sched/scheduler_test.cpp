// The scheduler's decisions on small hand-made situations.
#include "sched/scheduler.h"

#include <gtest/gtest.h>

#include "deepinfer/error.h"

namespace deepinfer::sched {
namespace {

// 1 fixed block per sequence, 16 tokens per block.
const MemoryModel kMem{1, 16};

SchedulerConfig config(int64_t tokens, int64_t seqs, int64_t chunk = 0) {
    SchedulerConfig c;
    c.max_batch_tokens = tokens;
    c.max_seqs = seqs;
    c.max_prefill_chunk = chunk;
    return c;
}

SeqState fresh(uint64_t id, int64_t prompt) { return {id, prompt, 0, 0, 0}; }
// A running request that has computed `computed` tokens and wants one more.
SeqState decoding(uint64_t id, int64_t computed) { return {id, computed + 1, computed, 0, kMem.blocks_for(computed)}; }

std::vector<uint64_t> ids(const StepPlan& p) {
    std::vector<uint64_t> v;
    for (const ScheduledSeq& s : p.scheduled) v.push_back(s.id);
    return v;
}

TEST(Scheduler, MemoryFormula) {
    EXPECT_EQ(kMem.blocks_for(0), 1);
    EXPECT_EQ(kMem.blocks_for(16), 2);
    EXPECT_EQ(kMem.blocks_for(17), 3);
    EXPECT_EQ((MemoryModel{3, 0}).blocks_for(1000), 3);
}

TEST(Scheduler, DecodesGoBeforePrefillsAndAdmissions) {
    const std::vector<SeqState> running = {{1, 100, 40, 0, kMem.blocks_for(40)}, decoding(2, 30), decoding(3, 50)};
    const std::vector<SeqState> waiting = {fresh(4, 20)};
    // A small budget: both decodes, then what is left for the running prefill, nothing for the newcomer.
    StepPlan p = schedule(config(32, 8), kMem, running, waiting, 100);
    EXPECT_EQ(ids(p), (std::vector<uint64_t>{2, 3, 1}));
    EXPECT_EQ(p.scheduled[2].num_new_tokens, 30);
    EXPECT_FALSE(p.scheduled[2].samples);
    EXPECT_TRUE(p.scheduled[0].samples && p.scheduled[1].samples);
    EXPECT_EQ(p.num_tokens, 32);
    // A large budget: the prefill finishes (and samples), the newcomer is admitted whole.
    p = schedule(config(100, 8), kMem, running, waiting, 100);
    EXPECT_EQ(ids(p), (std::vector<uint64_t>{2, 3, 1, 4}));
    EXPECT_EQ(p.scheduled[2].num_new_tokens, 60);
    EXPECT_TRUE(p.scheduled[2].samples);
    EXPECT_TRUE(p.scheduled[3].admitted);
    EXPECT_EQ(p.scheduled[3].num_new_tokens, 20);
    EXPECT_EQ(p.scheduled[3].new_blocks, kMem.blocks_for(20));
    EXPECT_EQ(p.num_tokens, 82);
    EXPECT_TRUE(p.preempted.empty());
}

TEST(Scheduler, LongPromptsArePrefilledInChunks) {
    SeqState r = fresh(1, 100);
    std::vector<int64_t> chunks;
    bool running = false;
    for (int step = 0; step < 10 && r.num_computed < r.num_tokens; ++step) {
        const std::vector<SeqState> one = {r};
        const StepPlan p =
            running ? schedule(config(64, 4, 24), kMem, one, {}, 100) : schedule(config(64, 4, 24), kMem, {}, one, 100);
        ASSERT_EQ(p.scheduled.size(), 1u);
        EXPECT_EQ(p.scheduled[0].admitted, !running);
        chunks.push_back(p.scheduled[0].num_new_tokens);
        EXPECT_EQ(p.scheduled[0].samples, r.num_computed + chunks.back() == 100);
        r.num_computed += chunks.back();
        r.blocks_held += p.scheduled[0].new_blocks;
        EXPECT_EQ(r.blocks_held, kMem.blocks_for(r.num_computed));
        running = true;
    }
    EXPECT_EQ(chunks, (std::vector<int64_t>{24, 24, 24, 24, 4}));
}

TEST(Scheduler, AdmissionIsFirstComeFirstServed) {
    // The first waiting request does not fit in memory: nobody behind it is admitted.
    const std::vector<SeqState> waiting = {fresh(1, 200), fresh(2, 10), fresh(3, 10)};
    StepPlan p = schedule(config(512, 8), kMem, {}, waiting, 5);
    EXPECT_TRUE(p.empty());
    // Enough memory: in order, until the sequence limit.
    p = schedule(config(512, 2), kMem, {}, waiting, 100);
    EXPECT_EQ(ids(p), (std::vector<uint64_t>{1, 2}));
    // A running request counts against the limit.
    const std::vector<SeqState> running = {decoding(0, 5)};
    p = schedule(config(512, 2), kMem, running, waiting, 100);
    EXPECT_EQ(ids(p), (std::vector<uint64_t>{0, 1}));
}

TEST(Scheduler, PreemptsTheLatestArrivalWhenMemoryRunsOut) {
    // Three decodes, each at a block boundary (the next token needs a new block); one block free.
    const std::vector<SeqState> running = {decoding(1, 16), decoding(2, 32), decoding(3, 48)};
    const std::vector<SeqState> waiting = {fresh(9, 4)};
    const StepPlan p = schedule(config(64, 8), kMem, running, waiting, 1);
    EXPECT_EQ(ids(p), (std::vector<uint64_t>{1, 2}));
    EXPECT_EQ(p.preempted, (std::vector<uint64_t>{3}));
    EXPECT_EQ(p.new_blocks, 2);  // 1 free + the blocks request 3 gave back cover both
}

TEST(Scheduler, TheOnlyRequestGivesWayItself) {
    const std::vector<SeqState> running = {decoding(1, 16)};
    const StepPlan p = schedule(config(64, 8), kMem, running, {}, 0);
    EXPECT_TRUE(p.empty());
    EXPECT_EQ(p.preempted, (std::vector<uint64_t>{1}));
}

TEST(Scheduler, PreemptingAScheduledDecodeGivesBackItsBudgetAndBlocks) {
    // Request 1 continues its prefill (needs 3 new blocks); request 2 decodes first and takes the only free block.
    const std::vector<SeqState> running = {{1, 64, 16, 0, kMem.blocks_for(16)}, decoding(2, 16)};
    const StepPlan p = schedule(config(64, 8), kMem, running, {}, 1);
    EXPECT_EQ(p.preempted, (std::vector<uint64_t>{2}));
    ASSERT_EQ(ids(p), (std::vector<uint64_t>{1}));
    EXPECT_EQ(p.scheduled[0].num_new_tokens, 48);
    EXPECT_EQ(p.num_tokens, 48);
    EXPECT_EQ(p.new_blocks, 3);
}

TEST(Scheduler, NoAdmissionInAStepThatPreempted) {
    const std::vector<SeqState> running = {decoding(1, 16), decoding(2, 16)};
    const std::vector<SeqState> waiting = {fresh(3, 1)};
    const StepPlan p = schedule(config(64, 8), kMem, running, waiting, 0);
    EXPECT_EQ(p.preempted, (std::vector<uint64_t>{2}));
    EXPECT_EQ(ids(p), (std::vector<uint64_t>{1}));
}

TEST(Scheduler, WaitsForPendingSamplesAndFinalTokens) {
    // A preempted request whose last sample is still being computed cannot be recomputed yet.
    const std::vector<SeqState> waiting = {{1, 20, 0, 1, 0}, fresh(2, 5)};
    EXPECT_TRUE(schedule(config(64, 8), kMem, {}, waiting, 100).empty());
    // A running request with nothing left to feed (its pending sample is its last token) is skipped.
    const std::vector<SeqState> running = {{3, 10, 10, 1, kMem.blocks_for(10)}};
    const StepPlan p = schedule(config(64, 8), kMem, running, {}, 100);
    EXPECT_TRUE(p.empty());
    EXPECT_TRUE(p.preempted.empty());
}

TEST(Scheduler, WatermarkKeepsRoomForDecodes) {
    SchedulerConfig c = config(512, 8);
    c.watermark_blocks = 3;
    const std::vector<SeqState> waiting = {fresh(2, 16)};  // needs 2 blocks
    const std::vector<SeqState> running = {decoding(1, 5)};
    EXPECT_EQ(ids(schedule(c, kMem, running, waiting, 4)), (std::vector<uint64_t>{1}));
    EXPECT_EQ(ids(schedule(c, kMem, running, waiting, 5)), (std::vector<uint64_t>{1, 2}));
    // With nothing running the watermark does not apply.
    EXPECT_EQ(ids(schedule(c, kMem, {}, waiting, 2)), (std::vector<uint64_t>{2}));
}

TEST(Scheduler, ConfigValidation) {
    EXPECT_THROW(config(0, 8).validate(), Error);
    EXPECT_THROW(config(8, 0).validate(), Error);
    EXPECT_THROW(config(8, 8, -1).validate(), Error);
    EXPECT_NO_THROW(config(8, 8).validate());
    const std::vector<SeqState> unsorted = {fresh(2, 1), fresh(1, 1)};
    EXPECT_THROW(schedule(config(8, 8), kMem, {}, unsorted, 10), InternalError);
}

}  // namespace
}  // namespace deepinfer::sched
