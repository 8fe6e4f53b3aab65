// The key/value cache: one arena of fixed-size blocks (pages) shared by all sequences; each
// sequence holds a table of its blocks, so sequences grow without copying and free their blocks
// when done. Blocks are reference-counted: sequences that share a prefix (n > 1 samples of one
// prompt, the prefix cache) hold the same blocks, and a block returns to the free list when its
// last holder releases it. Keys and values are f32 or f16 (half the memory and half the bytes
// attention reads, for a rounding of 2^-11 relative on each cached value).
#pragma once

#include <cstdint>
#include <vector>

#include "core/arena.h"
#include "core/dtype.h"

namespace tessera::infer {

struct KvCacheShape {
  int64_t n_layers = 0, n_kv_heads = 0, head_dim = 0;
  int64_t block_tokens = 32;  // tokens per block
  int64_t n_blocks = 0;       // capacity = n_blocks * block_tokens tokens
  DType type = DType::f32;    // f32 or f16
  int64_t bytes() const {
    return 2 * n_layers * n_kv_heads * head_dim * block_tokens * n_blocks * dtype_bytes(type, 1);
  }
};

class KvCache {
 public:
  // Allocates the whole arena up front (throws naming the size if it cannot). Without
  // host_storage only the block bookkeeping lives here: the blocks are in device memory
  // (an ops::Buffer of the engine's), and layer_base() must not be called.
  explicit KvCache(const KvCacheShape& shape, bool host_storage = true);

  const KvCacheShape& shape() const { return shape_; }
  DType type() const { return shape_.type; }
  int64_t elem_bytes() const { return shape_.type == DType::f16 ? 2 : 4; }
  // Elements of one layer's K (or V) in a block: (Hkv, block_tokens, D).
  int64_t half_block_elems() const {
    return shape_.n_kv_heads * shape_.block_tokens * shape_.head_dim;
  }
  // Elements from block b to block b+1 (all layers, K and V).
  int64_t block_stride() const { return shape_.n_layers * 2 * half_block_elems(); }
  // Base such that block b's layer-l keys start at element b * block_stride() from here.
  uint8_t* layer_base(int64_t layer) {
    return data_.data() + layer * 2 * half_block_elems() * elem_bytes();
  }
  // Bytes of the arena wherever it lives (host or device).
  int64_t bytes() const { return bytes_; }
  int64_t bytes_per_token() const;

  // Takes a free block with one reference; throws when none is left, naming the capacity.
  int32_t allocate();
  // Adds a reference to a block in use.
  void retain(int32_t block);
  // Drops a reference; the block is free again when none is left.
  void release(int32_t block);
  int32_t ref_count(int32_t block) const;
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t used_blocks() const { return shape_.n_blocks - free_blocks(); }

 private:
  KvCacheShape shape_;
  int64_t bytes_ = 0;
  AlignedBuffer<uint8_t> data_;
  std::vector<int32_t> free_;  // a stack: the most recently freed block is reused first
  std::vector<int32_t> refs_;  // per block; 0 = free
};

}  // namespace tessera::infer
