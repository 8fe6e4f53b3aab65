// Shapes and the per-tensor view table over one flat buffer (parameters, gradients, optimizer
// state share one layout), with a visitor for I/O, init, pruning and quantization.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace tessera {

struct Shape {
  std::vector<int64_t> dims;
  Shape() = default;
  Shape(std::initializer_list<int64_t> d) : dims(d) {}
  explicit Shape(std::vector<int64_t> d) : dims(std::move(d)) {}
  int rank() const { return static_cast<int>(dims.size()); }
  int64_t operator[](int i) const { return dims[static_cast<size_t>(i)]; }
  int64_t numel() const;
  std::string str() const;  // "(768, 3072)"
  bool operator==(const Shape& o) const { return dims == o.dims; }
};

struct TensorInfo {
  std::string name;
  Shape shape;
  DType dtype = DType::f32;
  int64_t offset = 0;  // in elements of the table's buffer, aligned to kTensorAlignElems
  int64_t numel() const { return shape.numel(); }
};

// Offsets are rounded up so every tensor starts on a 64-byte boundary for f32 (16 elements).
constexpr int64_t kTensorAlignElems = 16;

class TensorTable {
 public:
  // Appends a tensor; returns its offset. Throws on a duplicate name or a non-positive dim.
  int64_t add(const std::string& name, Shape shape, DType dtype = DType::f32);
  const TensorInfo* find(const std::string& name) const;
  const TensorInfo& at(const std::string& name) const;  // throws naming the tensor
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  int64_t total_elems() const { return total_; }
  void for_each_tensor(const std::function<void(const TensorInfo&)>& fn) const {
    for (const auto& t : tensors_) fn(t);
  }

 private:
  std::vector<TensorInfo> tensors_;
  int64_t total_ = 0;
};

}  // namespace tessera
