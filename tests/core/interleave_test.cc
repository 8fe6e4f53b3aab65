// The q4_0x8 / q4_1x8 / q8_0x8 / f16x16 row-interleaved layouts: interleave then deinterleave
// gives the rows back byte for byte, the layout puts each row's pieces where the kernels read
// them, bad sizes and types are refused in one line, and the layouts cannot be named by files or
// flags.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/interleave.h"
#include "core/rng.h"
#include "test_util/expect_error.h"

namespace tessera {
namespace {

std::vector<uint8_t> random_rows(DType t, int64_t rows, int64_t K, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(rows * K));
  for (float& x : v) x = rng.normal();
  std::vector<uint8_t> w(static_cast<size_t>(dtype_bytes(t, rows * K)));
  from_f32(t, v.data(), w.data(), rows * K);
  return w;
}

TEST(Interleave, RoundTripRestoresEveryRow) {
  for (DType t : {DType::q4_0, DType::q4_1, DType::q8_0})
    for (int64_t K : {32, 96, 576}) {
      const int64_t rows = 24, row_bytes = dtype_bytes(t, K);
      const std::vector<uint8_t> plain = random_rows(t, rows, K, 7 + K);
      std::vector<uint8_t> w = plain;
      interleave_rows(t, w.data(), rows, K);
      EXPECT_NE(w, plain) << dtype_name(t);
      std::vector<uint8_t> row(static_cast<size_t>(row_bytes));
      for (int64_t r = 0; r < rows; ++r) {
        deinterleave_row(interleaved_type(t), w.data(), K, r, row.data());
        ASSERT_EQ(0, std::memcmp(row.data(), plain.data() + r * row_bytes, row_bytes))
            << dtype_name(t) << " K=" << K << " row " << r;
      }
      // A block range of one row.
      const int64_t nb = K / 32, b0 = nb / 2;
      std::vector<uint8_t> part(static_cast<size_t>((nb - b0) * traits(t).block_bytes));
      deinterleave_blocks(interleaved_type(t), w.data(), K, 13, b0, nb - b0, part.data());
      EXPECT_EQ(0,
                std::memcmp(part.data(), plain.data() + 13 * row_bytes + b0 * traits(t).block_bytes,
                            part.size()));
    }
}

TEST(Interleave, ChunkLayoutIsWhatTheKernelsRead) {
  // Block b of group g: 8 scales in row order, q4_1's 8 mins, then 16 quant bytes per row in
  // slot order 0 4 1 5 2 6 3 7; q8_0 has a second such run of 16 bytes per row after the first.
  const int64_t K = 64, rows = 8;
  for (DType t : {DType::q4_0, DType::q4_1, DType::q8_0}) {
    const std::vector<uint8_t> plain = random_rows(t, rows, K, 3);
    std::vector<uint8_t> w = plain;
    interleave_rows(t, w.data(), rows, K);
    const int64_t bb = traits(t).block_bytes, row_bytes = dtype_bytes(t, K);
    const int64_t header = t == DType::q4_1 ? 4 : 2, runs = (bb - header) / 16;
    for (int64_t b = 0; b < K / 32; ++b) {
      const uint8_t* chunk = w.data() + b * 8 * bb;
      for (int s = 0; s < 8; ++s) {
        const int r = kInterleaveSlotRow[s];
        const uint8_t* blk = plain.data() + r * row_bytes + b * bb;
        EXPECT_EQ(0, std::memcmp(chunk + 2 * r, blk, 2)) << "scale of row " << r;
        if (header == 4) {
          EXPECT_EQ(0, std::memcmp(chunk + 16 + 2 * r, blk + 2, 2)) << "min " << r;
        }
        for (int64_t run = 0; run < runs; ++run)
          EXPECT_EQ(
              0, std::memcmp(chunk + 8 * header + 128 * run + 16 * s, blk + header + 16 * run, 16))
              << dtype_name(t) << " quants of row " << r << " run " << run;
      }
    }
  }
}

TEST(Interleave, BadInputIsRefusedInOneLine) {
  std::vector<uint8_t> w(static_cast<size_t>(dtype_bytes(DType::q4_0, 16 * 64)));
  test::expect_error([&] { interleave_rows(DType::q4_0, w.data(), 12, 64); }, "12 rows");
  test::expect_error([&] { interleave_rows(DType::q4_0, w.data(), 8, 48); }, "48 elements");
  test::expect_error([&] { interleave_rows(DType::q3_k, w.data(), 8, 256); }, "q3_k");
  test::expect_error([&] { interleaved_type(DType::bf16); }, "bf16");
  test::expect_error([&] { interleave_rows(DType::f16, w.data(), 8, 64); }, "multiple of 16");
  std::vector<uint8_t> row(64);
  test::expect_error([&] { deinterleave_row(DType::q4_0, w.data(), 64, 0, row.data()); },
                     "not an interleaved layout");
  test::expect_error([&] { deinterleave_blocks(DType::q4_0x8, w.data(), 64, 0, 1, 2, row.data()); },
                     "outside");
}

TEST(Interleave, LayoutsAreNotStorageTypes) {
  test::expect_error([] { parse_dtype("q4_0x8", "--type"); }, "in-memory CPU layout");
  test::expect_error([] { parse_dtype("q4_1x8", "--dtype"); }, "--dtype");
  std::vector<uint8_t> w(static_cast<size_t>(dtype_bytes(DType::q4_0, 8 * 32)));
  std::vector<float> f(8 * 32);
  test::expect_error([&] { to_f32(DType::q4_0x8, w.data(), f.data(), 8 * 32); }, "q4_0x8");
  test::expect_error([&] { from_f32(DType::q4_1x8, f.data(), w.data(), 8 * 32); }, "q4_1x8");
  test::expect_error([] { parse_dtype("q8_0x8", "--type"); }, "in-memory CPU layout");
  test::expect_error([&] { to_f32(DType::q8_0x8, w.data(), f.data(), 8 * 32); }, "q8_0x8");
  EXPECT_EQ(plain_type(DType::q4_1x8), DType::q4_1);
  EXPECT_EQ(plain_type(DType::q8_0x8), DType::q8_0);
  EXPECT_EQ(interleaved_type(DType::q8_0), DType::q8_0x8);
  EXPECT_EQ(plain_type(DType::q8_0), DType::q8_0);
  EXPECT_TRUE(is_interleaved(DType::q4_0x8));
  EXPECT_FALSE(is_interleaved(DType::q4_0));
  EXPECT_EQ(act_block_elems(DType::q4_1x8), 32);
  EXPECT_EQ(dtype_bytes(DType::q4_0x8, 64), dtype_bytes(DType::q4_0, 64));
  EXPECT_EQ(dtype_bytes(DType::q8_0x8, 64), dtype_bytes(DType::q8_0, 64));
  test::expect_error([] { parse_dtype("f16x16", "--type"); }, "in-memory CPU layout");
  test::expect_error([&] { to_f32(DType::f16x16, w.data(), f.data(), 16); }, "f16x16");
  EXPECT_EQ(plain_type(DType::f16x16), DType::f16);
  EXPECT_EQ(interleaved_type(DType::f16), DType::f16x16);
  EXPECT_EQ(act_block_elems(DType::f16x16), 0);
  EXPECT_EQ(dtype_bytes(DType::f16x16, 64), dtype_bytes(DType::f16, 64));
}

// f16x16: element (16g + r, p) at half 16p + r of group g, the rows given back exactly, and a
// range of one row's elements.
TEST(Interleave, F16GroupsHoldEachDepthsSixteenRowsSideBySide) {
  for (int64_t K : {1, 7, 64}) {
    const int64_t rows = 48;
    const std::vector<uint8_t> plain = random_rows(DType::f16, rows, K, 5 + K);
    std::vector<uint8_t> w = plain;
    interleave_rows(DType::f16, w.data(), rows, K);
    const auto* p16 = reinterpret_cast<const uint16_t*>(plain.data());
    const auto* w16 = reinterpret_cast<const uint16_t*>(w.data());
    for (int64_t n = 0; n < rows; ++n)
      for (int64_t k = 0; k < K; ++k)
        ASSERT_EQ(w16[n / 16 * 16 * K + 16 * k + n % 16], p16[n * K + k])
            << "K=" << K << " row " << n << " k " << k;
    std::vector<uint8_t> row(static_cast<size_t>(2 * K));
    for (int64_t n = 0; n < rows; ++n) {
      deinterleave_row(DType::f16x16, w.data(), K, n, row.data());
      ASSERT_EQ(0, std::memcmp(row.data(), plain.data() + 2 * n * K, 2 * K)) << "row " << n;
    }
    std::vector<uint16_t> part(static_cast<size_t>(K));
    deinterleave_blocks(DType::f16x16, w.data(), K, 37, K / 2, K - K / 2, part.data());
    EXPECT_EQ(0, std::memcmp(part.data(), p16 + 37 * K + K / 2, 2 * (K - K / 2)));
    test::expect_error(
        [&] { deinterleave_blocks(DType::f16x16, w.data(), K, 0, K, 1, part.data()); }, "outside");
  }
}

}  // namespace
}  // namespace tessera
