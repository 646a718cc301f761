// Test helpers that copy a fixture checkpoint and damage it in controlled ways.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace deepinfer::testing_support {

struct RawTensor {
    std::string dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
};

// Reads every tensor of one .safetensors file.
std::map<std::string, RawTensor> read_safetensors(const std::string& path);
// Writes tensors (sorted by name) as a .safetensors file.
void write_safetensors(const std::string& path, const std::map<std::string, RawTensor>& tensors);

// A fresh directory under the test temp dir holding a copy of a fixture checkpoint directory.
std::string copy_fixture(const std::string& fixture_dir, const std::string& name);

std::string read_text(const std::string& path);
void write_text(const std::string& path, const std::string& text);

// Runs a shell command; returns the exit status and captures stdout+stderr.
int run_command(const std::string& command, std::string* output);

}  // namespace deepinfer::testing_support
