// Tests of dtype traits, bf16/f16 rounding and the block (de)quantizers' error bounds.
#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/rng.h"

namespace tessera {
namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(DType, TraitsAndParse) {
  EXPECT_EQ(traits(DType::q8_0).block_bytes, 34);
  EXPECT_EQ(traits(DType::q4_0).block_elems, 32);
  EXPECT_EQ(parse_dtype("bf16", "--precision"), DType::bf16);
  EXPECT_THROW(parse_dtype("f8", "--precision"), Error);
  EXPECT_EQ(dtype_bytes(DType::q4_1, 64), 40);
  EXPECT_THROW(dtype_bytes(DType::q4_1, 33), Error);
}

TEST(DType, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is exactly half way between bf16 neighbours 1 and 1+2^-7: ties go to even (1).
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808000u)), 0x3f80);
  // Slightly above half way rounds up.
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f808001u)), 0x3f81);
  // Half way with odd lower neighbour rounds up to even.
  EXPECT_EQ(f32_to_bf16(from_bits(0x3f818000u)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-2.5f)), -2.5f);
}

TEST(DType, F16RoundTripAndEdges) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t x = static_cast<uint16_t>(h);
    const float f = f16_to_f32(x);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_f16(f), x) << "half bits " << h;
  }
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // rounds to infinity
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7bff);  // largest finite
  EXPECT_EQ(f16_to_f32(f32_to_f16(1e-8f)), 0.0f);
}

TEST(DType, BlockQuantErrorWithinHalfStep) {
  Rng rng(7);
  std::vector<float> x(32 * 64), y(x.size());
  for (auto& v : x) v = rng.normal();
  for (DType t : {DType::q8_0, DType::q4_0, DType::q4_1}) {
    std::vector<uint8_t> q(static_cast<size_t>(dtype_bytes(t, static_cast<int64_t>(x.size()))));
    from_f32(t, x.data(), q.data(), static_cast<int64_t>(x.size()));
    to_f32(t, q.data(), y.data(), static_cast<int64_t>(x.size()));
    for (size_t b = 0; b < x.size() / 32; ++b) {
      float lo = x[b * 32], hi = lo, amax = 0;
      for (int j = 0; j < 32; ++j) {
        lo = std::min(lo, x[b * 32 + j]);
        hi = std::max(hi, x[b * 32 + j]);
        amax = std::max(amax, std::fabs(x[b * 32 + j]));
      }
      // Step size of each format; the error is at most half a step plus f16 scale rounding,
      // except q4_0, whose grid [-8d, 7d] clamps the extreme opposite the largest magnitude
      // (as in GGUF) and so errs there by up to one full step.
      const float step = t == DType::q8_0   ? amax / 127
                         : t == DType::q4_0 ? amax / 8
                                            : (hi - lo) / 15;
      const float steps = t == DType::q4_0 ? 1.0f : 0.5f;
      const float bound = t == DType::q4_1 ? steps * step + 2e-3f * (std::fabs(lo) + 15 * step)
                                           : steps * step + 2e-3f * amax;
      for (int j = 0; j < 32; ++j)
        ASSERT_LE(std::fabs(x[b * 32 + j] - y[b * 32 + j]), bound)
            << dtype_name(t) << " block " << b;
    }
  }
}

}  // namespace
}  // namespace tessera
