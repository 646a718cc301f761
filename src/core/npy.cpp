#include "core/npy.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

namespace deepinfer {

int64_t NpyArray::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

TensorView NpyArray::view() {
    Shape s;
    DI_CHECK(shape.size() <= kMaxDims, "npy array has too many dimensions (", shape.size(), ")");
    for (int64_t d : shape) s.dims[s.ndim++] = d;
    return TensorView(data.data(), dtype, s);
}

namespace {

template <typename Out>
std::vector<Out> convert(const NpyArray& a) {
    std::vector<Out> out(static_cast<size_t>(a.numel()));
    const uint8_t* p = a.data.data();
    for (size_t i = 0; i < out.size(); ++i) {
        switch (a.dtype) {
            case DType::kF32: { float v; std::memcpy(&v, p + 4 * i, 4); out[i] = static_cast<Out>(v); break; }
            case DType::kF16: { uint16_t v; std::memcpy(&v, p + 2 * i, 2); out[i] = static_cast<Out>(f16_to_f32(v)); break; }
            case DType::kI8: out[i] = static_cast<Out>(static_cast<int8_t>(p[i])); break;
            case DType::kU8: case DType::kBool: out[i] = static_cast<Out>(p[i]); break;
            case DType::kI16: { int16_t v; std::memcpy(&v, p + 2 * i, 2); out[i] = static_cast<Out>(v); break; }
            case DType::kI32: { int32_t v; std::memcpy(&v, p + 4 * i, 4); out[i] = static_cast<Out>(v); break; }
            case DType::kI64: { int64_t v; std::memcpy(&v, p + 8 * i, 8); out[i] = static_cast<Out>(v); break; }
            default: DI_THROW("npy: cannot convert dtype ", dtype_name(a.dtype));
        }
    }
    return out;
}

// Finds `'key': value` in the header dict and returns the raw value text.
std::string header_value(const std::string& header, const std::string& key, const std::string& what) {
    size_t k = header.find("'" + key + "'");
    DI_CHECK(k != std::string::npos, what, ": npy header lacks '", key, "'");
    size_t colon = header.find(':', k);
    DI_CHECK(colon != std::string::npos, what, ": malformed npy header");
    size_t v = header.find_first_not_of(' ', colon + 1);
    DI_CHECK(v != std::string::npos, what, ": malformed npy header");
    size_t end;
    if (header[v] == '(') end = header.find(')', v) + 1;
    else if (header[v] == '\'') end = header.find('\'', v + 1) + 1;
    else end = header.find_first_of(",}", v);
    DI_CHECK(end != std::string::npos && end > v, what, ": malformed npy header");
    return header.substr(v, end - v);
}

}  // namespace

std::vector<int64_t> NpyArray::to_i64() const { return convert<int64_t>(*this); }
std::vector<float> NpyArray::to_f32() const { return convert<float>(*this); }

NpyArray parse_npy(const uint8_t* bytes, size_t size, const std::string& what) {
    DI_CHECK(size >= 10 && std::memcmp(bytes, "\x93NUMPY", 6) == 0, what, ": not a .npy file");
    int major = bytes[6];
    size_t header_len, offset;
    if (major == 1) {
        header_len = bytes[8] | (bytes[9] << 8);
        offset = 10;
    } else {
        DI_CHECK(size >= 12, what, ": truncated .npy header");
        header_len = bytes[8] | (bytes[9] << 8) | (bytes[10] << 16) | (static_cast<size_t>(bytes[11]) << 24);
        offset = 12;
    }
    DI_CHECK(offset + header_len <= size, what, ": truncated .npy header");
    std::string header(reinterpret_cast<const char*>(bytes + offset), header_len);
    std::string descr = header_value(header, "descr", what);
    std::string fortran = header_value(header, "fortran_order", what);
    std::string shape_text = header_value(header, "shape", what);
    DI_CHECK(fortran == "False", what, ": Fortran-ordered .npy arrays are not supported");

    NpyArray a;
    size_t elem;
    bool f64 = false;
    if (descr == "'<f4'") { a.dtype = DType::kF32; elem = 4; }
    else if (descr == "'<f8'") { a.dtype = DType::kF32; elem = 8; f64 = true; }
    else if (descr == "'<f2'") { a.dtype = DType::kF16; elem = 2; }
    else if (descr == "'|i1'") { a.dtype = DType::kI8; elem = 1; }
    else if (descr == "'|u1'") { a.dtype = DType::kU8; elem = 1; }
    else if (descr == "'|b1'") { a.dtype = DType::kBool; elem = 1; }
    else if (descr == "'<i2'") { a.dtype = DType::kI16; elem = 2; }
    else if (descr == "'<i4'") { a.dtype = DType::kI32; elem = 4; }
    else if (descr == "'<i8'") { a.dtype = DType::kI64; elem = 8; }
    else DI_THROW(what, ": unsupported .npy dtype ", descr);

    for (size_t i = 1; i + 1 < shape_text.size();) {
        size_t j = shape_text.find_first_of(",)", i);
        std::string tok = shape_text.substr(i, j - i);
        size_t first = tok.find_first_not_of(' ');
        if (first != std::string::npos) a.shape.push_back(std::stoll(tok.substr(first)));
        i = j + 1;
    }
    size_t count = static_cast<size_t>(a.numel());
    size_t data_off = offset + header_len;
    DI_CHECK(size - data_off >= count * elem, what, ": .npy data is truncated (", size - data_off, " bytes for ",
             count, " elements)");
    if (f64) {
        a.data.resize(count * 4);
        for (size_t i = 0; i < count; ++i) {
            double d;
            std::memcpy(&d, bytes + data_off + 8 * i, 8);
            float f = static_cast<float>(d);
            std::memcpy(a.data.data() + 4 * i, &f, 4);
        }
    } else {
        a.data.assign(bytes + data_off, bytes + data_off + count * elem);
    }
    return a;
}

NpyArray read_npy(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    DI_CHECK(in, "cannot open ", path);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return parse_npy(bytes.data(), bytes.size(), path);
}

namespace {

void write_npy_raw(const std::string& path, const char* descr, const void* data, size_t bytes,
                   const std::vector<int64_t>& shape) {
    std::string shape_text = "(";
    for (size_t i = 0; i < shape.size(); ++i) shape_text += std::to_string(shape[i]) + (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
    shape_text += ")";
    std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + shape_text + ", }";
    size_t total = 10 + header.size() + 1;
    header.append((64 - total % 64) % 64, ' ');
    header.push_back('\n');
    std::FILE* f = std::fopen(path.c_str(), "wb");
    DI_CHECK(f, "cannot write ", path);
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0,
                             static_cast<unsigned char>(header.size() & 0xff),
                             static_cast<unsigned char>(header.size() >> 8)};
    bool ok = std::fwrite(pre, 1, 10, f) == 10 && std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
              (bytes == 0 || std::fwrite(data, 1, bytes, f) == bytes);
    ok = (std::fclose(f) == 0) && ok;
    DI_CHECK(ok, "failed writing ", path);
}

size_t count(const std::vector<int64_t>& shape) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    return n;
}

}  // namespace

void write_npy(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
    write_npy_raw(path, "<f4", data, count(shape) * 4, shape);
}
void write_npy(const std::string& path, const int32_t* data, const std::vector<int64_t>& shape) {
    write_npy_raw(path, "<i4", data, count(shape) * 4, shape);
}
void write_npy(const std::string& path, const int64_t* data, const std::vector<int64_t>& shape) {
    write_npy_raw(path, "<i8", data, count(shape) * 8, shape);
}

}  // namespace deepinfer
