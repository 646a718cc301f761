#include "core/file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "deepinfer/error.h"

namespace deepinfer {

MappedFile::MappedFile(const std::string& path) : path_(path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    DI_CHECK(fd >= 0, "cannot open ", path, ": ", std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
        int err = errno;
        ::close(fd);
        DI_THROW("cannot stat ", path, ": ", std::strerror(err));
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
        void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
        int err = errno;
        ::close(fd);
        DI_CHECK(p != MAP_FAILED, "cannot map ", path, ": ", std::strerror(err));
        data_ = static_cast<const uint8_t*>(p);
    } else {
        ::close(fd);
    }
}

MappedFile::~MappedFile() { release(); }

MappedFile::MappedFile(MappedFile&& o) noexcept : data_(o.data_), size_(o.size_), path_(std::move(o.path_)) {
    o.data_ = nullptr;
    o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
    if (this != &o) {
        release();
        data_ = o.data_;
        size_ = o.size_;
        path_ = std::move(o.path_);
        o.data_ = nullptr;
        o.size_ = 0;
    }
    return *this;
}

void MappedFile::release() {
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
    data_ = nullptr;
    size_ = 0;
}

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

std::string read_file(const std::string& path) {
    if (ends_with(path, ".gz")) {
        gzFile f = gzopen(path.c_str(), "rb");
        DI_CHECK(f, "cannot open ", path, ": ", std::strerror(errno));
        std::string out;
        char buf[1 << 16];
        for (;;) {
            int n = gzread(f, buf, sizeof buf);
            if (n < 0) {
                int code = 0;
                std::string msg = gzerror(f, &code);
                gzclose(f);
                DI_THROW("cannot decompress ", path, ": ", msg);
            }
            if (n == 0) break;
            out.append(buf, static_cast<size_t>(n));
        }
        gzclose(f);
        return out;
    }
    std::ifstream in(path, std::ios::binary);
    DI_CHECK(in, "cannot open ", path, ": ", std::strerror(errno));
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

bool file_exists(const std::string& path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0;
}

std::string path_join(const std::string& dir, const std::string& name) {
    if (dir.empty()) return name;
    if (dir.back() == '/') return dir + name;
    return dir + "/" + name;
}

}  // namespace deepinfer
