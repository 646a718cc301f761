// Models for the end-to-end tests.
#pragma once

#include <string>

namespace deepinfer::testing_support {

// The v4_tiny_c fixture with its vocabulary widened to DeepSeek-V4's 129280 ids (new embedding and head rows
// are sign-flipped, slightly perturbed copies of the fixture's 256 rows, bf16) and the DeepSeek-V4 tokenizer
// beside it, so that text prompts, chat encoding, stop strings and grammars over real multi-byte tokens run
// end to end. Written once per process into the test temp dir (removed at exit).
const std::string& wide_vocab_model_dir();

}  // namespace deepinfer::testing_support
