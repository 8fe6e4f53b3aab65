// Helpers shared by the fuzz targets: an in-memory file for readers that take a path.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

namespace tessera::fuzz {

// One memfd reused for every input: readers that open a path get "/proc/self/fd/N", which is a
// regular file that can be mapped, without touching the disk or leaving files behind.
class MemFile {
 public:
  MemFile() : fd_(::memfd_create("tessera_fuzz", 0)) {
    if (fd_ < 0) std::abort();  // the harness cannot run at all; not a finding
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;

  // Replaces the file's contents with `data`; returns the path to open.
  const std::string& write(const uint8_t* data, size_t size) {
    if (::ftruncate(fd_, 0) != 0) std::abort();
    size_t done = 0;
    while (done < size) {
      const ssize_t n = ::pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      if (n <= 0) std::abort();
      done += static_cast<size_t>(n);
    }
    return path_;
  }

 private:
  int fd_;
  std::string path_;
};

// With TESSERA_FUZZ_VERBOSE set, prints why an input was rejected: to check by hand that the
// seeds get past the parsers (run the target on one file: <target>_fuzz file).
inline void note_rejected(const char* stage, const std::exception& e) {
  static const bool verbose = std::getenv("TESSERA_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "[fuzz] %s: %s\n", stage, e.what());
}

}  // namespace tessera::fuzz
