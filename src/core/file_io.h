// File access: read-only memory mapping, whole-file reads, and atomic writes (temp file, fsync,
// rename) so a crash never leaves a half-written checkpoint or model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

class MappedFile {
 public:
  MappedFile() = default;
  // Maps `path` read-only; throws Error naming the path if it cannot be opened or mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void release();
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

std::string read_text_file(const std::string& path);
std::vector<uint8_t> read_binary_file(const std::string& path);

// Writes through path + ".tmp", fsyncs the file and its directory, then renames over `path`.
void write_file_atomic(const std::string& path, const void* data, size_t bytes);
inline void write_file_atomic(const std::string& path, std::string_view text) {
  write_file_atomic(path, text.data(), text.size());
}

// Streaming writer with the same atomicity: nothing appears at `path` until commit().
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(const std::string& path);
  ~AtomicFileWriter();  // removes the temp file if commit() was not reached
  void write(const void* data, size_t bytes);
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
};

bool file_exists(const std::string& path);
void make_dirs(const std::string& path);

}  // namespace tessera
