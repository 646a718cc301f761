#include "support/checkpoint_edit.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "deepinfer/error.h"

namespace deepinfer::testing_support {

std::string read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void write_text(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary);
    out << text;
}

std::map<std::string, RawTensor> read_safetensors(const std::string& path) {
    const std::string bytes = read_text(path);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
    nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
    std::map<std::string, RawTensor> out;
    for (auto it = header.begin(); it != header.end(); ++it) {
        if (it.key() == "__metadata__") continue;
        RawTensor t;
        t.dtype = it.value()["dtype"];
        t.shape = it.value()["shape"].get<std::vector<int64_t>>();
        const uint64_t b = it.value()["data_offsets"][0], e = it.value()["data_offsets"][1];
        t.bytes.assign(bytes.begin() + 8 + n + b, bytes.begin() + 8 + n + e);
        out[it.key()] = t;
    }
    return out;
}

void write_safetensors(const std::string& path, const std::map<std::string, RawTensor>& tensors) {
    nlohmann::json header = nlohmann::json::object();
    std::string data;
    for (const auto& [name, t] : tensors) {
        header[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
        data.append(t.bytes.begin(), t.bytes.end());
    }
    std::string h = header.dump();
    while (h.size() % 8) h.push_back(' ');
    std::string out(8, '\0');
    uint64_t n = h.size();
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    write_text(path, out + h + data);
}

std::string copy_fixture(const std::string& fixture_dir, const std::string& name) {
    const std::string dir = ::testing::TempDir() + "/" + name;
    std::string ignored;
    run_command("rm -rf '" + dir + "' && mkdir -p '" + dir + "'", &ignored);
    DIR* d = opendir(fixture_dir.c_str());
    DI_CHECK(d, "cannot open ", fixture_dir);
    while (dirent* ent = readdir(d)) {
        const std::string f = ent->d_name;
        if (f == "." || f == "..") continue;
        write_text(dir + "/" + f, read_text(fixture_dir + "/" + f));
    }
    closedir(d);
    return dir;
}

int run_command(const std::string& command, std::string* output) {
    output->clear();
    FILE* p = popen((command + " 2>&1").c_str(), "r");
    if (!p) return -1;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) output->append(buf, n);
    const int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace deepinfer::testing_support
