// ops::rope_kv_append is the engine's attention inputs in one op: it must leave exactly what its
// parts leave (copy_rows of q, rope_forward on q and k, kv_append), bit for bit, on the SIMD and
// the reference kernels, for both RoPE layouts, partial rotation, no rotation, f32 and f16 caches
// and both key layouts; the reference's rotation (angles in double) is the independent oracle of
// the SIMD one. Bad arguments are refused naming the row or the field.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "ops/ops.h"
#include "ops/paged_attention.h"
#include "test_util/expect_error.h"

namespace tessera::ops {
namespace {

constexpr int64_t kRows = 5, kH = 4, kHkv = 2, kD = 16, kBT = 4, kBlocks = 4, kMaxPos = 64;

struct Case {
  bool reference = false;
  RopeLayout layout = RopeLayout::half;
  int64_t rotary_dim = kD;  // 0: no rotation
  DType kv_type = DType::f32;
  bool transposed = false;
  std::string name() const {
    return std::string(reference ? "ref" : "simd") +
           (layout == RopeLayout::half ? " half" : " interleaved") +
           " R=" + std::to_string(rotary_dim) + " " + std::string(dtype_name(kv_type)) +
           (transposed ? " k^T" : "");
  }
};

struct Result {
  std::vector<float> q;
  std::vector<uint8_t> cache;
};

// Rows of q | k | v side by side (as the products leave them), a few columns of padding after.
constexpr int64_t kQD = kH * kD, kKV = kHkv * kD, kLd = kQD + 2 * kKV + 3;

std::vector<float> qkv_rows() {
  std::vector<float> x(static_cast<size_t>(kRows * kLd));
  Rng rng(17);
  for (float& v : x) v = rng.normal();
  return x;
}

RopeKvAppendArgs args(const Case& c, const std::vector<float>& qkv, std::vector<uint8_t>& cache,
                      std::vector<float>& q_out, const RopeTable& table, const int32_t* pos,
                      const int32_t* slot) {
  RopeKvAppendArgs a;
  a.Hkv = kHkv, a.D = kD, a.kv_type = c.kv_type, a.k_transposed = c.transposed;
  a.block_tokens = kBT, a.v_offset = kHkv * kBT * kD, a.block_stride = 2 * a.v_offset;
  a.kv = cache.data(), a.n_blocks = kBlocks;
  a.q = qkv.data(), a.ldq = kLd, a.H = kH, a.q_out = q_out.data();
  a.k = qkv.data() + kQD, a.v = qkv.data() + kQD + kKV, a.ldk = a.ldv = kLd;
  a.rows = kRows, a.slot = slot;
  if (c.rotary_dim > 0) a.rope = &table, a.layout = c.layout, a.positions = pos;
  return a;
}

const int32_t kPos[kRows] = {0, 3, 9, 40, 63};
const int32_t kSlot[kRows] = {6, 0, 13, 7, 2};

// q_out and a cache (f32-sized, so an f16 cache uses half of it), zeroed.
Result outputs() {
  return {std::vector<float>(static_cast<size_t>(kRows * kQD)),
          std::vector<uint8_t>(static_cast<size_t>(kBlocks * 2 * kHkv * kBT * kD * 4))};
}

Result fused(const Case& c, const RopeTable& table) {
  const std::vector<float> qkv = qkv_rows();
  Result r = outputs();
  Context ctx;
  ctx.reference = c.reference;
  rope_kv_append(ctx, args(c, qkv, r.cache, r.q, table, kPos, kSlot));
  return r;
}

Result parts(const Case& c, const RopeTable& table) {
  const std::vector<float> qkv = qkv_rows();
  Result r = outputs();
  Context ctx;
  ctx.reference = c.reference;
  std::vector<float> k(static_cast<size_t>(kRows * kKV));
  copy_rows(ctx, r.q.data(), kQD, qkv.data(), kLd, kRows, kQD);
  copy_rows(ctx, k.data(), kKV, qkv.data() + kQD, kLd, kRows, kKV);
  if (c.rotary_dim > 0) {
    rope_forward(ctx, r.q.data(), r.q.data(), table, kPos, 0, 1, kRows, kH, kD, c.layout);
    rope_forward(ctx, k.data(), k.data(), table, kPos, 0, 1, kRows, kHkv, kD, c.layout);
  }
  KvAppendArgs a = args(c, qkv, r.cache, r.q, table, kPos, kSlot);
  a.k = k.data(), a.ldk = kKV;
  kv_append(ctx, a);
  return r;
}

std::vector<uint32_t> bits(const std::vector<float>& x) {
  std::vector<uint32_t> b(x.size());
  std::memcpy(b.data(), x.data(), x.size() * sizeof(float));
  return b;
}

TEST(RopeKvAppend, LeavesExactlyWhatItsPartsLeave) {
  for (bool reference : {false, true})
    for (RopeLayout layout : {RopeLayout::half, RopeLayout::interleaved})
      for (int64_t R : {kD, kD / 2, int64_t{0}})
        for (DType t : {DType::f32, DType::f16})
          for (bool transposed : {false, true}) {
            const Case c{reference, layout, R, t, transposed};
            const RopeTable table = make_rope_table(kMaxPos, R > 0 ? R : kD, 10000.0);
            const Result a = fused(c, table), b = parts(c, table);
            ASSERT_EQ(bits(a.q), bits(b.q)) << c.name();
            ASSERT_EQ(a.cache, b.cache) << c.name();
            // Something was rotated (position 3 of row 1 turns every rotated pair), or copied.
            const std::vector<float> x = qkv_rows();
            EXPECT_EQ(a.q[kQD] == x[kLd], R == 0) << c.name();
          }
}

// The SIMD rotation against the reference's, whose angles come from the frequencies in double.
TEST(RopeKvAppend, SimdRotationMatchesTheReference) {
  for (RopeLayout layout : {RopeLayout::half, RopeLayout::interleaved}) {
    const RopeTable table = make_rope_table(kMaxPos, kD, 10000.0);
    const Case simd{false, layout, kD, DType::f32, false}, ref{true, layout, kD, DType::f32, false};
    const Result a = fused(simd, table), b = fused(ref, table);
    for (size_t i = 0; i < a.q.size(); ++i)
      ASSERT_NEAR(a.q[i], b.q[i], 2e-6f * (1 + std::fabs(b.q[i]))) << simd.name() << " q " << i;
    std::vector<float> ka(a.cache.size() / 4), kb(ka.size());
    std::memcpy(ka.data(), a.cache.data(), a.cache.size());
    std::memcpy(kb.data(), b.cache.data(), b.cache.size());
    for (size_t i = 0; i < ka.size(); ++i)
      ASSERT_NEAR(ka[i], kb[i], 2e-6f * (1 + std::fabs(kb[i]))) << simd.name() << " cache " << i;
  }
}

TEST(RopeKvAppend, RefusesBadArgumentsByName) {
  const RopeTable table = make_rope_table(kMaxPos, kD, 10000.0);
  const std::vector<float> qkv = qkv_rows();
  Result out = outputs();
  std::vector<uint8_t>& cache = out.cache;
  std::vector<float>& q = out.q;
  const Case c;
  const int32_t far[kRows] = {0, 1, 64, 2, 3};
  test::expect_error([&] { rope_kv_append(Context{}, args(c, qkv, cache, q, table, far, kSlot)); },
                     "row 2: position 64 outside the rope table's [0, 64)");
  const int32_t past[kRows] = {0, 1, 2, 16, 3};
  test::expect_error([&] { rope_kv_append(Context{}, args(c, qkv, cache, q, table, kPos, past)); },
                     "row 3: slot 16 outside the cache's 16");
  RopeKvAppendArgs a = args(c, qkv, cache, q, table, kPos, kSlot);
  a.positions = nullptr;
  test::expect_error([&] { rope_kv_append(Context{}, a); }, "needs the rows' positions");
  a = args(c, qkv, cache, q, table, kPos, kSlot);
  a.H = 3;
  test::expect_error([&] { rope_kv_append(Context{}, a); }, "bad query shape (H 3, Hkv 2");
  a = args(c, qkv, cache, q, table, kPos, kSlot);
  a.ldq = kQD - 1;
  test::expect_error([&] { rope_kv_append(Context{}, a); }, "ldq 63");
}

}  // namespace
}  // namespace tessera::ops
