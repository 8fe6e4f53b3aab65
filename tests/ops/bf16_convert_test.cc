// The bf16 activation ops (ops::round_to_bf16, ops::convert_bf16_to_f32) on the CPU, SIMD
// kernels over threads and the reference, against an oracle of their own: the nearest bf16
// value chosen in double between the two candidates around x, ties to the even one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "ops/ops.h"

namespace tessera::ops {
namespace {

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The nearest bf16 of x by comparing distances in double (not core's add-and-shift): the value
// truncated to its top 16 bits and the next one away from zero; a tie goes to the even one. NaN
// stays NaN (quiet); a value past the largest bf16's halfway point goes to infinity.
uint16_t oracle(float x) {
  const uint32_t u = bits(x);
  const uint16_t lo = static_cast<uint16_t>(u >> 16);
  if (std::isinf(x) || (u & 0xffffu) == 0) return lo;
  const uint16_t hi = static_cast<uint16_t>(lo + 1);  // next magnitude (may be infinity)
  // Past the largest finite bf16 the next step is 2^128, which IEEE rounding measures against.
  const bool to_inf = (hi & 0x7fffu) == 0x7f80u;
  const double dx = x, dlo = from_bits(uint32_t{lo} << 16),
               dhi = to_inf ? std::copysign(std::ldexp(1.0, 128), dx)
                            : static_cast<double>(from_bits(uint32_t{hi} << 16));
  const double a = std::fabs(dx - dlo), b = std::fabs(dhi - dx);
  if (a < b) return lo;
  if (b < a) return hi;
  return (lo & 1u) == 0 ? lo : hi;
}

std::vector<float> values(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 10.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = normal(rng);
  const uint32_t specials[] = {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xff800001u,
                               0x00000001u, 0x80000000u, 0x7f7fffffu, 0x3f808000u, 0x3f818000u,
                               0x3f808001u, 0x3f807fffu, 0x807fffffu, 0x0000ffffu};
  for (size_t i = 0; i < std::size(specials) && 10 * i + 3 < x.size(); ++i)
    x[10 * i + 3] = from_bits(specials[i]);
  return x;
}

struct Case {
  const char* name;
  bool reference;
  int threads;
};
const Case kCases[] = {
    {"reference", true, 1}, {"simd, 1 thread", false, 1}, {"simd, 2 threads", false, 2}};

// More than the kernels' grain (2^16), so the threads split it; odd, so no size is a multiple.
constexpr int64_t kN = 200003;

TEST(Bf16Activations, RoundToBf16GivesTheNearestBf16InPlace) {
  const std::vector<float> x = values(kN, 7);
  for (const Case& c : kCases)
    for (bool keep : {true, false}) {
      ThreadPool pool(c.threads);
      Context ctx;
      ctx.pool = &pool;
      ctx.reference = c.reference;
      std::vector<float> y = x;
      std::vector<uint16_t> h(x.size(), 0x1234u);
      round_to_bf16(ctx, y.data(), keep ? h.data() : nullptr, kN);
      int bad = 0;
      for (int64_t i = 0; i < kN; ++i) {
        const float xi = x[static_cast<size_t>(i)], yi = y[static_cast<size_t>(i)];
        const uint16_t hi = h[static_cast<size_t>(i)];
        bool ok;
        if (std::isnan(xi)) {
          ok = std::isnan(yi) && (!keep || ((hi & 0x7f80u) == 0x7f80u && (hi & 0x7fu) != 0));
        } else {
          const uint16_t want = oracle(xi);
          ok = bits(yi) == uint32_t{want} << 16 && (keep ? hi == want : hi == 0x1234u);
        }
        if (!ok && ++bad <= 5)
          ADD_FAILURE() << c.name << (keep ? ", kept" : "") << ": element " << i << " bits 0x"
                        << std::hex << bits(xi) << " gave 0x" << bits(yi);
      }
      EXPECT_EQ(bad, 0) << c.name;
    }
}

TEST(Bf16Activations, ConvertBf16ToF32IsExact) {
  std::vector<uint16_t> h(static_cast<size_t>(kN));
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint16_t>(i * 40503u);  // all patterns
  for (const Case& c : kCases) {
    ThreadPool pool(c.threads);
    Context ctx;
    ctx.pool = &pool;
    ctx.reference = c.reference;
    std::vector<float> y(h.size());
    convert_bf16_to_f32(ctx, y.data(), h.data(), kN);
    for (int64_t i = 0; i < kN; ++i)
      ASSERT_EQ(bits(y[static_cast<size_t>(i)]), uint32_t{h[static_cast<size_t>(i)]} << 16)
          << c.name << ": element " << i;
  }
}

// The round trip the trainer makes: the kept bits widened back give the rounded values.
TEST(Bf16Activations, KeptBitsWidenToTheRoundedValues) {
  std::vector<float> x = values(kN, 9);
  std::vector<uint16_t> h(x.size());
  round_to_bf16(Context{}, x.data(), h.data(), kN);
  std::vector<float> back(x.size());
  convert_bf16_to_f32(Context{}, back.data(), h.data(), kN);
  EXPECT_EQ(std::memcmp(back.data(), x.data(), x.size() * 4), 0);
}

}  // namespace
}  // namespace tessera::ops
