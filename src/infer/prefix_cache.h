// The prefix cache: full KV-cache blocks kept after their sequences end, keyed by the whole token
// prefix they complete, so a request that starts with the same tokens (a shared system prompt,
// a conversation's earlier turns) takes those blocks instead of running the tokens again.
// A block's key chains its parent's key with its own tokens (the keys and values of a block
// depend on every token before it); a match also compares the tokens, so a hash collision
// costs a miss, never a wrong block. The cache holds one reference on each block it keeps;
// blocks nobody else holds are evicted least recently used first, leaves before their parents
// (a parent nobody holds above a child a sequence holds goes with its subtree).
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "infer/kv_cache.h"

namespace tessera::infer {

class PrefixCache {
 public:
  explicit PrefixCache(KvCache& cache);

  // The key of the block holding tokens [i*BT, (i+1)*BT) given the key of the block before it
  // (kRootKey for the first).
  static constexpr uint64_t kRootKey = 0x6a09e667f3bcc908ull;
  uint64_t block_key(uint64_t parent, std::span<const int32_t> block_tokens) const;

  // The cached blocks holding the longest prefix of `tokens` made of whole blocks, at most
  // max_blocks of them; marks them used and sets *key to the last one's key (kRootKey if none).
  // The caller shares them (Engine::share_blocks).
  std::vector<int32_t> match(std::span<const int32_t> tokens, int64_t max_blocks, uint64_t* key);

  // Offers the full blocks of a sequence: blocks[i] holds tokens [i*BT, (i+1)*BT) of `tokens`,
  // and blocks [0, from) were offered before (or matched); *key is the key of block from-1
  // (kRootKey when from is 0). Keeps the blocks it does not have yet (a prefix it already holds
  // in other blocks keeps those). Returns the number of leading blocks now offered and sets
  // *key to the last one's key.
  int64_t insert(std::span<const int32_t> tokens, std::span<const int32_t> blocks, int64_t from,
                 uint64_t* key);

  // Blocks only the cache holds: free for the asking (evict).
  int64_t evictable() const;
  // Frees at least n blocks only the cache holds (or all of them), least recently used leaves
  // first; returns how many it freed.
  int64_t evict(int64_t n);
  // Drops every block only the cache holds.
  void clear() { evict(static_cast<int64_t>(entries_.size())); }
  int64_t blocks() const { return static_cast<int64_t>(entries_.size()); }

 private:
  struct Entry {
    int32_t block;
    uint64_t parent;
    std::vector<int32_t> tokens;  // the block's own tokens, compared on every match
    uint64_t last_used;
    int32_t children;  // cached blocks whose parent this is (evicted first)
  };
  // Removes the entry and every cached block under it; returns the blocks this freed.
  int64_t drop(uint64_t key);

  KvCache& cache_;
  int64_t block_tokens_;
  uint64_t clock_ = 0;
  std::unordered_map<uint64_t, Entry> entries_;
};

}  // namespace tessera::infer
