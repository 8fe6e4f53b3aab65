// Row movement on the CPU: kv_append puts each element where the documented cache layout says
// (both K layouts, f32 and f16), and the strided copy and gather move the rows asked for.
#include <gtest/gtest.h>

#include <vector>

#include "backend/cpu/rows.h"
#include "core/dtype.h"
#include "core/rng.h"

namespace tessera::cpu {
namespace {

TEST(KvAppend, WritesEachElementWhereTheLayoutSays) {
  const int64_t Hkv = 2, D = 4, BT = 3, rows = 5, n_blocks = 4;
  const int64_t half = Hkv * BT * D, stride = 2 * half + 5;  // padding between blocks
  std::vector<float> k(static_cast<size_t>(rows * 10)), v(static_cast<size_t>(rows * 12));
  Rng rng(3);
  for (float& x : k) x = rng.normal();
  for (float& x : v) x = rng.normal();
  const std::vector<int32_t> slot = {7, 0, 11, 4, 2};  // block 2 token 1, block 0 token 0, ...
  for (DType type : {DType::f32, DType::f16})
    for (bool transposed : {false, true}) {
      std::vector<float> cache(static_cast<size_t>(n_blocks * stride), -1.0f);
      ops::KvAppendArgs a;
      a.Hkv = Hkv, a.D = D, a.kv_type = type, a.k_transposed = transposed;
      a.block_tokens = BT, a.block_stride = stride, a.v_offset = half;
      a.kv = cache.data();  // f16 uses the first half of the bytes
      a.k = k.data(), a.ldk = 10, a.v = v.data(), a.ldv = 12, a.rows = rows;
      a.slot = slot.data(), a.n_blocks = n_blocks;
      kv_append(a);
      auto at = [&](int64_t i) -> float {
        if (type == DType::f32) return cache[static_cast<size_t>(i)];
        return f16_to_f32(reinterpret_cast<const uint16_t*>(cache.data())[i]);
      };
      auto rounded = [&](float x) { return type == DType::f16 ? f16_to_f32(f32_to_f16(x)) : x; };
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t b = slot[r] / BT, t = slot[r] % BT;
        for (int64_t g = 0; g < Hkv; ++g)
          for (int64_t d = 0; d < D; ++d) {
            const int64_t head = b * stride + g * BT * D;
            const int64_t ki = transposed ? head + d * BT + t : head + t * D + d;
            EXPECT_EQ(at(ki), rounded(k[r * 10 + g * D + d])) << r << " " << g << " " << d;
            EXPECT_EQ(at(head + half + t * D + d), rounded(v[r * 12 + g * D + d]));
          }
      }
    }
}

TEST(Rows, CopyAndGatherMoveTheRowsAskedFor) {
  std::vector<float> src(6 * 5);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
  std::vector<float> dst(4 * 7, -1.0f);
  copy_rows(dst.data(), 7, src.data() + 1, 5, 4, 3);  // columns 1..3 of rows 0..3
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t c = 0; c < 7; ++c)
      EXPECT_EQ(dst[r * 7 + c], c < 3 ? src[r * 5 + 1 + c] : -1.0f) << r << " " << c;
  const std::vector<int32_t> index = {5, 0, 5, 2};
  std::vector<float> g(4 * 5);
  gather_rows(g.data(), src.data(), index.data(), 4, 5);
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t c = 0; c < 5; ++c) EXPECT_EQ(g[r * 5 + c], src[index[r] * 5 + c]);
}

}  // namespace
}  // namespace tessera::cpu
