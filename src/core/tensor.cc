// Shape helpers and the tensor table's layout rules.
#include "core/tensor.h"

#include "core/error.h"

namespace tessera {

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

std::string Shape::str() const {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + ")";
}

int64_t TensorTable::add(const std::string& name, Shape shape, DType dtype) {
  TS_CHECK(find(name) == nullptr, "[tensors] duplicate tensor name '", name, "'");
  for (int64_t d : shape.dims)
    TS_CHECK(d > 0, "[tensors] tensor '", name, "' has non-positive dimension in ", shape.str());
  const int64_t off = (total_ + kTensorAlignElems - 1) / kTensorAlignElems * kTensorAlignElems;
  tensors_.push_back({name, shape, dtype, off});
  total_ = off + shape.numel();
  return off;
}

const TensorInfo* TensorTable::find(const std::string& name) const {
  for (const auto& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

const TensorInfo& TensorTable::at(const std::string& name) const {
  const TensorInfo* t = find(name);
  TS_CHECK(t != nullptr, "[tensors] no tensor named '", name, "'");
  return *t;
}

}  // namespace tessera
