// deepinfer: command-line front end. See the CLI contract in docs/ and the README.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "commands.h"
#include "deepinfer/error.h"

namespace {

struct Command {
    const char* name;
    int (*run)(int, char**);
    const char* summary;
};

const Command kCommands[] = {
    {"generate", deepinfer::cli::cmd_generate, "generate tokens from a prompt"},
    {"chat", deepinfer::cli::cmd_chat, "chat with the model interactively"},
    {"bench", deepinfer::cli::cmd_bench, "offline throughput benchmark (requests/s, tokens/s, TTFT, TPOT)"},
    {"logits", deepinfer::cli::cmd_logits, "write the logits of every prompt position to a .npy file"},
    {"perplexity", deepinfer::cli::cmd_perplexity, "perplexity of a text file (default: the model's heldout.txt)"},
    {"tokenize", deepinfer::cli::cmd_tokenize, "encode text to token ids (or decode ids) with a tokenizer.json"},
    {"chat-template", deepinfer::cli::cmd_chat_template, "print the DeepSeek-V4 prompt for chat messages"},
    {"grammar", deepinfer::cli::cmd_grammar, "compile a regex/JSON schema/EBNF grammar and check texts against it"},
};

void print_usage(std::FILE* out) {
    std::fprintf(out, "usage: deepinfer <command> [options]\n\ncommands:\n");
    for (const Command& c : kCommands) std::fprintf(out, "  %-14s %s\n", c.name, c.summary);
    std::fprintf(out, "\n`deepinfer <command> --help` describes a command's options.\n");
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
        print_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (const Command& c : kCommands) {
        if (std::strcmp(argv[1], c.name) != 0) continue;
        try {
            return c.run(argc - 1, argv + 1);
        } catch (const deepinfer::Error& e) {
            std::fprintf(stderr, "deepinfer %s: error: %s\n", c.name, e.what());
            return 1;
        } catch (const std::exception& e) {
            std::fprintf(stderr, "deepinfer %s: error: %s\n", c.name, e.what());
            return 1;
        }
    }
    std::fprintf(stderr, "deepinfer: unknown command '%s'\n\n", argv[1]);
    print_usage(stderr);
    return 2;
}
