// The `deepinfer tokenize` and `deepinfer chat-template` commands, run as a user would (CLI contract in
// the architecture page): outputs, exit codes and one-line errors.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tokenizer_test_util.h"

namespace deepinfer {
namespace {

struct RunResult {
    int code;
    std::string out;  // stdout and stderr
};

RunResult run(const std::string& args) {
    std::string cmd = std::string(DI_CLI_PATH) + " " + args + " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return {-1, ""};
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
    int status = pclose(p);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

std::string temp_file(const std::string& name, const std::string& content) {
    std::string path = ::testing::TempDir() + "/di_tok_cli_" + std::to_string(getpid()) + "_" + name;
    std::ofstream(path, std::ios::binary) << content;
    return path;
}

const std::string kDs = test::tok_data("deepseek_v4");

TEST(TokenizerCli, TokenizeText) {
    auto r = run("tokenize --tokenizer " + kDs + " --text 'Hello world<think>'");
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(r.out, "[19923, 2058, 128815]\n");
    r = run("tokenize --tokenizer " + kDs + "/tokenizer.json.gz --text 'Hello world' --special");
    EXPECT_EQ(r.out, "[0, 19923, 2058]\n");
    r = run("tokenize --tokenizer " + kDs + " --text '[0, 19923, 2058]' --decode");
    EXPECT_EQ(r.out, "<｜begin▁of▁sentence｜>Hello world");
    r = run("tokenize --tokenizer " + kDs + " --text '[0, 19923, 2058]' --decode --skip-special");
    EXPECT_EQ(r.out, "Hello world");
}

TEST(TokenizerCli, TokenizeJsonlMatchesGolden) {
    nlohmann::json g = nlohmann::json::parse(read_file(test::tok_data("golden_llama3.json.gz")));
    std::string in, want;
    for (size_t i = 0; i < 200; ++i) {
        in += g["cases"][i]["text"].dump() + "\n";
        const auto ids = g["cases"][i]["ids"].get<std::vector<int32_t>>();
        std::string line = "[";
        for (size_t k = 0; k < ids.size(); ++k) {
            if (k) line += ", ";
            line += std::to_string(ids[k]);
        }
        want += line + "]\n";
    }
    auto r = run("tokenize --tokenizer " + test::tok_data("llama3") + " --jsonl " + temp_file("in.jsonl", in));
    EXPECT_EQ(r.code, 0);
    EXPECT_EQ(r.out, want);
    // And back: --decode reads arrays and writes JSON strings.
    auto back =
        run("tokenize --tokenizer " + test::tok_data("llama3") + " --decode --jsonl " + temp_file("ids.jsonl", want));
    EXPECT_EQ(back.code, 0);
    std::istringstream lines(back.out);
    std::string line;
    for (size_t i = 0; i < 200 && std::getline(lines, line); ++i)
        ASSERT_EQ(nlohmann::json::parse(line), g["cases"][i]["text"]) << i;
}

TEST(TokenizerCli, ChatTemplatePrintsThePromptExactly) {
    auto cases = nlohmann::ordered_json::parse(read_file(test::tok_data("dsv4_chat_cases.json")));
    int checked = 0;
    for (const auto& c : cases["encode"]) {
        if (c["drop_thinking"] != true) continue;
        std::string args = "chat-template --messages " + temp_file("m.json", c["messages"].dump()) +
                           " --thinking-mode " + c["thinking_mode"].get<std::string>();
        if (!c["reasoning_effort"].is_null()) args += " --reasoning-effort " + c["reasoning_effort"].get<std::string>();
        auto r = run(args);
        ASSERT_EQ(r.code, 0) << r.out;
        EXPECT_EQ(r.out, c["prompt"].get<std::string>()) << c["name"];
        if (++checked == 12) break;
    }
    EXPECT_EQ(checked, 12);
}

TEST(TokenizerCli, BadInputsExitNonZeroWithOneLineError) {
    auto expect_fail = [](const std::string& args, const std::string& fragment) {
        auto r = run(args);
        EXPECT_NE(r.code, 0) << args;
        // Exactly one error line (stderr), naming the problem.
        size_t at = r.out.find("error: ");
        ASSERT_NE(at, std::string::npos) << r.out;
        EXPECT_EQ(at, r.out.rfind("error: ")) << "one error line: " << r.out;
        size_t eol = r.out.find('\n', at);
        ASSERT_NE(eol, std::string::npos);
        EXPECT_NE(r.out.substr(at, eol - at).find(fragment), std::string::npos) << r.out;
    };
    expect_fail("tokenize --tokenizer /nonexistent --text x", "not found");
    expect_fail("tokenize --text x", "--tokenizer is required");
    expect_fail("tokenize --tokenizer " + kDs, "exactly one of --text and --jsonl");
    expect_fail("tokenize --tokenizer " + kDs + " --text \"$(printf '\\377\\376')\"", "not valid UTF-8");
    expect_fail("tokenize --tokenizer " + kDs + " --jsonl " + temp_file("bad.jsonl", "\"ok\"\n{\"a\": 1}\n"),
                ":2: expected a JSON string");
    expect_fail("tokenize --tokenizer " + kDs + " --jsonl " + temp_file("bad2.jsonl", "not json\n"), "not valid JSON");
    expect_fail("tokenize --tokenizer " + kDs + " --decode --text '[1, 999999999]'", "outside");
    expect_fail(
        "tokenize --tokenizer " + temp_file("broken.json", "{\"model\": {\"type\": \"Unigram\"}}") + " --text x",
        "unsupported model type 'Unigram'");
    expect_fail("chat-template --messages " + temp_file("role.json", R"([{"role": "robot", "content": "x"}])"),
                "unknown message role 'robot'");
    expect_fail("chat-template --messages " + temp_file("nojson.json", "[{"), "not valid JSON");
    expect_fail("chat-template --messages " + temp_file("ok.json", R"([{"role": "user", "content": "x"}])") +
                    " --thinking-mode deep",
                "invalid thinking mode");
}

}  // namespace
}  // namespace deepinfer
