// The row-moving ops refuse, naming the row and the bound, what would read or write outside
// their arrays on the CPU: a slot past the cache, a gather index past the source, a row with
// more keys than its block table holds.
#include <gtest/gtest.h>

#include <vector>

#include "ops/ops.h"
#include "ops/paged_attention.h"
#include "test_util/expect_error.h"

namespace tessera::ops {
namespace {

TEST(RowChecks, OutOfRangeEntriesAreNamed) {
  std::vector<float> cache(2 * 64), k(8), out(8);
  const int32_t bad_slot[2] = {3, 8};  // 2 blocks of 4 tokens: slots 0..7
  KvAppendArgs a;
  a.Hkv = 1, a.D = 8, a.block_tokens = 4, a.v_offset = 32, a.block_stride = 64;
  a.kv = cache.data(), a.k = k.data(), a.v = k.data(), a.ldk = 8, a.ldv = 8, a.rows = 2;
  a.slot = bad_slot, a.n_blocks = 2;
  test::expect_error([&] { kv_append(Context{}, a); }, "row 1: slot 8 outside the cache's 8");

  const int32_t index[1] = {3};
  test::expect_error([&] { gather_rows(Context{}, out.data(), k.data(), index, 1, 8, 1); },
                     "index[0] = 3 outside [0, 1)");

  const int32_t table[1] = {0}, n_keys[1] = {5};
  PagedAttentionArgs p;
  p.Hkv = 1, p.D = 8, p.block_tokens = 4, p.v_offset = 32, p.block_stride = 64;
  p.out = out.data(), p.q = out.data(), p.rows = 1, p.H = 1, p.kv = cache.data();
  p.block_tables = table, p.table_stride = 1, p.n_keys = n_keys;
  test::expect_error([&] { paged_attention(Context{}, p); },
                     "row 0 has 5 keys (its table holds 4)");
}

}  // namespace
}  // namespace tessera::ops
