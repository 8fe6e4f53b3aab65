// POSIX implementations of mapping, reading and atomic writing.
#include "core/file_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace tessera {

namespace {
std::string errno_text() {
  return std::strerror(errno);
}

std::string parent_dir(const std::string& path) {
  auto p = std::filesystem::path(path).parent_path();
  return p.empty() ? "." : p.string();
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}
}  // namespace

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  TS_CHECK(fd >= 0, "[file] cannot open '", path, "': ", errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("[file] '", path, "' is not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    TS_CHECK(p != MAP_FAILED, "[file] cannot map '", path, "': ", errno_text());
    data_ = static_cast<const uint8_t*>(p);
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() {
  release();
}

void MappedFile::release() {
  if (data_ && size_) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : path_(std::move(o.path_)), data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TS_CHECK(in.good(), "[file] cannot open '", path, "': ", errno_text());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<uint8_t> read_binary_file(const std::string& path) {
  const std::string s = read_text_file(path);
  return std::vector<uint8_t>(s.begin(), s.end());
}

AtomicFileWriter::AtomicFileWriter(const std::string& path) : path_(path), tmp_(path + ".tmp") {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  TS_CHECK(fd_ >= 0, "[file] cannot create '", tmp_, "': ", errno_text());
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    TS_CHECK(n > 0, "[file] write to '", tmp_, "' failed: ", errno_text());
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  TS_CHECK(::fsync(fd_) == 0, "[file] fsync of '", tmp_, "' failed: ", errno_text());
  ::close(fd_);
  fd_ = -1;
  TS_CHECK(::rename(tmp_.c_str(), path_.c_str()) == 0, "[file] cannot rename '", tmp_, "' to '",
           path_, "': ", errno_text());
  fsync_dir(parent_dir(path_));
}

void write_file_atomic(const std::string& path, const void* data, size_t bytes) {
  AtomicFileWriter w(path);
  w.write(data, bytes);
  w.commit();
}

bool file_exists(const std::string& path) {
  return std::filesystem::exists(path);
}

void make_dirs(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  TS_CHECK(!ec, "[file] cannot create directory '", path, "': ", ec.message());
}

}  // namespace tessera
