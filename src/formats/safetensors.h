// safetensors files: a hostile-input-safe reader (every offset, size and shape checked against
// the file) and an atomic writer. Used for HF model folders and for training checkpoints.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/file_io.h"
#include "core/tensor.h"

namespace tessera::formats {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;  // F32, BF16, F16 map to f32, bf16, f16; I32 to i32
  Shape shape;
  const uint8_t* data = nullptr;  // points into the mapped file
  int64_t bytes = 0;
};

class SafetensorsReader {
 public:
  // Maps and validates `path`: header length, JSON, dtypes, shapes, offsets inside the data
  // section, sizes equal to shape * dtype size, no overlaps. Throws Error naming file and tensor.
  explicit SafetensorsReader(const std::string& path);
  const std::string& path() const { return file_.path(); }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const SafetensorsEntry* find(const std::string& name) const;
  const SafetensorsEntry& at(const std::string& name) const;  // throws naming file and tensor
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Copies tensor `name` into dst as f32 (converting bf16/f16), checking its shape equals
  // `expected`; throws naming file, tensor and both shapes on mismatch.
  void read_f32(const std::string& name, const Shape& expected, float* dst) const;

 private:
  MappedFile file_;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

class SafetensorsWriter {
 public:
  // Data is referenced, not copied: it must stay alive until write().
  void add(const std::string& name, DType dtype, const Shape& shape, const void* data);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  // Writes atomically (temp file, fsync, rename).
  void write(const std::string& path) const;

 private:
  struct Item {
    std::string name;
    DType dtype;
    Shape shape;
    const void* data;
  };
  std::vector<Item> items_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace tessera::formats
