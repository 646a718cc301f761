// The deepinfer subcommands. Each takes the arguments after its name (argv[0] is the command name)
// and returns the process exit code. Errors are thrown as deepinfer::Error and reported by main().
#pragma once

#include <string>

namespace cxxopts {
class Options;
class ParseResult;
}  // namespace cxxopts

namespace deepinfer {
struct EngineOptions;
struct SamplingParams;
}  // namespace deepinfer

namespace deepinfer::cli {

int cmd_generate(int argc, char** argv);
int cmd_logits(int argc, char** argv);
int cmd_perplexity(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_chat_template(int argc, char** argv);
int cmd_chat(int argc, char** argv);
int cmd_bench(int argc, char** argv);
int cmd_grammar(int argc, char** argv);

// Engine and sampling flags shared by generate, chat and bench (defined in cmd_generate.cpp).
void add_engine_options(cxxopts::Options& opts);
EngineOptions engine_options(const cxxopts::ParseResult& args);
void add_sampling_options(cxxopts::Options& opts, const std::string& max_tokens, const std::string& temperature);
SamplingParams sampling_params(const cxxopts::ParseResult& args);

}  // namespace deepinfer::cli
