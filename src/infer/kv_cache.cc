// Key/value cache arena and its free-block stack.
#include "infer/kv_cache.h"

#include "core/error.h"

namespace tessera::infer {

namespace {

size_t checked_bytes(const KvCacheShape& s) {
  // No layers: a pool that only counts blocks (every layer's keys in another pool).
  TS_CHECK(
      s.n_layers >= 0 && s.n_kv_heads > 0 && s.head_dim > 0 && s.block_tokens > 0 && s.n_blocks > 0,
      "[kv-cache] every dimension must be positive (layers ", s.n_layers, ", kv heads ",
      s.n_kv_heads, ", head dim ", s.head_dim, ", block ", s.block_tokens, ", blocks ", s.n_blocks,
      ")");
  TS_CHECK(s.type == DType::f32 || s.type == DType::f16, "[kv-cache] type must be f32 or f16, not ",
           dtype_name(s.type));
  TS_CHECK(s.n_blocks <= INT32_MAX, "[kv-cache] too many blocks: ", s.n_blocks);
  const double bytes = 2.0 * static_cast<double>(s.n_layers) * s.n_kv_heads * s.head_dim *
                       s.block_tokens * static_cast<double>(s.n_blocks) *
                       static_cast<double>(dtype_bytes(s.type, 1));
  // 1 TiB of cache is beyond any machine this runs on: a sign of a bad ctx, not a request.
  TS_CHECK(bytes < 1099511627776.0, "[kv-cache] ", bytes / (1 << 30), " GiB requested");
  return static_cast<size_t>(bytes);
}

}  // namespace

KvCache::KvCache(const KvCacheShape& shape, bool host_storage)
    : shape_(shape),
      bytes_(static_cast<int64_t>(checked_bytes(shape))),
      data_(host_storage ? static_cast<size_t>(bytes_) : 0) {
  free_.reserve(static_cast<size_t>(shape.n_blocks));
  refs_.assign(static_cast<size_t>(shape.n_blocks), 0);
  for (int64_t b = shape.n_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

int64_t KvCache::bytes_per_token() const {
  return 2 * shape_.n_layers * shape_.n_kv_heads * shape_.head_dim * elem_bytes();
}

int32_t KvCache::allocate() {
  TS_CHECK(!free_.empty(), "[kv-cache] full: all ", shape_.n_blocks, " blocks of ",
           shape_.block_tokens, " tokens are in use (", shape_.n_blocks * shape_.block_tokens,
           " tokens)");
  const int32_t b = free_.back();
  free_.pop_back();
  refs_[static_cast<size_t>(b)] = 1;
  return b;
}

void KvCache::retain(int32_t block) {
  TS_CHECK(ref_count(block) > 0, "[kv-cache] retain of free block ", block);
  ++refs_[static_cast<size_t>(block)];
}

void KvCache::release(int32_t block) {
  TS_CHECK(ref_count(block) > 0, "[kv-cache] release of free block ", block);
  if (--refs_[static_cast<size_t>(block)] == 0) free_.push_back(block);
}

int32_t KvCache::ref_count(int32_t block) const {
  TS_CHECK(block >= 0 && block < shape_.n_blocks, "[kv-cache] bad block ", block, " (",
           shape_.n_blocks, " blocks)");
  return refs_[static_cast<size_t>(block)];
}

}  // namespace tessera::infer
