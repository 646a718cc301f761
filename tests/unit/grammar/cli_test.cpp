// `deepinfer grammar`: the CLI contract (accept/reject output, exit codes, --stats, --tokenizer).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

struct CliResult {
    int code = -1;
    std::string out, err;
};

std::string quote(const std::string& s) {
    std::string q = "'";
    for (char c : s) {
        if (c == '\'') {
            q += "'\\''";
        } else {
            q += c;
        }
    }
    return q + "'";
}

CliResult run(const std::vector<std::string>& args) {
    std::string dir = ::testing::TempDir();
    std::string err_path = dir + "/grammar_cli_stderr.txt";
    std::string cmd = quote(DI_CLI_PATH) + " grammar";
    for (const auto& a : args) cmd += " " + quote(a);
    cmd += " 2>" + quote(err_path);
    CliResult r;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return r;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
    int status = pclose(p);
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::ifstream e(err_path);
    r.err.assign(std::istreambuf_iterator<char>(e), std::istreambuf_iterator<char>());
    return r;
}

std::string write_temp(const std::string& name, const std::string& text) {
    std::string path = ::testing::TempDir() + "/" + name;
    std::ofstream(path) << text;
    return path;
}

TEST(GrammarCli, RegexCheck) {
    CliResult r = run({"--regex", "[a-z]+@[a-z]+\\.com", "--check", "joe@mail.com"});
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, "accept\n");
    r = run({"--regex", "[a-z]+", "--check", "abc\n"});  // anchored: the newline is not matched
    EXPECT_EQ(r.out, "reject\n");
    EXPECT_EQ(r.code, 0);
}

TEST(GrammarCli, JsonSchemaCheckJsonl) {
    std::string schema = write_temp(
        "cli_schema.json", R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})");
    std::string texts = write_temp(
        "cli_texts.jsonl", "\"{\\\"a\\\": 1}\"\n\"{\\\"a\\\": \\\"x\\\"}\"\n\"{\\\"a\\\": 1, \\\"b\\\": 2}\"\n");
    CliResult r = run({"--json-schema", schema, "--check-jsonl", texts});
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, "accept\nreject\naccept\n");
    r = run({"--json-schema", schema, "--strict", "--check-jsonl", texts});
    EXPECT_EQ(r.out, "accept\nreject\nreject\n");
    // Token by token through the masks with the DeepSeek tokenizer: same answers.
    std::string tok = std::string(DI_TEST_DATA_DIR) + "/tokenizer/deepseek_v4/tokenizer.json.gz";
    r = run({"--json-schema", schema, "--tokenizer", tok, "--check-jsonl", texts});
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out, "accept\nreject\naccept\n");
}

TEST(GrammarCli, EbnfChoiceJsonObjectAndStats) {
    std::string ebnf = write_temp("cli.ebnf", "root ::= \"a\" b\nb ::= [0-9]+\n");
    CliResult r = run({"--ebnf", ebnf, "--check", "a12", "--stats"});
    EXPECT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("compile_ms "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("states "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("accept\n"), std::string::npos) << r.out;
    r = run({"--choice", "red", "--choice", "green", "--check", "green"});
    EXPECT_EQ(r.out, "accept\n");
    r = run({"--json-object", "--check", "{\"k\": [1, 2]}"});
    EXPECT_EQ(r.out, "accept\n");
    r = run({"--json-object", "--whitespace", "compact", "--check", "{\"k\": 1}"});
    EXPECT_EQ(r.out, "reject\n");
}

TEST(GrammarCli, InvalidGrammarExitsTwoWithMessage) {
    CliResult r = run({"--regex", "(ab", "--check", "ab"});
    EXPECT_EQ(r.code, 2);
    EXPECT_EQ(r.out, "");
    EXPECT_NE(r.err.find("invalid regex"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("unterminated group"), std::string::npos) << r.err;
    std::string schema = write_temp("cli_bad.json", R"({"type": "array", "uniqueItems": true})");
    r = run({"--json-schema", schema});
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("uniqueItems"), std::string::npos) << r.err;
    std::string ebnf = write_temp("cli_bad.ebnf", "root ::= x\n");
    r = run({"--ebnf", ebnf});
    EXPECT_EQ(r.code, 2);
    EXPECT_NE(r.err.find("line 1, column 10"), std::string::npos) << r.err;
}

TEST(GrammarCli, BadUsageIsAnError) {
    EXPECT_NE(run({"--check", "x"}).code, 0);                 // no grammar
    EXPECT_NE(run({"--regex", "a", "--ebnf", "f"}).code, 0);  // two grammars
    EXPECT_NE(run({"--regex", "a", "--bogus"}).code, 0);      // unknown option
    EXPECT_NE(run({"--json-schema", "/nonexistent/schema.json"}).code, 0);
    CliResult r = run({"--help"});
    EXPECT_EQ(r.code, 0);
    EXPECT_NE(r.out.find("usage: deepinfer grammar"), std::string::npos);
}

}  // namespace
