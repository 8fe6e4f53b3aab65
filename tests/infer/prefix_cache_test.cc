// The prefix cache on its own: whole blocks match by their full token prefix (a different
// earlier block means no match), offered blocks are retained once, and eviction frees the least
// recently used blocks nobody else holds, leaves before their parents, and every block nobody
// else holds when asked for all.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "infer/prefix_cache.h"

namespace tessera::infer {
namespace {

KvCache small_cache() {
  KvCacheShape s;
  s.n_layers = 1;
  s.n_kv_heads = 1;
  s.head_dim = 4;
  s.block_tokens = 4;
  s.n_blocks = 16;
  return KvCache(s);
}

std::vector<int32_t> iota(int n, int start) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(PrefixCache, MatchesWholeBlocksOfTheSamePrefixOnly) {
  KvCache kv = small_cache();
  PrefixCache pc(kv);
  const std::vector<int32_t> toks = iota(14, 100);  // 3 full blocks and 2 tokens
  std::vector<int32_t> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(kv.allocate());
  uint64_t key = PrefixCache::kRootKey;
  EXPECT_EQ(pc.insert(toks, blocks, 0, &key), 3);
  EXPECT_EQ(pc.blocks(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(kv.ref_count(blocks[static_cast<size_t>(i)]), 2);
  EXPECT_EQ(kv.ref_count(blocks[3]), 1) << "a partial block is not cached";

  uint64_t k2 = 0;
  EXPECT_EQ(pc.match(toks, 10, &k2), std::vector<int32_t>(blocks.begin(), blocks.begin() + 3));
  EXPECT_EQ(k2, key);
  EXPECT_EQ(pc.match(toks, 2, &k2).size(), 2u) << "at most max_blocks";
  std::vector<int32_t> other = toks;
  other[5] = 7;  // the second block differs: only the first matches
  EXPECT_EQ(pc.match(other, 10, &k2), std::vector<int32_t>{blocks[0]});
  other = toks;
  other[0] = 7;  // the first block differs: the later ones do not match either
  EXPECT_TRUE(pc.match(other, 10, &k2).empty());
  EXPECT_EQ(k2, PrefixCache::kRootKey);
  // The same prefix offered again in other blocks keeps the cached ones.
  std::vector<int32_t> again;
  for (int i = 0; i < 3; ++i) again.push_back(kv.allocate());
  uint64_t k3 = PrefixCache::kRootKey;
  EXPECT_EQ(pc.insert(toks, again, 0, &k3), 3);
  EXPECT_EQ(pc.blocks(), 3);
  for (int32_t b : again) EXPECT_EQ(kv.ref_count(b), 1);
}

TEST(PrefixCache, EvictsLeastRecentlyUsedUnheldLeavesFirst) {
  KvCache kv = small_cache();
  PrefixCache pc(kv);
  // Two chains: a (3 blocks) and b (2 blocks sharing a's first).
  const std::vector<int32_t> a = iota(12, 0);
  std::vector<int32_t> b = iota(8, 0);
  b[4] = 99;
  std::vector<int32_t> ablocks = {kv.allocate(), kv.allocate(), kv.allocate()};
  std::vector<int32_t> bblocks = {ablocks[0], kv.allocate()};
  kv.retain(ablocks[0]);
  uint64_t ka = PrefixCache::kRootKey, kb = PrefixCache::kRootKey;
  pc.insert(a, ablocks, 0, &ka);
  pc.insert(b, bblocks, 0, &kb);
  EXPECT_EQ(pc.blocks(), 4);
  EXPECT_EQ(pc.evictable(), 0) << "the sequences still hold every block";
  // The sequences end: a first, then b is used again.
  for (int32_t x : ablocks) kv.release(x);
  for (int32_t x : bblocks) kv.release(x);
  EXPECT_EQ(pc.evictable(), 4);
  uint64_t k = 0;
  pc.match(b, 2, &k);
  // Evicting 2: a's leaves (least recently used), the third block then the second.
  EXPECT_EQ(pc.evict(2), 2);
  EXPECT_EQ(pc.match(a, 3, &k).size(), 1u);
  EXPECT_EQ(pc.match(b, 2, &k).size(), 2u);
  // A block a sequence holds again is not freed, and does not pin its parent, which nobody
  // holds: the parent goes with the child's cache entry (the child stays with its holder).
  kv.retain(bblocks[1]);
  EXPECT_EQ(pc.evictable(), 1);
  EXPECT_EQ(pc.evict(10), 1);
  EXPECT_EQ(pc.blocks(), 0);
  EXPECT_EQ(kv.ref_count(bblocks[1]), 1) << "only its holder holds it now";
  kv.release(bblocks[1]);
  EXPECT_EQ(kv.free_blocks(), 16);
}

}  // namespace
}  // namespace tessera::infer
