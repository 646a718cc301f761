// The deepinfer CLI's generate, chat and bench commands, run as a user would (exit codes, outputs, one-line
// errors).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "support/checkpoint_edit.h"
#include "support/npy_compare.h"
#include "support/scoped_env.h"
#include "test_models.h"

namespace deepinfer {
namespace {

using namespace testing_support;

struct CliResult {
    int status;
    std::string out;  // stdout and stderr together unless split
};

CliResult cli(const std::string& args, const std::string& stdin_text = "", bool stderr_too = true) {
    std::string cmd = std::string(DI_CLI_PATH) + " " + args;
    if (!stdin_text.empty()) {
        const std::string in = ::testing::TempDir() + "/cli_stdin_" + std::to_string(getpid());
        write_text(in, stdin_text);
        cmd += " < '" + in + "'";
    }
    if (!stderr_too) cmd = "(" + cmd + " 2>/dev/null)";
    CliResult r;
    r.status = run_command(cmd, &r.out);  // run_command adds 2>&1 (a no-op after 2>/dev/null)
    return r;
}

std::string fixture() { return data_path("v4/v4_tiny_c"); }
std::string engine_flags() { return " --threads 2 --memory-budget 64MiB "; }

int count_lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

TEST(Cli, GenerateIdsReproducesTheReferenceAndWritesNpy) {
    const std::string out_npy = ::testing::TempDir() + "/gen_" + std::to_string(getpid()) + ".npy";
    const CliResult r = cli("generate --model " + fixture() + " --ids-npy " + fixture() + "/ids.npy --max-tokens 48 " +
                            "--ignore-eos --max-batch-tokens 100 --out " + out_npy + engine_flags());
    ASSERT_EQ(r.status, 0) << r.out;
    const std::vector<int32_t> ref = load_i32(fixture() + "/gen.npy");
    EXPECT_EQ(load_i32(out_npy), ref);
    // Streamed ids on stdout, then the summary.
    std::string expected;
    for (size_t i = 0; i < ref.size(); ++i) expected += (i ? " " : "") + std::to_string(ref[i]);
    EXPECT_NE(r.out.find(expected), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("TTFT"), std::string::npos);
    EXPECT_NE(r.out.find("tokens/s"), std::string::npos);
    std::remove(out_npy.c_str());
}

TEST(Cli, GenerateTextStreamsAndSeedsReproduce) {
    const std::string model = wide_vocab_model_dir();
    const std::string args = "generate --model " + model +
                             " --prompt 'Hello there' --max-tokens 12 --ignore-eos "
                             "--temperature 0.8 --top-p 0.9 --seed 5" +
                             engine_flags();
    const CliResult a = cli(args, "", false), b = cli(args, "", false);
    ASSERT_EQ(a.status, 0) << a.out;
    EXPECT_EQ(a.out, b.out);
    EXPECT_FALSE(a.out.empty());
    const CliResult c = cli(args +
                                " --stop-token-id 1 --min-p 0.05 --repetition-penalty 1.2 --so-args "
                                "'{\"type\": \"regex\", \"value\": \"[a-z]+\"}'",
                            "", false);
    ASSERT_EQ(c.status, 0) << c.out;
    std::string text = c.out;
    while (!text.empty() && text.back() == '\n') text.pop_back();
    for (char ch : text) EXPECT_TRUE(ch >= 'a' && ch <= 'z') << text;
}

TEST(Cli, GenerateChatMessages) {
    const std::string msgs = ::testing::TempDir() + "/msgs_" + std::to_string(getpid()) + ".json";
    write_text(msgs, R"([{"role": "user", "content": "Hi"}])");
    const CliResult r = cli("generate --model " + wide_vocab_model_dir() + " --chat " + msgs +
                            " --thinking-mode thinking --max-tokens 6 --ignore-eos" + engine_flags());
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("generated 6"), std::string::npos) << r.out;
    std::remove(msgs.c_str());
}

TEST(Cli, GenerateErrorsAreOneLine) {
    const std::string ids = " --ids-npy " + fixture() + "/ids.npy";
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"generate --model " + fixture() + " --prompt hi", "tokenizer"},
        {"generate --model " + fixture() + ids + " --temperature -1", "temperature"},
        {"generate --model " + fixture() + ids + " --top-p 1.5", "top_p"},
        {"generate --model " + fixture() + ids + " --load-format bogus", "bogus"},
        {"generate --model " + fixture() + ids + " --device tpu", "tpu"},
        {"generate --model /nonexistent" + ids, "/nonexistent"},
        {"generate --model " + fixture(), "exactly one of"},
        {"generate --model " + fixture() + ids + " --memory-budget lots", "byte size"},
        {"chat --model " + fixture(), "tokenizer"},
        {"bench --model " + fixture() + " --input-len 500 --output-len 100", "context limit"},
    };
    for (const auto& [args, message] : cases) {
        const size_t cmd = args.find(' ');  // engine flags first: the case's own flags win
        const CliResult r = cli(args.substr(0, cmd) + engine_flags() + args.substr(cmd));
        EXPECT_EQ(r.status, 1) << args << "\n" << r.out;
        EXPECT_EQ(count_lines(r.out), 1) << args << "\n" << r.out;
        EXPECT_NE(r.out.find(message), std::string::npos) << args << "\n" << r.out;
    }
}

TEST(Cli, RandomWeightsNeedOnlyAConfig) {
    const std::string dir = ::testing::TempDir() + "/config_only_" + std::to_string(getpid());
    std::string ignored;
    run_command("mkdir -p '" + dir + "'", &ignored);
    write_text(dir + "/config.json", read_text(fixture() + "/config.json"));
    const CliResult g = cli("generate --model " + dir + " --load-format random --ids-npy " + fixture() +
                            "/ids.npy --max-tokens 5 --ignore-eos" + engine_flags());
    EXPECT_EQ(g.status, 0) << g.out;
    EXPECT_NE(g.out.find("generated 5"), std::string::npos) << g.out;
    const CliResult b = cli("bench --model " + dir +
                            " --load-format random --num-prompts 4 --input-len 16 "
                            "--output-len 4" +
                            engine_flags());
    EXPECT_EQ(b.status, 0) << b.out;
    EXPECT_NE(b.out.find("requests/s"), std::string::npos) << b.out;
    run_command("rm -rf '" + dir + "'", &ignored);
}

TEST(Cli, GenerateUsesTheEnvironmentsModel) {
    ScopedEnv no_model("DEEPINFER_HF_MODEL_DIR", nullptr);
    const CliResult r =
        cli("generate --ids-npy " + fixture() + "/ids.npy --max-tokens 4 --ignore-eos --quiet" + engine_flags());
    // With DEEPINFER_HF_MODEL_DIR unset, the built-in default model (models/deepinfer-tiny-v4).
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("generated 4"), std::string::npos) << r.out;
    const CliResult t = cli("generate --prompt 'def fibonacci(n):' --max-tokens 12 --ignore-eos" + engine_flags());
    EXPECT_EQ(t.status, 0) << t.out;
    EXPECT_EQ(t.out.rfind("def fibonacci(n):", 0), std::string::npos) << "the prompt is not echoed: " << t.out;
    EXPECT_NE(t.out.find("generated 12"), std::string::npos) << t.out;
}

TEST(Cli, PerplexityOfTheDefaultModelsHeldOutText) {
    ScopedEnv no_model("DEEPINFER_HF_MODEL_DIR", nullptr);
    const std::string json = ::testing::TempDir() + "/ppl_" + std::to_string(getpid()) + ".json";
    const CliResult r = cli("perplexity --max-windows 2 --threads 2 --json " + json);
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_NE(r.out.find("over 1024 tokens in 2 windows of 512"), std::string::npos) << r.out;
    EXPECT_NE(read_text(json).find("\"window_nll\""), std::string::npos);
    const std::string text = ::testing::TempDir() + "/ppl_text_" + std::to_string(getpid()) + ".txt";
    write_text(text, "x = 1\n");
    const std::vector<std::pair<std::string, std::string>> bad = {
        {"perplexity --text-file /nonexistent.txt", "/nonexistent.txt"},
        {"perplexity --context 0", "context"},
        {"perplexity --model " + fixture() + " --text-file " + text, "tokenizer"},
    };
    for (const auto& [args, message] : bad) {
        const CliResult e = cli(args + " --threads 2");
        EXPECT_EQ(e.status, 1) << args << "\n" << e.out;
        EXPECT_EQ(count_lines(e.out), 1) << args << "\n" << e.out;
        EXPECT_NE(e.out.find(message), std::string::npos) << args << "\n" << e.out;
    }
}

TEST(Cli, ChatReadsMessagesFromStdin) {
    const CliResult r =
        cli("chat --model " + wide_vocab_model_dir() + " --max-tokens 5 --temperature 0 --ignore-eos" + engine_flags(),
            "Hello!\n\n/reset\nHow are you?\n/exit\nnot read\n");
    EXPECT_EQ(r.status, 0) << r.out;
    EXPECT_GE(count_lines(r.out), 2) << r.out;
    EXPECT_EQ(r.out.find("error"), std::string::npos) << r.out;
}

TEST(Cli, BenchPrintsATableAndWritesJson) {
    const std::string json_path = ::testing::TempDir() + "/bench_" + std::to_string(getpid()) + ".json";
    for (const char* mode : {"on", "off"}) {
        const CliResult r =
            cli("bench --model " + fixture() + " --num-prompts 12 --input-len 40 --output-len 10 " +
                "--range-ratio 0.5 --max-seqs 8 --async-scheduling " + mode + " --json " + json_path + engine_flags());
        ASSERT_EQ(r.status, 0) << r.out;
        for (const char* key : {"requests/s", "output tokens/s", "TTFT", "TPOT", "CPU work overlapped"})
            EXPECT_NE(r.out.find(key), std::string::npos) << key << "\n" << r.out;
        const nlohmann::json j = nlohmann::json::parse(read_text(json_path));
        EXPECT_EQ(j.at("num_prompts"), 12);
        EXPECT_GT(j.at("requests_per_s").get<double>(), 0);
        EXPECT_GT(j.at("ttft_ms").at("p50").get<double>(), 0);
        EXPECT_LE(j.at("ttft_ms").at("p50").get<double>(), j.at("ttft_ms").at("p99").get<double>());
        EXPECT_EQ(j.at("async_scheduling").get<bool>(), std::string(mode) == "on");
    }
    std::remove(json_path.c_str());
}

}  // namespace
}  // namespace deepinfer
