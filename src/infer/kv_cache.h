// The key/value cache: one arena of fixed-size blocks (pages) shared by all sequences; each
// sequence holds a table of its blocks, so sequences grow without copying and free their blocks
// when done. Keys and values are f32.
#pragma once

#include <cstdint>
#include <vector>

#include "core/arena.h"

namespace tessera::infer {

struct KvCacheShape {
  int64_t n_layers = 0, n_kv_heads = 0, head_dim = 0;
  int64_t block_tokens = 32;  // tokens per block
  int64_t n_blocks = 0;       // capacity = n_blocks * block_tokens tokens
};

class KvCache {
 public:
  // Allocates the whole arena up front (throws naming the size if it cannot).
  explicit KvCache(const KvCacheShape& shape);

  const KvCacheShape& shape() const { return shape_; }
  // Floats of one layer's K (or V) in a block: (Hkv, block_tokens, D).
  int64_t half_block_floats() const {
    return shape_.n_kv_heads * shape_.block_tokens * shape_.head_dim;
  }
  // Floats from block b to block b+1 (all layers, K and V).
  int64_t block_stride() const { return shape_.n_layers * 2 * half_block_floats(); }
  // Base such that block b's layer-l keys start at layer_base(l) + b * block_stride().
  float* layer_base(int64_t layer) { return data_.data() + layer * 2 * half_block_floats(); }
  int64_t bytes() const { return static_cast<int64_t>(data_.size() * sizeof(float)); }
  int64_t bytes_per_token() const;

  // Takes a free block; throws when none is left, naming the capacity.
  int32_t allocate();
  void release(int32_t block);
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }

 private:
  KvCacheShape shape_;
  AlignedBuffer<float> data_;
  std::vector<int32_t> free_;  // a stack: the most recently freed block is reused first
};

}  // namespace tessera::infer
