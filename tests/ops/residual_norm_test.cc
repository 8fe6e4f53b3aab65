// ops::residual_norm is a branch joining the stream and the next norm in one op: it must leave
// exactly what add then layernorm_forward / rmsnorm_forward leave, bit for bit, on the SIMD and
// the reference kernels, in place (x_out == a) or not; and its norm must agree with one computed
// in double. Aliases it cannot take are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/rng.h"
#include "ops/ops.h"
#include "test_util/expect_error.h"

namespace tessera::ops {
namespace {

constexpr int64_t kN = 7, kC = 40;

std::vector<float> randoms(size_t n, uint64_t seed) {
  std::vector<float> x(n);
  Rng rng(seed);
  for (float& v : x) v = rng.normal();
  return x;
}

std::vector<uint32_t> bits(const std::vector<float>& x) {
  std::vector<uint32_t> b(x.size());
  std::memcpy(b.data(), x.data(), x.size() * sizeof(float));
  return b;
}

struct Outputs {
  std::vector<float> x, out, mean, rstd;
};

Outputs fused(const Context& ctx, NormKind kind, bool in_place) {
  const std::vector<float> a = randoms(kN * kC, 1), r = randoms(kN * kC, 2);
  const std::vector<float> w = randoms(kC, 3), b = randoms(kC, 4);
  Outputs o{a, std::vector<float>(kN * kC), std::vector<float>(kN), std::vector<float>(kN)};
  std::vector<float> x(kN * kC);
  ResidualNormArgs args;
  args.kind = kind;
  args.x_out = in_place ? o.x.data() : x.data();
  args.out = o.out.data(), args.mean = o.mean.data(), args.rstd = o.rstd.data();
  args.a = o.x.data(), args.r = r.data(), args.w = w.data(), args.b = b.data();
  args.N = kN, args.C = kC, args.eps = 1e-6f;
  residual_norm(ctx, args);
  if (!in_place) o.x = x;
  return o;
}

Outputs parts(const Context& ctx, NormKind kind) {
  const std::vector<float> a = randoms(kN * kC, 1), r = randoms(kN * kC, 2);
  const std::vector<float> w = randoms(kC, 3), b = randoms(kC, 4);
  Outputs o{std::vector<float>(kN * kC), std::vector<float>(kN * kC), std::vector<float>(kN),
            std::vector<float>(kN)};
  add(ctx, o.x.data(), a.data(), r.data(), kN * kC);
  if (kind == NormKind::layer)
    layernorm_forward(ctx, o.out.data(), o.mean.data(), o.rstd.data(), o.x.data(), w.data(),
                      b.data(), kN, kC);
  else
    rmsnorm_forward(ctx, o.out.data(), o.rstd.data(), o.x.data(), w.data(), kN, kC, 1e-6f);
  return o;
}

TEST(ResidualNorm, LeavesExactlyWhatAddThenTheNormLeave) {
  for (bool reference : {false, true})
    for (NormKind kind : {NormKind::rms, NormKind::layer})
      for (bool in_place : {false, true}) {
        Context ctx;
        ctx.reference = reference;
        const std::string what = std::string(reference ? "ref" : "simd") +
                                 (kind == NormKind::rms ? " rms" : " layer") +
                                 (in_place ? " in place" : "");
        const Outputs f = fused(ctx, kind, in_place), p = parts(ctx, kind);
        ASSERT_EQ(bits(f.x), bits(p.x)) << what;
        ASSERT_EQ(bits(f.out), bits(p.out)) << what;
        ASSERT_EQ(bits(f.rstd), bits(p.rstd)) << what;
        if (kind == NormKind::layer) {
          ASSERT_EQ(bits(f.mean), bits(p.mean)) << what;
        }
      }
}

TEST(ResidualNorm, AgreesWithDouble) {
  const std::vector<float> a = randoms(kN * kC, 1), r = randoms(kN * kC, 2);
  const std::vector<float> w = randoms(kC, 3), b = randoms(kC, 4);
  for (NormKind kind : {NormKind::rms, NormKind::layer}) {
    const Outputs f = fused(Context{}, kind, false);
    for (int64_t i = 0; i < kN; ++i) {
      double sum = 0, sq = 0;
      for (int64_t j = 0; j < kC; ++j) sum += static_cast<double>(a[i * kC + j]) + r[i * kC + j];
      const double mean = kind == NormKind::layer ? sum / kC : 0.0;
      for (int64_t j = 0; j < kC; ++j) {
        const double d = static_cast<double>(a[i * kC + j]) + r[i * kC + j] - mean;
        sq += d * d;
      }
      const double rstd = 1.0 / std::sqrt(sq / kC + (kind == NormKind::layer ? 1e-5 : 1e-6));
      for (int64_t j = 0; j < kC; ++j) {
        const double x = static_cast<double>(a[i * kC + j]) + r[i * kC + j];
        const double want = (x - mean) * rstd * w[j] + (kind == NormKind::layer ? b[j] : 0.0);
        ASSERT_NEAR(f.out[i * kC + j], want, 1e-5 * (1 + std::fabs(want))) << i << " " << j;
      }
    }
  }
}

TEST(ResidualNorm, RefusesAliasesItCannotTake) {
  std::vector<float> a(kN * kC, 1.0f), r(kN * kC, 1.0f), w(kC, 1.0f), rstd(kN);
  ResidualNormArgs args;
  args.x_out = a.data(), args.out = a.data(), args.rstd = rstd.data();
  args.a = a.data(), args.r = r.data(), args.w = w.data(), args.N = kN, args.C = kC;
  test::expect_error([&] { residual_norm(Context{}, args); }, "out must not alias");
  args.out = r.data();
  args.x_out = r.data();
  test::expect_error([&] { residual_norm(Context{}, args); }, "out must not alias");
  args.kind = NormKind::layer;
  args.out = w.data(), args.x_out = a.data();
  test::expect_error([&] { residual_norm(Context{}, args); }, "mean for a layer norm");
}

}  // namespace
}  // namespace tessera::ops
