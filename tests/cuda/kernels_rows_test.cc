// The row kernels (kernels_rows.h) against host computations: weight dequantization to f16
// (equal to core's to_f32 rounded to f16, bit for bit, for every type), f32 -> f16 conversion,
// the KV cache append into paged blocks (alone, and fused with RoPE: the same bits as RoPE then
// the append), and the row gather.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/ref/ref_kernels.h"
#include "backend/cpu/rows.h"
#include "backend/cuda/kernels_rows.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "cuda_test_util.h"
#include "test_util/expect_error.h"

namespace tessera::cuda {
namespace {

using test::DeviceArray;

std::vector<float> random_values(int64_t n, uint64_t seed, float scale) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = scale * rng.normal();
  return v;
}

TEST(DecoderKernels, DequantizeToF16MatchesCoreForEveryType) {
  TS_REQUIRE_CUDA_DEVICE();
  const int64_t N = 7, K = 512;
  const std::vector<float> values = random_values(N * K, 3, 0.05f);
  for (DType t : {DType::f16, DType::bf16, DType::q8_0, DType::q4_0, DType::q4_1, DType::q5_0,
                  DType::q5_1, DType::q4_k, DType::q5_k, DType::q6_k}) {
    std::vector<uint8_t> stored(static_cast<size_t>(dtype_bytes(t, N * K)));
    from_f32(t, values.data(), stored.data(), N * K);
    std::vector<float> want_f32(static_cast<size_t>(N * K));
    to_f32(t, stored.data(), want_f32.data(), N * K);
    DeviceArray<uint8_t> w(stored);
    DeviceArray<uint16_t> out(static_cast<size_t>(N * K));
    dequantize_to_f16(out.get(), w.get(), t, N, K, nullptr);
    const std::vector<uint16_t> got = out.download();
    for (int64_t i = 0; i < N * K; ++i)
      ASSERT_EQ(got[static_cast<size_t>(i)], f32_to_f16(want_f32[static_cast<size_t>(i)]))
          << dtype_name(t) << " element " << i;
  }
  DeviceArray<uint16_t> out(16);
  DeviceArray<float> src(16);
  tessera::test::expect_error(
      [&] { dequantize_to_f16(out.get(), src.get(), DType::f32, 1, 16, nullptr); }, "f32");
}

TEST(DecoderKernels, ConvertToF16RoundsToNearestEven) {
  TS_REQUIRE_CUDA_DEVICE();
  std::vector<float> v = random_values(1000, 4, 3.0f);
  v[0] = 1e-7f;     // subnormal in f16
  v[1] = 70000.0f;  // overflows to inf
  v[2] = -0.0f;
  DeviceArray<float> src(v);
  DeviceArray<uint16_t> dst(v.size());
  convert_f32_to_f16(dst.get(), src.get(), static_cast<int64_t>(v.size()), nullptr);
  const std::vector<uint16_t> got = dst.download();
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(got[i], f32_to_f16(v[i])) << "element " << i;
}

TEST(DecoderKernels, KvAppendWritesPagedSlotsAndGatherPicksRows) {
  TS_REQUIRE_CUDA_DEVICE();
  const int64_t rows = 5, Hkv = 2, D = 64, BT = 16, blocks = 4;
  const int64_t half = Hkv * BT * D, stride = 3 * 2 * half;  // 3 layers' worth per block
  const std::vector<float> k = random_values(rows * Hkv * D, 5, 1.0f);
  const std::vector<float> v = random_values(rows * Hkv * D, 6, 1.0f);
  const std::vector<int32_t> slot = {0, 17, 18, 63, 40};  // blocks 0, 1, 1, 3, 2
  for (DType t : {DType::f32, DType::f16}) {
    const int64_t eb = t == DType::f16 ? 2 : 4;
    DeviceArray<uint8_t> cache(static_cast<size_t>(blocks * stride * eb));
    DeviceArray<float> dk(k), dv(v);
    DeviceArray<int32_t> ds(slot);
    // Layer 1 of 3: its keys start half*2 elements into each block.
    uint8_t* layer = cache.get() + 2 * half * eb;
    kv_cache_append(layer, t, dk.get(), dv.get(), ds.get(), rows, Hkv, D, BT, stride, half,
                    nullptr);
    const std::vector<uint8_t> got = cache.download();
    std::vector<bool> written(got.size(), false);  // bytes the append may touch
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < Hkv; ++g)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t b = slot[r] / BT, tok = slot[r] % BT;
          const int64_t e = b * stride + 2 * half + (g * BT + tok) * D + d;
          const int64_t src = (r * Hkv + g) * D + d;
          for (int which = 0; which < 2; ++which) {
            const int64_t at = (e + which * half) * eb;
            for (int64_t i = 0; i < eb; ++i) written[static_cast<size_t>(at + i)] = true;
            const float want = (which ? v : k)[static_cast<size_t>(src)];
            if (t == DType::f16) {
              uint16_t h;
              std::memcpy(&h, got.data() + at, 2);
              ASSERT_EQ(h, f32_to_f16(want)) << "row " << r << " head " << g << " dim " << d;
            } else {
              float f;
              std::memcpy(&f, got.data() + at, 4);
              ASSERT_EQ(f, want) << "row " << r << " head " << g << " dim " << d;
            }
          }
        }
    // Nothing else in the cache changed (it started zeroed): no stray slot, head or layer.
    for (size_t i = 0; i < got.size(); ++i)
      if (!written[i]) {
        ASSERT_EQ(got[i], 0) << dtype_name(t) << " byte " << i;
      }
  }
  // Gather rows 3, 0, 3 of a (5, 7) matrix.
  const std::vector<float> m = random_values(35, 7, 1.0f);
  DeviceArray<float> src(m), dst(21);
  DeviceArray<int32_t> index(std::vector<int32_t>{3, 0, 3});
  gather_rows(dst.get(), src.get(), index.get(), 3, 7, nullptr);
  const std::vector<float> g = dst.download();
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 7; ++c)
      EXPECT_EQ(g[static_cast<size_t>(r * 7 + c)],
                m[static_cast<size_t>((r == 1 ? 0 : 3) * 7 + c)]);
}

// The q/k norms' backward against the CPU reference (double sums): per head and OLMoE's one head
// of the whole width, dx written over dy (as the trainer calls it), dw added to what it held;
// and twice on the same inputs gives the same bits (dw's sums have a fixed order).
TEST(DecoderKernels, HeadNormBackwardMatchesTheReference) {
  TS_REQUIRE_CUDA_DEVICE();
  const int64_t n = 37, ld = 200, ld_x = 230;
  for (const auto& [heads, D] : {std::pair<int64_t, int64_t>{3, 64}, {1, 192}}) {
    const std::vector<float> x = random_values(n * ld_x, 6, 1.0f),
                             dy = random_values(n * ld, 7, 1.0f);
    const std::vector<float> w = random_values(D, 8, 0.5f), dw0 = random_values(D, 9, 0.1f);
    std::vector<float> dx_want = dy, dw_want = dw0;
    cpu::ref::head_rmsnorm_backward(dx_want.data(), dw_want.data(), dy.data(), x.data(), ld, ld_x,
                                    n, heads, D, w.data(), 1e-6f);
    std::vector<float> first;
    for (int run = 0; run < 2; ++run) {
      DeviceArray<float> ddy(dy), dxin(x), ddw(dw0), dwt(w);
      DeviceArray<float> ws(static_cast<size_t>(head_rmsnorm_backward_workspace(n, heads, D)));
      head_rmsnorm_backward(ddy.get(), ddw.get(), ddy.get(), dxin.get(), ld, ld_x, n, heads, D,
                            dwt.get(), 1e-6f, ws.get(), nullptr);
      const std::vector<float> got = ddy.download(), gw = ddw.download();
      for (size_t i = 0; i < got.size(); ++i)
        ASSERT_NEAR(got[i], dx_want[i], 1e-5f * (1 + std::fabs(dx_want[i])))
            << "heads " << heads << " dx " << i;
      for (size_t i = 0; i < gw.size(); ++i)
        ASSERT_NEAR(gw[i], dw_want[i], 1e-4f * (1 + std::fabs(dw_want[i])))
            << "heads " << heads << " dw " << i;
      if (run == 0)
        first = gw;
      else
        EXPECT_EQ(gw, first) << "dw differs between two runs";
    }
  }
}

// The q/k norms (per head, and OLMoE's one head of the whole width, inside a wider row) against
// the CPU reference; the mixture-of-experts router and the weighted scatter-add likewise.
TEST(DecoderKernels, HeadNormRouterAndScatterMatchTheReference) {
  TS_REQUIRE_CUDA_DEVICE();
  const int64_t n = 5, ld = 200;
  for (const auto& [heads, D] : {std::pair<int64_t, int64_t>{3, 64}, {1, 192}}) {
    const std::vector<float> x = random_values(n * ld, 3, 1.0f), w = random_values(D, 4, 0.5f);
    std::vector<float> want = x;
    cpu::ref::head_rmsnorm(want.data(), ld, n, heads, D, w.data(), 1e-6f);
    DeviceArray<float> dx(x), dw(w);
    head_rmsnorm(dx.get(), ld, n, heads, D, dw.get(), 1e-6f, nullptr);
    const std::vector<float> got = dx.download();
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5f * (1 + std::fabs(want[i])))
          << "heads " << heads << " " << i;
  }
  const int64_t E = 8, k = 2;
  const std::vector<float> logits = random_values(n * E, 5, 2.0f);
  std::vector<int32_t> ids_want(static_cast<size_t>(n * k));
  std::vector<float> w_want(ids_want.size());
  cpu::ref::moe_route(ids_want.data(), w_want.data(), logits.data(), n, E, k, true);
  DeviceArray<float> dl(logits), dwts(static_cast<size_t>(n * k));
  DeviceArray<int32_t> dids(static_cast<size_t>(n * k));
  moe_route(dids.get(), dwts.get(), dl.get(), n, E, k, true, nullptr);
  EXPECT_EQ(dids.download(), ids_want);
  const std::vector<float> w_got = dwts.download();
  for (size_t i = 0; i < w_got.size(); ++i) EXPECT_NEAR(w_got[i], w_want[i], 1e-6f) << i;
  const int64_t C = 7;
  const std::vector<float> src = random_values(4 * C, 6, 1.0f);
  const std::vector<int32_t> rows = {2, 0, 2, 1};
  const std::vector<float> scale = {0.5f, -1.0f, 2.0f, 0.25f};
  std::vector<float> want(static_cast<size_t>(3 * C), 1.0f);
  cpu::scatter_add_rows(want.data(), src.data(), rows.data(), scale.data(), 4, C);
  DeviceArray<float> ddst(std::vector<float>(static_cast<size_t>(3 * C), 1.0f)), dsrc(src),
      dscale(scale);
  DeviceArray<int32_t> drows(rows);
  scatter_add_rows(ddst.get(), dsrc.get(), drows.get(), dscale.get(), 4, C, nullptr);
  const std::vector<float> got = ddst.download();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6f) << i;
}

// The router's backward (both normalizations) and the scatter-add's against the CPU's.
TEST(DecoderKernels, RouterAndScatterBackwardsMatchTheCpu) {
  TS_REQUIRE_CUDA_DEVICE();
  const int64_t n = 37, E = 8, k = 2, C = 300;  // C over one block's 256 threads
  const std::vector<float> logits = random_values(n * E, 7, 2.0f);
  const std::vector<float> dw = random_values(n * k, 8, 1.0f);
  std::vector<int32_t> ids(static_cast<size_t>(n * k));
  std::vector<float> w(ids.size());
  cpu::ref::moe_route(ids.data(), w.data(), logits.data(), n, E, k, true);
  DeviceArray<float> dl(logits), ddw(dw), dgrad(static_cast<size_t>(n * E));
  DeviceArray<int32_t> dids(ids);
  for (bool normalize : {false, true}) {
    std::vector<float> want(static_cast<size_t>(n * E));
    cpu::ref::moe_route_backward(want.data(), dw.data(), ids.data(), logits.data(), n, E, k,
                                 normalize);
    moe_route_backward(dgrad.get(), ddw.get(), dids.get(), dl.get(), n, E, k, normalize, nullptr);
    const std::vector<float> got = dgrad.download();
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6f) << i;
  }
  const std::vector<float> dy = random_values(3 * C, 9, 1.0f), src = random_values(4 * C, 10, 1.0f);
  const std::vector<int32_t> rows = {2, 0, 2, 1};
  const std::vector<float> scale = {0.5f, -1.0f, 2.0f, 0.25f};
  std::vector<float> want_src(src.size()), want_w(4);
  cpu::scatter_add_rows_backward(want_src.data(), want_w.data(), dy.data(), src.data(), rows.data(),
                                 scale.data(), 4, C);
  DeviceArray<float> ddy(dy), dsrc(src), dscale(scale), dwout(std::vector<float>(4));
  DeviceArray<int32_t> drows(rows);
  // dsrc over src itself: the aliasing ops.h allows.
  scatter_add_rows_backward(dsrc.get(), dwout.get(), ddy.get(), dsrc.get(), drows.get(),
                            dscale.get(), 4, C, nullptr);
  const std::vector<float> got_src = dsrc.download(), got_w = dwout.download();
  for (size_t i = 0; i < got_src.size(); ++i) EXPECT_EQ(got_src[i], want_src[i]) << i;
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(got_w[i], want_w[i], 1e-4f) << i;
}

// The fused decode launch against rope_forward on q and k followed by kv_cache_append: every
// bit of q, k and the cache, for both pair layouts, partial and full rotary dims, f32 and f16
// caches; one position outside the table (NaN in both).
TEST(DecoderKernels, RopeAppendMatchesRopeThenAppend) {
  TS_REQUIRE_CUDA_DEVICE();
  const int64_t rows = 4, H = 6, Hkv = 2, BT = 16, blocks = 4, max_pos = 64;
  const std::vector<int32_t> pos = {0, 5, 63, 70};  // 70 is past the table
  const std::vector<int32_t> slot = {3, 17, 40, 62};
  for (int64_t D : {int64_t{64}, int64_t{128}})
    for (int64_t R : {D, D / 2})
      for (RopeLayout layout : {RopeLayout::half, RopeLayout::interleaved})
        for (DType t : {DType::f32, DType::f16}) {
          const int64_t eb = t == DType::f16 ? 2 : 4;
          const int64_t half = Hkv * BT * D, stride = 2 * 2 * half;  // 2 layers per block
          std::vector<float> cos_tab(static_cast<size_t>(max_pos * R / 2)), sin_tab(cos_tab);
          for (int64_t p = 0; p < max_pos; ++p)
            for (int64_t j = 0; j < R / 2; ++j) {
              const double a = p * std::pow(10000.0, -2.0 * j / R);
              cos_tab[static_cast<size_t>(p * R / 2 + j)] = static_cast<float>(std::cos(a));
              sin_tab[static_cast<size_t>(p * R / 2 + j)] = static_cast<float>(std::sin(a));
            }
          DeviceArray<float> dcos(cos_tab), dsin(sin_tab);
          RopeTableView table;
          table.cos = dcos.get(), table.sin = dsin.get(), table.max_pos = max_pos;
          table.rotary_dim = R;
          const std::vector<float> q = random_values(rows * H * D, 11, 1.0f);
          const std::vector<float> k = random_values(rows * Hkv * D, 12, 1.0f);
          const std::vector<float> v = random_values(rows * Hkv * D, 13, 1.0f);
          DeviceArray<int32_t> dpos(pos), dslot(slot);
          DeviceArray<float> v_dev(v);
          // Separate launches.
          DeviceArray<float> q1(q), k1(k);
          DeviceArray<uint8_t> cache1(static_cast<size_t>(blocks * stride * eb));
          uint8_t* layer1 = cache1.get() + 2 * half * eb;  // layer 1 of 2
          rope_forward<float>(q1.get(), q1.get(), table, dpos.get(), 0, 1, rows, H, D, layout,
                              nullptr);
          rope_forward<float>(k1.get(), k1.get(), table, dpos.get(), 0, 1, rows, Hkv, D, layout,
                              nullptr);
          kv_cache_append(layer1, t, k1.get(), v_dev.get(), dslot.get(), rows, Hkv, D, BT, stride,
                          half, nullptr);
          // One launch, from q, k and v side by side in rows of a qkv buffer (as the products
          // leave them) into a separate q.
          const int64_t QD = H * D, KV = Hkv * D, ld = QD + 2 * KV;
          std::vector<float> qkv(static_cast<size_t>(rows * ld));
          for (int64_t r = 0; r < rows; ++r) {
            std::copy_n(q.begin() + r * QD, QD, qkv.begin() + r * ld);
            std::copy_n(k.begin() + r * KV, KV, qkv.begin() + r * ld + QD);
            std::copy_n(v.begin() + r * KV, KV, qkv.begin() + r * ld + QD + KV);
          }
          DeviceArray<float> qkv_dev(qkv), q2(q);
          DeviceArray<uint8_t> cache2(static_cast<size_t>(blocks * stride * eb));
          RopeAppendArgs a;
          a.q = qkv_dev.get(), a.k = qkv_dev.get() + QD, a.v = qkv_dev.get() + QD + KV;
          a.ldq = a.ldk = a.ldv = ld;
          a.q_out = q2.get();
          a.rows = rows, a.H = H, a.Hkv = Hkv, a.D = D;
          a.table = table, a.layout = layout, a.positions = dpos.get();
          a.layer_kv = cache2.get() + 2 * half * eb, a.kv_type = t, a.slot = dslot.get();
          a.block_tokens = BT, a.block_stride = stride, a.v_offset = half;
          rope_kv_append(a, nullptr);
          const std::string what = "D=" + std::to_string(D) + " R=" + std::to_string(R) +
                                   (layout == RopeLayout::half ? " half " : " interleaved ") +
                                   std::string(dtype_name(t));
          const auto bits = [](const std::vector<float>& x) {
            std::vector<uint32_t> b(x.size());
            std::memcpy(b.data(), x.data(), x.size() * 4);
            return b;
          };
          const std::vector<float> q_got = q2.download();
          ASSERT_EQ(bits(q_got), bits(q1.download())) << what << ": q";
          ASSERT_EQ(bits(qkv_dev.download()), bits(qkv)) << what << ": the inputs were written";
          ASSERT_EQ(cache2.download(), cache1.download()) << what << ": cache";
          // In place on packed rows: the same q and cache.
          DeviceArray<float> q3(q), k3(k);
          DeviceArray<uint8_t> cache3(static_cast<size_t>(blocks * stride * eb));
          RopeAppendArgs b = a;
          b.q = b.q_out = q3.get(), b.k = k3.get(), b.v = v_dev.get();
          b.ldq = b.ldk = b.ldv = 0;
          b.layer_kv = cache3.get() + 2 * half * eb;
          rope_kv_append(b, nullptr);
          ASSERT_EQ(bits(q3.download()), bits(q_got)) << what << ": q in place";
          ASSERT_EQ(cache3.download(), cache1.download()) << what << ": cache in place";
          // The rotation did something, and the bad position gave NaN.
          ASSERT_NE(q_got[static_cast<size_t>(H * D)], q[static_cast<size_t>(H * D)]) << what;
          ASSERT_TRUE(std::isnan(q_got[static_cast<size_t>(3 * H * D)])) << what;
        }
}

TEST(DecoderKernels, RopeAppendRefusesBadShapes) {
  // Checked on the host before any launch: runs without a device.
  auto* fake = reinterpret_cast<float*>(uintptr_t{256});
  auto* ints = reinterpret_cast<int32_t*>(uintptr_t{256});
  RopeAppendArgs a;
  a.q = a.q_out = fake, a.k = fake, a.v = fake, a.positions = ints, a.slot = ints,
  a.layer_kv = fake;
  a.table.cos = fake, a.table.sin = fake, a.table.max_pos = 16, a.table.rotary_dim = 64;
  a.rows = 1, a.H = 4, a.Hkv = 2, a.D = 64, a.block_tokens = 16;
  a.v_offset = 2 * 16 * 64, a.block_stride = 2 * a.v_offset;
  RopeAppendArgs odd = a;
  odd.D = 63;
  tessera::test::expect_error([&] { rope_kv_append(odd, nullptr); }, "D=63");
  RopeAppendArgs wide = a;
  wide.table.rotary_dim = 96;
  tessera::test::expect_error([&] { rope_kv_append(wide, nullptr); }, "rotary_dim=96");
  RopeAppendArgs bf16 = a;
  bf16.kv_type = DType::bf16;
  tessera::test::expect_error([&] { rope_kv_append(bf16, nullptr); }, "kv_type bf16");
  RopeAppendArgs overlap = a;
  overlap.v_offset = 16;
  tessera::test::expect_error([&] { rope_kv_append(overlap, nullptr); }, "overlap");
  RopeAppendArgs no_table = a;
  no_table.table.sin = nullptr;
  tessera::test::expect_error([&] { rope_kv_append(no_table, nullptr); }, "rope table");
  RopeAppendArgs shifted = a;
  shifted.q_out = fake + 8;  // overlaps q's row without being q
  tessera::test::expect_error([&] { rope_kv_append(shifted, nullptr); }, "q_out overlaps");
}

}  // namespace
}  // namespace tessera::cuda
