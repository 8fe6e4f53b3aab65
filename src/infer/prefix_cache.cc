// Prefix cache: chained block keys, matching with token comparison, and least-recently-used
// eviction of the blocks only the cache holds, leaves first.
#include "infer/prefix_cache.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <utility>

#include "core/error.h"

namespace tessera::infer {

PrefixCache::PrefixCache(KvCache& cache)
    : cache_(cache), block_tokens_(cache.shape().block_tokens) {}

uint64_t PrefixCache::block_key(uint64_t parent, std::span<const int32_t> block_tokens) const {
  // splitmix64's finalizer over the parent key and each token: every bit of every input moves
  // about half the output bits, so distinct prefixes collide with probability ~2^-64 (and a
  // collision is caught by the token comparison in match()).
  auto mix = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  uint64_t h = mix(parent);
  for (int32_t t : block_tokens)
    h = mix(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(t)) + 0x9e3779b97f4a7c15ull));
  return h;
}

std::vector<int32_t> PrefixCache::match(std::span<const int32_t> tokens, int64_t max_blocks,
                                        uint64_t* key_out) {
  std::vector<int32_t> found;
  const int64_t BT = block_tokens_;
  const int64_t full = std::min(max_blocks, static_cast<int64_t>(tokens.size()) / BT);
  uint64_t key = kRootKey;
  ++clock_;
  for (int64_t i = 0; i < full; ++i) {
    const std::span<const int32_t> own =
        tokens.subspan(static_cast<size_t>(i * BT), static_cast<size_t>(BT));
    const uint64_t next = block_key(key, own);
    auto it = entries_.find(next);
    if (it == entries_.end() || it->second.parent != key ||
        !std::equal(own.begin(), own.end(), it->second.tokens.begin()))
      break;
    it->second.last_used = clock_;
    found.push_back(it->second.block);
    key = next;
  }
  *key_out = key;
  return found;
}

int64_t PrefixCache::insert(std::span<const int32_t> tokens, std::span<const int32_t> blocks,
                            int64_t from, uint64_t* key_io) {
  const int64_t BT = block_tokens_;
  const int64_t full =
      std::min(static_cast<int64_t>(tokens.size()) / BT, static_cast<int64_t>(blocks.size()));
  ++clock_;
  uint64_t key = *key_io;
  int64_t i = from;
  for (; i < full; ++i) {
    const std::span<const int32_t> own =
        tokens.subspan(static_cast<size_t>(i * BT), static_cast<size_t>(BT));
    const uint64_t next = block_key(key, own);
    auto it = entries_.find(next);
    if (it != entries_.end()) {
      // Already cached (this block, or the same prefix computed by another sequence; or, with
      // probability ~2^-64, another prefix: then this block is simply not cached).
      it->second.last_used = clock_;
    } else {
      if (key != kRootKey) {
        auto p = entries_.find(key);
        if (p == entries_.end()) break;  // the parent is not cached: no orphan children
        ++p->second.children;
      }
      const int32_t block = blocks[static_cast<size_t>(i)];
      cache_.retain(block);
      entries_.emplace(next,
                       Entry{block, key, std::vector<int32_t>(own.begin(), own.end()), clock_, 0});
    }
    key = next;
  }
  *key_io = key;
  return i;
}

int64_t PrefixCache::evictable() const {
  int64_t n = 0;
  for (const auto& [key, e] : entries_) n += cache_.ref_count(e.block) == 1;
  return n;
}

int64_t PrefixCache::evict(int64_t n) {
  // Leaves only the cache holds, oldest first; a parent joins once its last child is gone.
  using Candidate = std::pair<uint64_t, uint64_t>;  // (last_used, key)
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  for (const auto& [key, e] : entries_)
    if (e.children == 0 && cache_.ref_count(e.block) == 1) heap.emplace(e.last_used, key);
  int64_t freed = 0;
  while (freed < n && !heap.empty()) {
    const uint64_t key = heap.top().second;
    heap.pop();
    const uint64_t parent = entries_.at(key).parent;
    freed += drop(key);
    auto p = entries_.find(parent);
    if (p != entries_.end() && p->second.children == 0 && cache_.ref_count(p->second.block) == 1)
      heap.emplace(p->second.last_used, parent);
  }
  // Blocks only the cache holds but whose descendants a sequence holds: a sequence that ran the
  // same tokens as a cached chain in blocks of its own had its later blocks cached under that
  // chain. Dropping the oldest such block drops its subtree from the cache (the held blocks stay
  // with their sequences).
  while (freed < n) {
    const Entry* oldest = nullptr;
    uint64_t key = 0;
    for (const auto& [k, e] : entries_)
      if (cache_.ref_count(e.block) == 1 && (!oldest || e.last_used < oldest->last_used)) {
        oldest = &e;
        key = k;
      }
    if (!oldest) break;
    freed += drop(key);
  }
  return freed;
}

int64_t PrefixCache::drop(uint64_t key) {
  // The subtree's keys, breadth first (children are found by their parent key: a rare path).
  std::vector<uint64_t> keys = {key};
  for (size_t i = 0; i < keys.size(); ++i)
    if (entries_.at(keys[i]).children > 0)
      for (const auto& [k, e] : entries_)
        if (e.parent == keys[i]) keys.push_back(k);
  const uint64_t parent = entries_.at(key).parent;
  int64_t freed = 0;
  for (uint64_t k : keys) {
    auto it = entries_.find(k);
    freed += cache_.ref_count(it->second.block) == 1;
    cache_.release(it->second.block);
    entries_.erase(it);
  }
  auto p = entries_.find(parent);
  if (p != entries_.end()) --p->second.children;
  return freed;
}

}  // namespace tessera::infer
