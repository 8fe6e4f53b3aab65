// Host-only check that the CUDA kernels' bf16 rounding helper (bf16_convert.cuh, shared by host
// and device code) gives core/dtype.h's bits on special values and a sweep of bit patterns.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <limits>

#include "backend/cuda/bf16_convert.cuh"
#include "core/dtype.h"

namespace tessera {
namespace {

// Called through volatile function pointers: both conversions inline to the same expression,
// and the compiler would otherwise fold every comparison to "equal" without running either.
uint16_t cuda_round(float f) {
  return cuda::f32_to_bf16_bits(f);
}
uint16_t core_round(float f) {
  return f32_to_bf16(f);
}
uint16_t (*volatile cuda_fn)(float) = &cuda_round;
uint16_t (*volatile core_fn)(float) = &core_round;

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(CudaBf16Convert, SpecialValuesMatchCore) {
  const float specials[] = {0.0f,
                            -0.0f,
                            1.0f,
                            -1.0f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::signaling_NaN(),
                            std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::lowest(),
                            std::numeric_limits<float>::min(),
                            std::numeric_limits<float>::denorm_min(),
                            from_bits(0x7f7fffffu),  // rounds up to +inf
                            from_bits(0x3f808000u),  // tie, even below: stays 0x3f80
                            from_bits(0x3f818000u),  // tie, odd below: rounds up to 0x3f82
                            from_bits(0x7f800001u),  // NaN with only a low payload bit
                            from_bits(0xff800001u),
                            from_bits(0x0000ffffu),
                            from_bits(0x807fffffu)};
  for (float f : specials) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    EXPECT_EQ(cuda_fn(f), core_fn(f)) << std::hex << "bits 0x" << u;
  }
  // The bits themselves, not only agreement with core (both could share a mistake).
  EXPECT_EQ(cuda_fn(1.0f), 0x3f80u);
  EXPECT_EQ(cuda_fn(-1.0f), 0xbf80u);
  EXPECT_EQ(cuda_fn(-0.0f), 0x8000u);
  EXPECT_EQ(cuda_fn(from_bits(0x7f7fffffu)), 0x7f80u);  // FLT_MAX rounds up to +inf
  EXPECT_EQ(cuda_fn(from_bits(0x3f808000u)), 0x3f80u);  // tie, even below: stays
  EXPECT_EQ(cuda_fn(from_bits(0x3f818000u)), 0x3f82u);  // tie, odd below: rounds up
  EXPECT_EQ(cuda_fn(from_bits(0x3f808001u)), 0x3f81u);  // just above the tie: up
  EXPECT_EQ(cuda_fn(from_bits(0x3f807fffu)), 0x3f80u);  // just below the tie: down
  EXPECT_EQ(cuda_fn(std::numeric_limits<float>::infinity()), 0x7f80u);
  EXPECT_EQ(cuda_fn(from_bits(0x807fffffu)), 0x8080u);  // largest negative subnormal rounds up
  // NaN stays NaN even when only low payload bits are set (truncation alone would give inf).
  const uint16_t h = cuda_fn(from_bits(0x7f800001u));
  EXPECT_EQ(h & 0x7f80u, 0x7f80u);
  EXPECT_NE(h & 0x007fu, 0u);
}

TEST(CudaBf16Convert, BitPatternSweepMatchesCore) {
  // Every 2^32 / ~17M-th pattern with an odd stride (hits all residues of the low bits), plus
  // every pattern whose low 16 bits sit at the rounding boundaries.
  uint64_t mismatches = 0;
  for (uint64_t u = 0; u < (1ull << 32); u += 251) {
    const float f = from_bits(static_cast<uint32_t>(u));
    if (cuda_fn(f) != core_fn(f)) ++mismatches;
  }
  for (uint32_t hi = 0; hi < 0x10000u; ++hi) {
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      const float f = from_bits((hi << 16) | lo);
      if (cuda_fn(f) != core_fn(f)) ++mismatches;
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(CudaBf16Convert, WideningMatchesCoreForEveryBf16) {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float a = cuda::bf16_bits_to_f32(static_cast<uint16_t>(h));
    const float b = bf16_to_f32(static_cast<uint16_t>(h));
    ASSERT_EQ(std::memcmp(&a, &b, 4), 0) << "bf16 0x" << std::hex << h;
  }
}

}  // namespace
}  // namespace tessera
