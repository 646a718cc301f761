// The deepinfer subcommands. Each takes the arguments after its name (argv[0] is the command name)
// and returns the process exit code. Errors are thrown as deepinfer::Error and reported by main().
#pragma once

namespace deepinfer::cli {

int cmd_generate(int argc, char** argv);
int cmd_logits(int argc, char** argv);
int cmd_tokenize(int argc, char** argv);
int cmd_chat_template(int argc, char** argv);
int cmd_grammar(int argc, char** argv);

}  // namespace deepinfer::cli
