// 64-byte-aligned arenas whose size is planned before allocation, so that nothing is allocated
// inside a training or decode step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tessera {

constexpr size_t kArenaAlign = 64;

// Collects named regions and their offsets; the arena is allocated once from total_bytes().
class ArenaPlan {
 public:
  // Reserves `bytes` (rounded up to 64) and returns the region's byte offset.
  size_t reserve(const std::string& name, size_t bytes);
  size_t total_bytes() const { return total_; }
  struct Region {
    std::string name;
    size_t offset, bytes;
  };
  const std::vector<Region>& regions() const { return regions_; }

 private:
  std::vector<Region> regions_;
  size_t total_ = 0;
};

// One aligned, zero-initialized block. Move-only.
class Arena {
 public:
  Arena() = default;
  explicit Arena(size_t bytes);
  explicit Arena(const ArenaPlan& plan) : Arena(plan.total_bytes()) {}
  size_t bytes() const { return bytes_; }
  char* data() { return data_.get(); }
  const char* data() const { return data_.get(); }
  template <typename T>
  T* at(size_t byte_offset) {
    return reinterpret_cast<T*>(data_.get() + byte_offset);
  }

 private:
  struct Free {
    void operator()(char* p) const;
  };
  std::unique_ptr<char, Free> data_;
  size_t bytes_ = 0;
};

// An aligned, zero-initialized array of T (for flat parameter/gradient/state buffers).
template <typename T>
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t n) : arena_(n * sizeof(T)), n_(n) {}
  T* data() { return reinterpret_cast<T*>(arena_.data()); }
  const T* data() const { return reinterpret_cast<const T*>(arena_.data()); }
  size_t size() const { return n_; }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }

 private:
  Arena arena_;
  size_t n_ = 0;
};

}  // namespace tessera
