#include "model/safetensors.h"

#include <dirent.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/log.h"

namespace deepinfer {

namespace {

constexpr uint64_t kMaxHeaderBytes = 256ull << 20;

uint64_t read_u64_le(const uint8_t* p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path), map_(path) {
    parse(map_.data(), map_.size());
}

SafetensorsFile::SafetensorsFile(const uint8_t* bytes, size_t size, const std::string& what) : path_(what) {
    parse(bytes, size);
}

void SafetensorsFile::parse(const uint8_t* bytes, size_t size) {
    DI_CHECK(size >= 8, path_, ": not a safetensors file (", size, " bytes, too short for a header)");
    const uint64_t header_len = read_u64_le(bytes);
    DI_CHECK(header_len <= kMaxHeaderBytes && header_len <= size - 8, path_, ": truncated or corrupt safetensors ",
             "header (header claims ", header_len, " bytes, file has ", size, ")");
    const uint8_t* data_begin = bytes + 8 + header_len;
    const uint64_t data_size = size - 8 - header_len;
    data_ = data_begin;

    nlohmann::json header;
    try {
        header = nlohmann::json::parse(bytes + 8, bytes + 8 + header_len);
    } catch (const nlohmann::json::exception& e) {
        DI_THROW(path_, ": corrupt safetensors header: ", e.what());
    }
    DI_CHECK(header.is_object(), path_, ": corrupt safetensors header: not a JSON object");

    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    for (auto it = header.begin(); it != header.end(); ++it) {
        if (it.key() == "__metadata__") continue;
        const std::string& name = it.key();
        const nlohmann::json& e = it.value();
        const std::string where = path_ + ": tensor '" + name + "'";
        DI_CHECK(e.is_object() && e.contains("dtype") && e.contains("shape") && e.contains("data_offsets"), where,
                 ": header entry lacks dtype/shape/data_offsets");
        DI_CHECK(e["dtype"].is_string(), where, ": dtype is not a string");
        TensorInfo t;
        t.name = name;
        const std::string dtype = e["dtype"].get<std::string>();
        DI_CHECK(parse_safetensors_dtype(dtype, &t.dtype), where, ": unsupported dtype '", dtype, "'");
        const nlohmann::json& shape = e["shape"];
        DI_CHECK(shape.is_array() && shape.size() <= kMaxDims, where, ": shape must be an array of at most ",
                 kMaxDims, " dims");
        uint64_t numel = 1;
        for (const auto& d : shape) {
            DI_CHECK(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0), where,
                     ": shape entries must be non-negative integers");
            uint64_t v = d.get<uint64_t>();
            DI_CHECK(v < (1ull << 40) && (v == 0 || numel <= (1ull << 50) / v), where, ": shape is too large");
            numel *= v;
            t.shape.dims[t.shape.ndim++] = static_cast<int64_t>(v);
        }
        const nlohmann::json& off = e["data_offsets"];
        DI_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() && off[1].is_number_unsigned(), where,
                 ": data_offsets must be two non-negative integers");
        t.begin = off[0].get<uint64_t>();
        t.end = off[1].get<uint64_t>();
        DI_CHECK(t.begin <= t.end && t.end <= data_size, where, ": data [", t.begin, ", ", t.end,
                 ") lies outside the file's data section (", data_size, " bytes; truncated file?)");
        const uint64_t expected = numel * static_cast<uint64_t>(dtype_bits(t.dtype)) / 8;
        DI_CHECK(t.end - t.begin == expected, where, ": holds ", t.end - t.begin, " bytes but ", dtype, " ",
                 t.shape.str(), " needs ", expected);
        ranges.emplace_back(t.begin, t.end);
        tensors_.emplace(name, t);
    }
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i)
        DI_CHECK(ranges[i].first >= ranges[i - 1].second || ranges[i].first == ranges[i].second, path_,
                 ": corrupt safetensors header: tensor data ranges overlap");
}

const TensorInfo* SafetensorsFile::find(const std::string& name) const {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
}

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
    const std::string index_path = path_join(dir, "model.safetensors.index.json");
    std::vector<std::string> shard_names;
    std::map<std::string, std::string> weight_map;
    if (file_exists(index_path)) {
        nlohmann::json index;
        try {
            index = nlohmann::json::parse(read_file(index_path));
        } catch (const nlohmann::json::exception& e) {
            DI_THROW(index_path, ": corrupt JSON: ", e.what());
        }
        DI_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(), index_path,
                 ": lacks a weight_map object");
        for (auto it = index["weight_map"].begin(); it != index["weight_map"].end(); ++it) {
            DI_CHECK(it.value().is_string(), index_path, ": weight_map entry '", it.key(), "' is not a file name");
            weight_map[it.key()] = it.value().get<std::string>();
            shard_names.push_back(it.value().get<std::string>());
        }
        std::sort(shard_names.begin(), shard_names.end());
        shard_names.erase(std::unique(shard_names.begin(), shard_names.end()), shard_names.end());
    } else {
        DIR* d = opendir(dir.c_str());
        DI_CHECK(d, "cannot open checkpoint directory ", dir);
        while (dirent* ent = readdir(d)) {
            std::string n = ent->d_name;
            if (n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0) shard_names.push_back(n);
        }
        closedir(d);
        std::sort(shard_names.begin(), shard_names.end());
        DI_CHECK(!shard_names.empty(), dir, ": no *.safetensors files and no model.safetensors.index.json");
    }
    for (const std::string& shard : shard_names) {
        files_.push_back(std::make_unique<SafetensorsFile>(path_join(dir, shard)));
        const SafetensorsFile* f = files_.back().get();
        for (const auto& [name, info] : f->tensors()) {
            if (!weight_map.empty()) {
                auto it = weight_map.find(name);
                if (it == weight_map.end() || it->second != shard) continue;  // the index decides
            }
            DI_CHECK(index_.emplace(name, std::make_pair(f, &info)).second, dir, ": tensor '", name,
                     "' appears in more than one file");
        }
    }
    for (const auto& [name, shard] : weight_map)
        DI_CHECK(index_.count(name), index_path, ": lists tensor '", name, "' in ", shard, ", which lacks it");
}

const TensorInfo* Checkpoint::find(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : it->second.second;
}

std::string Checkpoint::file_of(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() || !it->second.first ? dir_ : it->second.first->path();
}

Checkpoint Checkpoint::synthetic(const std::string& what, uint64_t seed) {
    Checkpoint c;
    c.dir_ = what;
    c.synthetic_ = true;
    c.seed_ = seed;
    return c;
}

void Checkpoint::add(const std::string& name, Tensor tensor) {
    DI_ICHECK(synthetic_, "tensors can be added to a synthetic checkpoint only");
    DI_ICHECK(!index_.count(name), "tensor ", name, " added twice");
    auto owned = std::make_unique<Owned>();
    owned->info = TensorInfo{name, tensor.dtype(), tensor.shape(), 0, tensor.view().nbytes()};
    owned->data = std::move(tensor);
    index_[name] = {nullptr, &owned->info};
    owned_[name] = std::move(owned);
}

TensorView Checkpoint::view(const std::string& name) {
    auto it = index_.find(name);
    DI_CHECK(it != index_.end(), dir_, ": missing tensor '", name, "'");
    if (!it->second.first) return owned_.at(name)->data.view();
    const SafetensorsFile* f = it->second.first;
    const TensorInfo& t = *it->second.second;
    const uint8_t* p = f->data(t);
    const size_t align = std::max(1, dtype_bits(t.dtype) / 8);
    if (reinterpret_cast<uintptr_t>(p) % align == 0) return TensorView(const_cast<uint8_t*>(p), t.dtype, t.shape);
    DI_LOG(kDebug, "copying misaligned tensor ", name, " of ", f->path());
    realigned_.emplace_back(t.dtype, t.shape);
    std::memcpy(realigned_.back().as<uint8_t>(), p, t.end - t.begin);
    return realigned_.back().view();
}

std::vector<std::string> Checkpoint::names() const {
    std::vector<std::string> out;
    for (const auto& kv : index_) out.push_back(kv.first);
    return out;
}

}  // namespace deepinfer
