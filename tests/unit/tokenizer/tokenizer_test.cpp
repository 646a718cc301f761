// Tokenizer behaviour beyond the golden cases: bad inputs, vocabulary queries, token_bytes, streaming,
// batch and concurrent encoding, long inputs.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "core/thread_pool.h"
#include "deepinfer/error.h"
#include "tokenizer/chat_encoding.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"
#include "tokenizer_test_util.h"

namespace deepinfer {
namespace {

using nlohmann::json;

const Tokenizer& ds() { return test::cached_tokenizer("deepseek_v4"); }

// A tiny valid tokenizer.json to mutate in the bad-input tests.
json tiny() {
    return json::parse(R"({
      "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
      "normalizer": null, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
      "post_processor": null, "decoder": {"type": "ByteLevel"},
      "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}})");
}

void expect_error(const json& j, const std::string& fragment) {
    try {
        Tokenizer::from_json(j.dump());
        ADD_FAILURE() << "no error; wanted one mentioning '" << fragment << "'";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
}

TEST(Tokenizer, MalformedOrUnsupportedFilesGiveClearErrors) {
    EXPECT_NO_THROW(Tokenizer::from_json(tiny().dump()));
    try {
        Tokenizer::from_json("{\"model\": ");
        ADD_FAILURE();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("not valid JSON"), std::string::npos);
    }
    json j = tiny();
    j.erase("model");
    expect_error(j, "no 'model'");
    j = tiny();
    j["model"]["type"] = "WordPiece";
    expect_error(j, "unsupported model type 'WordPiece'");
    j = tiny();
    j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "xx"}};
    expect_error(j, "unsupported normalizer type 'Precompiled'");
    j = tiny();
    j["pre_tokenizer"] = {{"type", "UnicodeScripts"}};
    expect_error(j, "unsupported pre-tokenizer type 'UnicodeScripts'");
    j = tiny();
    j["decoder"] = {{"type", "CTC"}};
    expect_error(j, "unsupported decoder type 'CTC'");
    j = tiny();
    j["post_processor"] = {{"type", "Magic"}};
    expect_error(j, "unsupported post-processor type 'Magic'");
    j = tiny();
    j["model"]["merges"] = {"a c"};
    expect_error(j, "'c', which is not in the vocabulary");
    j = tiny();
    j["model"]["merges"] = {"ab"};
    expect_error(j, "not of the form 'a b'");
    j = tiny();
    j["model"]["vocab"]["x"] = "seven";
    expect_error(j, "not an integer");
    j = tiny();
    j["model"]["dropout"] = 0.1;
    expect_error(j, "dropout");
    j = tiny();
    j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
    expect_error(j, "invalid regex '(unclosed'");
    j = tiny();
    j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Sideways"}};
    expect_error(j, "unknown split behavior 'Sideways'");
    j = tiny();
    j["added_tokens"] = json::array({{{"id", 9}, {"content", ""}}});
    expect_error(j, "empty content");
    j = tiny();
    j["model"]["unk_token"] = "<unk>";
    expect_error(j, "unk_token '<unk>' is not in the vocabulary");
    try {
        Tokenizer::from_json(tiny().dump(), R"({"add_bos_token": true})");
        ADD_FAILURE();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("add_bos_token"), std::string::npos) << e.what();
    }
    EXPECT_THROW(Tokenizer::from_file("/nonexistent/tokenizer.json"), Error);
    EXPECT_THROW(Tokenizer::from_file(test::tok_data("variants.json")), Error);  // JSON, not a tokenizer
}

TEST(Tokenizer, InvalidInputsGiveClearErrors) {
    for (std::string bad : {std::string("abc\xff"), std::string("\xc3"), std::string("\xed\xa0\x80"),
                            std::string("ok\xc0\x80"), std::string("\xf4\x90\x80\x80")}) {
        try {
            ds().encode(bad);
            ADD_FAILURE() << "no error";
        } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find("not valid UTF-8"), std::string::npos) << e.what();
        }
    }
    std::vector<int32_t> bad_ids = {5, ds().vocab_size()};
    EXPECT_THROW(ds().decode(bad_ids), Error);
    bad_ids = {-1};
    EXPECT_THROW(ds().decode(bad_ids), Error);
    StreamingDetokenizer s(ds());
    EXPECT_THROW(s.push(-3), Error);
    EXPECT_TRUE(ds().encode("").empty());
    EXPECT_EQ(ds().decode(std::vector<int32_t>{}), "");
}

TEST(Tokenizer, VocabularyQueries) {
    const Tokenizer& t = ds();
    EXPECT_EQ(t.vocab_size(), 128826);  // V3's 128,815 ids + the 11 V4 tokens of the test copy
    EXPECT_EQ(t.bos_id(), 0);
    EXPECT_EQ(t.eos_id(), 1);
    EXPECT_EQ(t.token_to_id("<｜User｜>"), 128803);
    EXPECT_EQ(t.token_to_id("<think>"), 128815);
    EXPECT_FALSE(t.token_to_id("no such token"));
    EXPECT_TRUE(t.is_special(0));
    EXPECT_TRUE(t.is_special(t.token_to_id("<｜action｜>").value()));
    EXPECT_FALSE(t.is_special(t.token_to_id("<think>").value()));
    EXPECT_FALSE(t.is_special(19923));
    EXPECT_TRUE(t.is_added(128815));
    EXPECT_EQ(t.id_to_token(19923), "Hello");
    EXPECT_EQ(t.id_to_token(2058), "Ġworld");
    EXPECT_EQ(t.token_bytes(2058), " world");
    EXPECT_EQ(t.token_bytes(128815), "<think>");
    EXPECT_EQ(t.token_bytes(-1), "");
    EXPECT_EQ(t.encode("Hello world", true), (std::vector<int32_t>{0, 19923, 2058}));
    const Tokenizer& l2 = test::cached_tokenizer("llama2");
    EXPECT_EQ(l2.token_bytes(l2.token_to_id("<0x0A>").value()), "\n");
    EXPECT_EQ(l2.token_bytes(l2.token_to_id("<0xE4>").value()), "\xE4");
    EXPECT_EQ(l2.token_bytes(l2.token_to_id("▁the").value()), " the");
}

TEST(Tokenizer, TokenBytesReassembleTheText) {
    // For byte-level tokenizers without a normalizer, the token bytes of encode(text) are exactly text.
    for (const char* name : {"deepseek_v4", "llama3", "gpt4o"}) {
        const Tokenizer& t = test::cached_tokenizer(name);
        json g = json::parse(read_file(test::tok_data(std::string("golden_") + name + ".json.gz")));
        for (const json& c : g["cases"]) {
            std::string joined;
            for (int32_t id : c["ids"].get<std::vector<int32_t>>()) joined += t.token_bytes_view(id);
            ASSERT_EQ(joined, c["text"].get<std::string>()) << name;
        }
    }
    // Every id has its bytes ready (the grammar module calls this for the whole vocabulary).
    size_t total = 0;
    for (int32_t id = 0; id < ds().vocab_size(); ++id) total += ds().token_bytes_view(id).size();
    EXPECT_GT(total, 500000u);
}

TEST(Tokenizer, StreamingNeverSplitsCharacters) {
    const Tokenizer& l2 = test::cached_tokenizer("llama2");
    std::string text = "I 🫠 like 🇯🇵 and 👨‍👩‍👧‍👦 a lot ✓";
    auto ids = l2.encode(text);
    StreamingDetokenizer s(l2);
    std::string all;
    int empty_pushes = 0;
    for (int32_t id : ids) {
        std::string d = s.push(id);
        EXPECT_EQ(tok::find_invalid_utf8(d), std::string::npos);
        if (d.empty()) ++empty_pushes;
        all += d;
    }
    all += s.finish();
    EXPECT_GT(empty_pushes, 5);  // the byte-fallback pieces of the emoji are held back
    EXPECT_EQ(all, l2.decode(ids));
    EXPECT_EQ(all, text);

    // A byte sequence that never completes comes out as U+FFFD at the end.
    StreamingDetokenizer s2(l2);
    std::string out = s2.push(l2.token_to_id("<0xE4>").value());
    EXPECT_EQ(out, "");
    out += s2.push(l2.token_to_id("<0xBD>").value());
    EXPECT_EQ(out, "");
    out += s2.finish();
    EXPECT_EQ(out, l2.decode(s2.ids()));
}

// A run of byte-fallback tokens that is not valid UTF-8 decodes to one U+FFFD per byte, the valid tab before
// the stray 0xD7 included: the stream must not emit the tab before it knows the run's end.
TEST(Tokenizer, StreamingHoldsByteFallbackRunsUntilTheyClose) {
    const Tokenizer& l2 = test::cached_tokenizer("llama2");
    const std::vector<int32_t> ids = {30473, l2.token_to_id("<0x09>").value(), l2.token_to_id("<0xD7>").value(), 11670};
    StreamingDetokenizer s(l2);
    std::string out;
    for (int32_t id : ids) out += s.push(id);
    out += s.finish();
    EXPECT_EQ(out, l2.decode(ids));
    EXPECT_EQ(l2.decode(ids), "尾\xEF\xBF\xBD\xEF\xBF\xBD }}");
}

TEST(Tokenizer, StreamingSkipsSpecialTokensWhenAsked) {
    ChatEncodeOptions opts;
    std::string prompt =
        encode_messages(nlohmann::ordered_json::parse(R"([{"role":"user","content":"Hi 你好"}])"), opts);
    auto ids = ds().encode(prompt);
    for (bool skip : {false, true}) {
        StreamingDetokenizer s(ds(), skip);
        std::string all;
        for (int32_t id : ids) all += s.push(id);
        all += s.finish();
        EXPECT_EQ(all, ds().decode(ids, skip));
    }
    EXPECT_EQ(ds().decode(ids, true), "<｜User｜>Hi 你好<｜Assistant｜></think>");  // begin_of_sentence is special
}

TEST(Tokenizer, ChatPromptSpecialTokensAreSingleIds) {
    ChatEncodeOptions opts;
    opts.thinking_mode = ThinkingMode::kThinking;
    std::string prompt = encode_messages(
        nlohmann::ordered_json::parse(R"([{"role":"system","content":"S"},{"role":"latest_reminder","content":"R"},
                                          {"role":"user","content":"Q","task":"title"}])"),
        opts);
    auto ids = ds().encode(prompt);
    for (const char* tok : {"<｜begin▁of▁sentence｜>", "<｜latest_reminder｜>", "<｜User｜>", "<｜title｜>"}) {
        int32_t id = ds().token_to_id(tok).value();
        EXPECT_NE(std::find(ids.begin(), ids.end(), id), ids.end()) << tok;
    }
    EXPECT_EQ(ds().decode(ids), prompt);
}

TEST(Tokenizer, BatchAndConcurrentEncodingMatchSerial) {
    json g = json::parse(read_file(test::tok_data("golden_qwen3.json.gz")));
    std::vector<std::string> texts;
    for (const json& c : g["cases"]) texts.push_back(c["text"].get<std::string>());
    const Tokenizer& t = test::cached_tokenizer("qwen3");
    ThreadPool pool(4);
    auto batch = t.encode_batch(texts, false, &pool);
    ASSERT_EQ(batch.size(), texts.size());
    for (size_t i = 0; i < texts.size(); ++i)
        ASSERT_EQ(batch[i], g["cases"][i]["ids"].get<std::vector<int32_t>>()) << i;
    std::vector<std::thread> threads;
    std::vector<int> bad(4, 0);
    for (int k = 0; k < 4; ++k) {
        threads.emplace_back([&, k] {
            for (size_t i = k; i < texts.size(); i += 4)
                if (t.encode(texts[i]) != batch[i]) ++bad[k];
        });
    }
    for (auto& th : threads) th.join();
    for (int k = 0; k < 4; ++k) EXPECT_EQ(bad[k], 0);
}

TEST(Tokenizer, LongInputsStayFast) {
    // One 200 KB "word" and long whitespace / digit / CJK runs: BPE merging is O(n log n) per word.
    std::string word(200000, 'a');
    auto ids = ds().encode(word);
    EXPECT_FALSE(ids.empty());
    EXPECT_EQ(ds().decode(ids), word);
    std::string mixed = std::string(50000, ' ') + std::string(30000, '7') + "\n";
    for (int i = 0; i < 20000; ++i) mixed += "中";
    EXPECT_EQ(ds().decode(ds().encode(mixed)), mixed);
}

TEST(Tokenizer, RandomInputsNeverCrash) {
    // Random code points (all planes, controls, marks) and random bytes: encode succeeds on valid UTF-8 and
    // round-trips for byte-level tokenizers, and throws deepinfer::Error on invalid UTF-8; random ids decode
    // and stream to the same text. Seeded afresh each run.
    std::mt19937 rng(std::random_device{}());
    const char* names[] = {"deepseek_v4", "llama2", "llama3", "qwen3", "gpt4o", "llama2_normalizers"};
    for (const char* name : names) {
        const Tokenizer& t = test::cached_tokenizer(name);
        for (int iter = 0; iter < 150; ++iter) {
            std::string text;
            int n = static_cast<int>(rng() % 40);
            for (int k = 0; k < n; ++k) {
                uint32_t r = rng();
                char32_t cp = (r % 4 == 0) ? r % 0x80 : (r % 4 == 1) ? 0x80 + r % 0x3000 : r % 0x110000;
                if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;
                tok::append_utf8(text, cp);
            }
            auto ids = t.encode(text, rng() % 2 == 0);
            EXPECT_EQ(tok::find_invalid_utf8(t.decode(ids)), std::string::npos) << name;
            if (std::string(name) == "deepseek_v4" || std::string(name) == "llama3") {
                EXPECT_EQ(t.decode(t.encode(text)), text) << name;
            }
            const bool skip = rng() % 2 == 0;
            StreamingDetokenizer s(t, skip);
            std::string streamed;
            std::vector<int32_t> rand_ids;
            for (int k = 0; k < 12; ++k) rand_ids.push_back(static_cast<int32_t>(rng() % t.vocab_size()));
            for (int32_t id : rand_ids) streamed += s.push(id);
            streamed += s.finish();
            EXPECT_EQ(streamed, t.decode(rand_ids, skip)) << name;
            std::string bytes;
            for (int k = 0; k < 12; ++k) bytes.push_back(static_cast<char>(rng()));
            if (tok::find_invalid_utf8(bytes) == std::string::npos) {
                EXPECT_NO_THROW(t.encode(bytes));
            } else {
                EXPECT_THROW(t.encode(bytes), Error);
            }
        }
    }
}

TEST(Tokenizer, OnigurumaWhitespaceSemantics) {
    // \s follows Unicode White_Space (U+0085 included), as in Oniguruma.
    tok::Regex re("\\s+");
    std::vector<tok::Span> spans;
    re.find_all(
        "a\xC2\x85"
        "b\xE3\x80\x80"
        "c",
        spans);
    ASSERT_EQ(spans.size(), 2u);
    EXPECT_EQ(spans[0].begin, 1u);
    EXPECT_EQ(spans[0].end, 3u);
    spans.clear();
    tok::Regex not_space("[^\\s]+");
    not_space.find_all(
        "ab\xC2\x85"
        "cd",
        spans);
    ASSERT_EQ(spans.size(), 2u);
    EXPECT_EQ(tok::onig_to_pcre2("[\\s\\p{L}]"),
              std::string("[") +
                  "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}"
                  "\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}" +
                  "\\p{L}]");
}

}  // namespace
}  // namespace deepinfer
