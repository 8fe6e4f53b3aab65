// Llama ops (RMSNorm, RoPE, SwiGLU): Highway vs reference over odd shapes, misalignment and 1..3
// threads (bit-identical across thread counts), backward vs double-precision finite
// differences, RoPE's rotation properties in both pair layouts, and argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/ref/ref_kernels.h"
#include "core/error.h"
#include "hwy/targets.h"
#include "kernel_test_util.h"
#include "ops/ops.h"

namespace tessera {
namespace {

using ops::GluAct;
using ops::RopeLayout;
using test::Buf;
using test::kEpsF;
using test::normal_buf;
using test::pool;
using Vec = std::vector<double>;

const RopeLayout kLayouts[] = {RopeLayout::half, RopeLayout::interleaved};

bool same_bits(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

// Runs fn and checks it throws tessera::Error whose message contains `needle`.
void expect_error(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one naming '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// Runs fn once per SIMD target compiled in and supported by this CPU (e.g. AVX2, SSE4, SSSE3,
// EMU128), so every path HWY_DYNAMIC_DISPATCH may take is checked; then restores the default.
void for_each_target(const std::function<void()>& fn) {
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    fn();
  }
  hwy::SetSupportedTargetsForTest(0);
}

// Central difference of f along coordinate i; as in kernels_grad_test.cc, with h = 1e-5 the
// truncation (h^2 f''' / 6) and rounding (1e-16 |f| / h) errors are ~1e-10 for these O(1)
// objectives, far below the f32 analytic errors; kFdAllow covers them.
double central_diff(Vec& x, size_t i, const std::function<double()>& f) {
  const double x0 = x[i], h = 1e-5 * std::max(1.0, std::fabs(x0));
  x[i] = x0 + h;
  const double fp = f();
  x[i] = x0 - h;
  const double fm = f();
  x[i] = x0;
  return (fp - fm) / (2 * h);
}
constexpr double kFdAllow = 1e-8;

// ---------------------------------------------------------------------------------------------
// RMSNorm

struct RowShape {
  int64_t N, C;
};
// {1000, 33} and {300, 64} span several row chunks (16384 / C rows each) and backward partials.
const RowShape kRmsShapes[] = {{1, 1},  {3, 17},   {17, 3},   {5, 63},
                               {7, 65}, {64, 769}, {300, 64}, {1000, 33}};
constexpr float kRmsEps = 1e-6f;

TEST(RmsNorm, ForwardMatchesReferenceAndThreadCount) {
  for_each_target([&] {
    for (const auto& [N, C] : kRmsShapes) {
      const int off = static_cast<int>((N + C) % 2);
      Buf x = normal_buf(N * C, off, 300 + C, 1.5f), w = normal_buf(C, off, 301);
      Buf rout(N * C, off), rrstd(N, off);
      std::vector<float> out1, rstd1;
      cpu::ref::rmsnorm_forward(rout.p, rrstd.p, x.p, w.p, N, C, kRmsEps);
      for (int threads = 1; threads <= 3; ++threads) {
        Buf out(N * C, off), rstd(N, off);
        cpu::rmsnorm_forward(pool(threads), out.p, rstd.p, x.p, w.p, N, C, kRmsEps);
        if (threads == 1) {
          out1.assign(out.p, out.p + N * C);
          rstd1.assign(rstd.p, rstd.p + N);
        } else {
          ASSERT_TRUE(same_bits(out.p, out1.data(), N * C)) << "N=" << N << " C=" << C;
          ASSERT_TRUE(same_bits(rstd.p, rstd1.data(), N)) << "N=" << N << " C=" << C;
        }
      }
      // The sum of C squares (all >= 0) in f32, in any order, errs by at most (C + 1) eps
      // relative; mean, + eps, sqrt and the reciprocal add ~2 eps, and sqrt halves the sum's
      // error, so rstd is within g = (C + 4) eps relative. out = x r w adds two roundings, plus
      // the reference's own rounding.
      const double g = (C + 4) * kEpsF;
      for (int64_t n = 0; n < N; ++n) {
        ASSERT_NEAR(rstd1[n], rrstd[n], g * rrstd[n]) << "N=" << N << " C=" << C << " n=" << n;
        for (int64_t c = 0; c < C; ++c) {
          const int64_t i = n * C + c;
          const double exact = static_cast<double>(x[i]) * rrstd[n] * w[c];
          ASSERT_NEAR(out1[i], rout[i], (g + 3 * kEpsF) * std::fabs(exact))
              << "N=" << N << " C=" << C << " i=" << i;
        }
      }
    }
  });
}

TEST(RmsNorm, BackwardMatchesReferenceAccumulatesAndThreadCount) {
  for_each_target([&] {
    for (const auto& [N, C] : kRmsShapes) {
      const int off = static_cast<int>((N + C + 1) % 2);
      Buf x = normal_buf(N * C, off, 310 + C), w = normal_buf(C, off, 311);
      Buf dout = normal_buf(N * C, off, 312 + N), out(N * C, off), rstd(N, off);
      cpu::ref::rmsnorm_forward(out.p, rstd.p, x.p, w.p, N, C, kRmsEps);
      // Non-zero starting gradients: backward accumulates.
      const Buf dx0 = normal_buf(N * C, off, 313), dw0 = normal_buf(C, off, 314);
      Buf rdx = dx0, rdw = dw0;
      std::vector<float> dx1, dw1;
      cpu::ref::rmsnorm_backward(rdx.p, rdw.p, dout.p, x.p, w.p, rstd.p, N, C);
      for (int threads = 1; threads <= 3; ++threads) {
        Buf dx = dx0, dw = dw0;
        cpu::rmsnorm_backward(pool(threads), dx.p, dw.p, dout.p, x.p, w.p, rstd.p, N, C);
        if (threads == 1) {
          dx1.assign(dx.p, dx.p + N * C);
          dw1.assign(dw.p, dw.p + C);
        } else {
          ASSERT_TRUE(same_bits(dx.p, dx1.data(), N * C)) << "N=" << N << " C=" << C;
          ASSERT_TRUE(same_bits(dw.p, dw1.data(), C)) << "N=" << N << " C=" << C;
        }
      }
      // dinp = r (g - xhat mean(g xhat)): the mean is an f32 sum of C terms (error (C + 4) eps
      // times the mean of magnitudes), every other step a few roundings; then one rounding for
      // the accumulation into the old value.
      const double g = (C + 4) * kEpsF;
      std::vector<double> dw_mag(static_cast<size_t>(C), 0.0);
      for (int64_t n = 0; n < N; ++n) {
        double mgx = 0;
        for (int64_t c = 0; c < C; ++c)
          mgx += std::fabs(double{dout[n * C + c]} * w[c] * x[n * C + c] * rstd[n]) / C;
        for (int64_t c = 0; c < C; ++c) {
          const int64_t i = n * C + c;
          const double xhat = std::fabs(double{x[i]} * rstd[n]);
          dw_mag[c] += std::fabs(dout[i]) * xhat;
          const double gc = std::fabs(double{dout[i]} * w[c]);
          const double tol = rstd[n] * (g + 6 * kEpsF) * (gc + xhat * mgx) +
                             kEpsF * (std::fabs(rdx[i]) + std::fabs(dx0[i]));
          ASSERT_NEAR(dx1[i], rdx[i], tol) << "N=" << N << " C=" << C << " i=" << i;
        }
      }
      // dw: f32 partial sums over rows then over at most 256 partials: (N + 4) eps relative to
      // the sum of magnitudes, plus xhat's rounding and the accumulation.
      for (int64_t c = 0; c < C; ++c) {
        const double tol =
            (N + 6) * kEpsF * dw_mag[c] + kEpsF * (std::fabs(rdw[c]) + std::fabs(dw0[c]));
        ASSERT_NEAR(dw1[c], rdw[c], tol) << "N=" << N << " C=" << C << " c=" << c;
      }
    }
  });
}

TEST(RmsNorm, OutMayAliasInput) {
  const int64_t N = 9, C = 67;
  Buf x = normal_buf(N * C, 1, 320), w = normal_buf(C, 1, 321), out(N * C, 1), rstd(N, 1);
  cpu::rmsnorm_forward(pool(2), out.p, rstd.p, x.p, w.p, N, C, kRmsEps);
  cpu::rmsnorm_forward(pool(2), x.p, rstd.p, x.p, w.p, N, C, kRmsEps);
  EXPECT_TRUE(same_bits(x.p, out.p, N * C));
}

// Qwen3's per-head norms: every head slice of every row against double sums, the gaps between
// the heads and the row stride left untouched, the same for one and two threads; bad sizes named.
TEST(HeadRmsNorm, MatchesDoubleSumsPerHeadAndLeavesTheRestOfTheRow) {
  const int64_t n = 37, heads = 3, D = 40, ld = heads * D + 9;
  std::vector<float> x(static_cast<size_t>(n * ld)), w(static_cast<size_t>(D));
  test::fill_normal(x.data(), n * ld, 1, 2.0f);
  test::fill_normal(w.data(), D, 2, 0.5f);
  std::vector<float> a = x, b = x, r = x;
  cpu::head_rmsnorm(test::pool(1), a.data(), ld, n, heads, D, w.data(), 1e-6f);
  cpu::head_rmsnorm(test::pool(2), b.data(), ld, n, heads, D, w.data(), 1e-6f);
  cpu::ref::head_rmsnorm(r.data(), ld, n, heads, D, w.data(), 1e-6f);
  EXPECT_EQ(a, b);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < heads; ++h) {
      const float* s = x.data() + i * ld + h * D;
      double ss = 0;
      for (int64_t d = 0; d < D; ++d) ss += double{s[d]} * s[d];
      const double inv = 1 / std::sqrt(ss / D + 1e-6);
      for (int64_t d = 0; d < D; ++d) {
        const size_t at = static_cast<size_t>(i * ld + h * D + d);
        const double want = s[d] * inv * w[static_cast<size_t>(d)];
        ASSERT_NEAR(a[at], want, 1e-5 * (1 + std::fabs(want))) << i << " " << h << " " << d;
        ASSERT_NEAR(r[at], want, 1e-6 * (1 + std::fabs(want)));
      }
    }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = heads * D; k < ld; ++k)
      ASSERT_EQ(a[static_cast<size_t>(i * ld + k)], x[static_cast<size_t>(i * ld + k)]);
  const ops::Context ctx;
  try {
    ops::head_rmsnorm(ctx, a.data(), 100, n, heads, D, w.data(), 1e-6f);
    ADD_FAILURE() << "a stride shorter than the heads was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ld=100"), std::string::npos) << e.what();
  }
}

// The per-head norm's backward against central differences of sum(dy * forward(x)), for dx and dw,
// with dx written over dy (the training step's in-place use).
TEST(HeadRmsNorm, BackwardMatchesCentralDifferences) {
  const int64_t n = 3, heads = 2, D = 8, ld = heads * D + 5, ld_x = heads * D;
  std::vector<float> x(static_cast<size_t>(n * ld_x)), w(static_cast<size_t>(D)),
      dy(static_cast<size_t>(n * ld));
  test::fill_normal(x.data(), n * ld_x, 4, 1.0f);
  test::fill_normal(w.data(), D, 5, 0.5f);
  test::fill_normal(dy.data(), n * ld, 6, 1.0f);
  auto objective = [&](const std::vector<float>& xs, const std::vector<float>& ws) {
    std::vector<float> y(static_cast<size_t>(n * ld), 0.0f);
    for (int64_t r = 0; r < n; ++r)
      std::copy(xs.begin() + r * ld_x, xs.begin() + (r + 1) * ld_x, y.begin() + r * ld);
    cpu::ref::head_rmsnorm(y.data(), ld, n, heads, D, ws.data(), 1e-5f);
    double s = 0;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t k = 0; k < heads * D; ++k)
        s += double{dy[static_cast<size_t>(r * ld + k)]} * y[static_cast<size_t>(r * ld + k)];
    return s;
  };
  std::vector<float> dx = dy, dw(static_cast<size_t>(D), 0.0f);
  const ops::Context ctx;
  ops::HeadNormBackwardArgs a;
  a.dx = dx.data(), a.dw = dw.data(), a.dy = dx.data(), a.x = x.data();
  a.ld = ld, a.ld_x = ld_x, a.n = n, a.heads = heads, a.D = D, a.w = w.data(), a.eps = 1e-5f;
  ops::head_rmsnorm_backward(ctx, a);
  const float h = 1e-3f;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t k = 0; k < heads * D; ++k) {
      std::vector<float> a = x, b = x;
      a[static_cast<size_t>(r * ld_x + k)] += h;
      b[static_cast<size_t>(r * ld_x + k)] -= h;
      const double fd = (objective(a, w) - objective(b, w)) / (2 * h);
      EXPECT_NEAR(dx[static_cast<size_t>(r * ld + k)], fd, 2e-3 * (1 + std::fabs(fd))) << r << k;
    }
  for (int64_t d = 0; d < D; ++d) {
    std::vector<float> a = w, b = w;
    a[static_cast<size_t>(d)] += h;
    b[static_cast<size_t>(d)] -= h;
    const double fd = (objective(x, a) - objective(x, b)) / (2 * h);
    EXPECT_NEAR(dw[static_cast<size_t>(d)], fd, 2e-3 * (1 + std::fabs(fd))) << d;
  }
}

TEST(GradCheck, RmsNorm) {
  for (const auto& [N, C] : {RowShape{3, 17}, RowShape{2, 65}, RowShape{4, 1}}) {
    const Buf x = normal_buf(N * C, 0, 330 + C), w = normal_buf(C, 0, 331),
              r = normal_buf(N * C, 0, 332);
    Vec xd(x.p, x.p + N * C), wd(w.p, w.p + C);
    // Objective f = sum(rmsnorm(x) * r) in double.
    auto f = [&]() {
      double s = 0;
      for (int64_t n = 0; n < N; ++n) {
        double ss = 0;
        for (int64_t c = 0; c < C; ++c) ss += xd[n * C + c] * xd[n * C + c] / C;
        const double rs = 1 / std::sqrt(ss + kRmsEps);
        for (int64_t c = 0; c < C; ++c) s += xd[n * C + c] * rs * wd[c] * r[n * C + c];
      }
      return s;
    };
    for (int variant = 0; variant < 2; ++variant) {
      std::vector<float> out(N * C), rstd(N), dx(N * C, 0.0f), dw(C, 0.0f);
      if (variant == 0) {
        cpu::rmsnorm_forward(pool(2), out.data(), rstd.data(), x.p, w.p, N, C, kRmsEps);
        cpu::rmsnorm_backward(pool(2), dx.data(), dw.data(), r.p, x.p, w.p, rstd.data(), N, C);
      } else {
        cpu::ref::rmsnorm_forward(out.data(), rstd.data(), x.p, w.p, N, C, kRmsEps);
        cpu::ref::rmsnorm_backward(dx.data(), dw.data(), r.p, x.p, w.p, rstd.data(), N, C);
      }
      // dinp = r (g - xhat mean(g xhat)), g = dout w, with r from an f32 forward ((C + 4) eps)
      // and an f32 mean over C: relative errors ~(C + 16) eps on terms of size
      // r |g|max (1 + |xhat|max^2). dw: f32 sums over N rows of |dout xhat| plus xhat's error.
      double r_max = 0, g_max = 0, xhat_max = 0;
      for (int64_t n = 0; n < N; ++n) r_max = std::max(r_max, double{rstd[n]});
      for (int64_t i = 0; i < N * C; ++i) {
        g_max = std::max(g_max, std::fabs(double{r[i]} * w[i % C]));
        xhat_max = std::max(xhat_max, std::fabs(double{x[i]} * rstd[i / C]));
      }
      const double tol_x = (C + 16) * kEpsF * r_max * g_max * (1 + xhat_max * xhat_max) + kFdAllow;
      for (int64_t i = 0; i < N * C; ++i)
        ASSERT_NEAR(dx[i], central_diff(xd, i, f), tol_x) << "dinp N=" << N << " C=" << C;
      for (int64_t c = 0; c < C; ++c) {
        double sw = 0;
        for (int64_t n = 0; n < N; ++n) sw += std::fabs(r[n * C + c]) * xhat_max;
        ASSERT_NEAR(dw[c], central_diff(wd, c, f), (N + C + 16) * kEpsF * sw + kFdAllow)
            << "dw N=" << N << " C=" << C << " c=" << c;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// RoPE

struct RopeShape {
  int64_t B, T, H, D, R;
};
// Covers R/2 below, at and past a vector (with scalar tails), R < D (pass-through dims), and
// (2, 40, 4, 64) which spans two token chunks (16384 / (H D) = 64 tokens each).
const RopeShape kRopeShapes[] = {{1, 1, 1, 2, 2},   {2, 3, 2, 8, 8},     {1, 5, 3, 64, 64},
                                 {2, 7, 3, 18, 10}, {1, 4, 2, 130, 130}, {3, 9, 5, 96, 64},
                                 {2, 40, 4, 64, 64}};
constexpr double kTheta = 10000.0;

// The partner of element j of a head in a rotated pair, and whether j is the pair's first.
int64_t partner(int64_t j, int64_t R, RopeLayout layout) {
  if (layout == RopeLayout::interleaved) return j ^ 1;
  return j < R / 2 ? j + R / 2 : j - R / 2;
}

TEST(Rope, TableHoldsRoundedCosSin) {
  const auto t = ops::make_rope_table(50, 10, kTheta);
  ASSERT_EQ(t.cos.size(), 50u * 5u);
  for (int64_t p = 0; p < 50; ++p) {
    for (int64_t i = 0; i < 5; ++i) {
      const double a = p * std::pow(kTheta, -2.0 * i / 10);
      // One rounding of a double value: half an ulp, below eps/2 relative.
      EXPECT_NEAR(t.cos[p * 5 + i], std::cos(a), 0.5 * kEpsF * std::fabs(std::cos(a)) + 1e-300);
      EXPECT_NEAR(t.sin[p * 5 + i], std::sin(a), 0.5 * kEpsF * std::fabs(std::sin(a)) + 1e-300);
    }
  }
}

TEST(Rope, MatchesReferenceInPlaceAndThreadCount) {
  for_each_target([&] {
    for (const auto& [B, T, H, D, R] : kRopeShapes) {
      const int64_t n = B * T * H * D, max_pos = T + 600;
      const auto table = ops::make_rope_table(max_pos, R, kTheta);
      std::vector<int32_t> positions(static_cast<size_t>(T));
      for (int64_t t = 0; t < T; ++t) positions[t] = static_cast<int32_t>((t * 97 + 13) % max_pos);
      for (RopeLayout layout : kLayouts) {
        for (bool explicit_pos : {false, true}) {
          const int32_t* pos = explicit_pos ? positions.data() : nullptr;
          const int64_t pos0 = explicit_pos ? 0 : 517;
          const int off = static_cast<int>((D + T) % 2);
          const Buf x = normal_buf(n, off, 400 + D + T);
          for (bool backward : {false, true}) {
            auto fast = [&](int threads, float* o, const float* in) {
              if (backward)
                cpu::rope_backward(pool(threads), o, in, table, pos, pos0, B, T, H, D, layout);
              else
                cpu::rope_forward(pool(threads), o, in, table, pos, pos0, B, T, H, D, layout);
            };
            Buf ref(n, off), out1(n, off);
            if (backward)
              cpu::ref::rope_backward(ref.p, x.p, table, pos, pos0, B, T, H, D, layout);
            else
              cpu::ref::rope_forward(ref.p, x.p, table, pos, pos0, B, T, H, D, layout);
            fast(1, out1.p, x.p);
            for (int threads = 2; threads <= 3; ++threads) {
              Buf out(n, off), inplace = x;
              fast(threads, out.p, x.p);
              fast(threads, inplace.p, inplace.p);
              ASSERT_TRUE(same_bits(out.p, out1.p, n)) << "threads=" << threads << " D=" << D;
              ASSERT_TRUE(same_bits(inplace.p, out1.p, n)) << "in place, D=" << D;
            }
            for (int64_t i = 0; i < n; ++i) {
              const int64_t j = i % D;
              if (j >= R) {
                ASSERT_EQ(out1[i], x[i]) << "pass-through dim j=" << j;
                continue;
              }
              // The table's cos and sin each carry one rounding (eps/2 relative), the products
              // and the sum one each, the reference one: with |c|, |s| <= 1 the error is below
              // 2.5 eps (|xa| + |xb|); we allow 3.
              const double mag = std::fabs(x[i]) + std::fabs(x[i - j + partner(j, R, layout)]);
              ASSERT_NEAR(out1[i], ref[i], 3 * kEpsF * mag)
                  << "D=" << D << " R=" << R << " i=" << i << " backward=" << backward;
            }
          }
        }
      }
    }
  });
}

// Applies rope (fast kernel, 2 threads) to one head x (D) at position pos.
std::vector<float> rope_one(const std::vector<float>& x, int64_t D, int32_t pos,
                            const ops::RopeTable& table, RopeLayout layout, bool backward = false) {
  std::vector<float> out(x.size());
  if (backward)
    cpu::rope_backward(pool(2), out.data(), x.data(), table, &pos, 0, 1, 1, 1, D, layout);
  else
    cpu::rope_forward(pool(2), out.data(), x.data(), table, &pos, 0, 1, 1, 1, D, layout);
  return out;
}

std::vector<float> randn(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  test::fill_normal(v.data(), n, seed);
  return v;
}

TEST(Rope, PreservesPairNormsAndPositionZeroIsIdentity) {
  const int64_t D = 70, R = 70;
  const auto table = ops::make_rope_table(2000, R, 500000.0);
  const auto x = randn(D, 410);
  for (RopeLayout layout : kLayouts) {
    // cos 0 = 1 and sin 0 = 0 exactly, so position 0 leaves every bit unchanged.
    const auto id = rope_one(x, D, 0, table, layout);
    EXPECT_TRUE(same_bits(id.data(), x.data(), D));
    for (int32_t pos : {1, 17, 1999}) {
      const auto y = rope_one(x, D, pos, table, layout);
      const auto back = rope_one(y, D, pos, table, layout, /*backward=*/true);
      for (int64_t j = 0; j < D; ++j) {
        const int64_t k = partner(j, R, layout);
        const double a = x[j], b = x[k], mag = std::fabs(a) + std::fabs(b);
        // Each output is within 2.5 eps (|xa| + |xb|) of the exact rotation (see above), and
        // the exact rotation keeps a^2 + b^2; squares of values <= mag move by <= 2 mag err.
        const double n_in = a * a + b * b, n_out = double{y[j]} * y[j] + double{y[k]} * y[k];
        ASSERT_NEAR(n_out, n_in, 2 * 2 * 2.5 * kEpsF * mag * mag) << "pos=" << pos << " j=" << j;
        // Backward is the inverse rotation: two rotations' errors.
        ASSERT_NEAR(back[j], x[j], 2 * 2.5 * kEpsF * mag * 1.01) << "pos=" << pos << " j=" << j;
      }
    }
  }
}

TEST(Rope, DotProductDependsOnlyOnRelativePosition) {
  const int64_t D = 64;
  const auto table = ops::make_rope_table(4096, D, kTheta);
  const auto q = randn(D, 420), k = randn(D, 421);
  for (RopeLayout layout : kLayouts) {
    auto dot_at = [&](int32_t m, int32_t n) {
      const auto qm = rope_one(q, D, m, table, layout), kn = rope_one(k, D, n, table, layout);
      double s = 0;
      for (int64_t j = 0; j < D; ++j) s += double{qm[j]} * kn[j];
      return s;
    };
    // Each rotated element errs by <= 2.5 eps (|a| + |b|) over its pair, so the dot (in double)
    // moves by <= 2.5 eps sum over pairs of 2 (|qa| + |qb|) (|ka| + |kb|), for each of the two
    // dots compared.
    double bound = 0;
    for (int64_t j = 0; j < D; ++j) {
      const int64_t p = partner(j, D, layout);
      bound +=
          2.5 * kEpsF * (std::fabs(q[j]) + std::fabs(q[p])) * (std::fabs(k[j]) + std::fabs(k[p]));
    }
    const double tol = 2 * bound;
    for (int32_t delta : {0, 3, -7, 250}) {
      const double d0 = dot_at(1000 + delta, 1000);
      for (int32_t n : {0, 11, 300, 3000}) {
        if (n + delta < 0) continue;
        ASSERT_NEAR(dot_at(n + delta, n), d0, tol) << "delta=" << delta << " n=" << n;
      }
    }
    // The property is not vacuous: other offsets give other dots.
    EXPECT_GT(std::fabs(dot_at(5, 0) - dot_at(0, 0)), 10 * tol);
  }
}

TEST(Rope, InterleavedIsHalfLayoutOnPermutedDims) {
  // GGUF's q/k permutation: interleaved element 2i is rotate-half element i, 2i+1 is i + R/2.
  // The reference rounds once from the same double values, so it agrees exactly.
  const int64_t B = 1, T = 3, H = 2, D = 12, R = 8, n = B * T * H * D;
  const auto table = ops::make_rope_table(T + 5, R, kTheta);
  const auto x = randn(n, 430);
  std::vector<float> xp = x, a(n), b(n);
  for (int64_t head = 0; head < B * T * H; ++head)
    for (int64_t i = 0; i < R / 2; ++i) {
      xp[head * D + i] = x[head * D + 2 * i];
      xp[head * D + i + R / 2] = x[head * D + 2 * i + 1];
    }
  cpu::ref::rope_forward(a.data(), x.data(), table, nullptr, 5, B, T, H, D,
                         RopeLayout::interleaved);
  cpu::ref::rope_forward(b.data(), xp.data(), table, nullptr, 5, B, T, H, D, RopeLayout::half);
  for (int64_t head = 0; head < B * T * H; ++head) {
    for (int64_t i = 0; i < R / 2; ++i) {
      ASSERT_EQ(a[head * D + 2 * i], b[head * D + i]);
      ASSERT_EQ(a[head * D + 2 * i + 1], b[head * D + i + R / 2]);
    }
    for (int64_t j = R; j < D; ++j) ASSERT_EQ(a[head * D + j], x[head * D + j]);
  }
}

TEST(GradCheck, Rope) {
  const int64_t B = 2, T = 3, H = 2, D = 10, R = 6, n = B * T * H * D;
  const auto table = ops::make_rope_table(20, R, kTheta);
  const int32_t positions[T] = {4, 0, 19};
  const auto x = randn(n, 440), r = randn(n, 441);
  Vec xd(x.begin(), x.end());
  for (RopeLayout layout : kLayouts) {
    // Objective f = sum(rope(x) * r) with the rotation in double.
    auto f = [&]() {
      double s = 0;
      for (int64_t head = 0; head < B * T * H; ++head) {
        const double pos = positions[(head / H) % T];
        for (int64_t j = 0; j < D; ++j) {
          const int64_t idx = head * D + j;
          if (j >= R) {
            s += xd[idx] * r[idx];
            continue;
          }
          const int64_t p = partner(j, R, layout);
          const bool first = layout == RopeLayout::half ? j < R / 2 : j % 2 == 0;
          const int64_t i = layout == RopeLayout::half ? std::min(j, p) : j / 2;
          const double a = pos * std::pow(kTheta, -2.0 * i / R);
          const double other = xd[head * D + p];
          const double y = first ? xd[idx] * std::cos(a) - other * std::sin(a)
                                 : xd[idx] * std::cos(a) + other * std::sin(a);
          s += y * r[idx];
        }
      }
      return s;
    };
    for (int variant = 0; variant < 2; ++variant) {
      std::vector<float> dx(n);
      if (variant == 0)
        cpu::rope_backward(pool(2), dx.data(), r.data(), table, positions, 0, B, T, H, D, layout);
      else
        cpu::ref::rope_backward(dx.data(), r.data(), table, positions, 0, B, T, H, D, layout);
      for (int64_t i = 0; i < n; ++i) {
        // dinp is dout rotated back: within 2.5 eps (|ra| + |rb|) <= 5 eps max|r| (< 6 here).
        ASSERT_NEAR(dx[i], central_diff(xd, i, f), 5 * kEpsF * 6 + kFdAllow)
            << "i=" << i << " variant=" << variant;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// SwiGLU

const RowShape kGluShapes[] = {{1, 1}, {3, 17}, {5, 63}, {7, 65}, {4, 769}, {3, 13339}};

// Gates with the regions that matter: 0, tiny, the silu' zero near -1.278, saturation and
// underflow of exp(-|g|) (|g| > 87 gives a subnormal or zero sigmoid tail).
void put_special_gates(float* g, int64_t n) {
  const float special[] = {0.0f,  -0.0f,  1e-4f, -1e-4f, -1.2785f, 5.0f,    -5.0f,
                           20.0f, -20.0f, 88.0f, -88.0f, 100.0f,   -100.0f, -1000.0f};
  for (int64_t i = 0; i < n && i < 14; ++i) g[i] = special[i];
}

// The kernel's forward and backward on 1, 2 and 3 threads: the 1-thread results into out1, dg1,
// du1, and the others bit-identical to them.
void glu_on_threads(GluAct act, int64_t N, int64_t F, int off, const Buf& g, const Buf& u,
                    const Buf& dy, std::vector<float>* out1, std::vector<float>* dg1,
                    std::vector<float>* du1) {
  const int64_t n = N * F;
  for (int threads = 1; threads <= 3; ++threads) {
    Buf out(n, off), dg(n, off), du(n, off);
    cpu::glu_forward(pool(threads), out.p, g.p, u.p, N, F, act);
    cpu::glu_backward(pool(threads), dg.p, du.p, dy.p, g.p, u.p, N, F, act);
    if (threads == 1) {
      out1->assign(out.p, out.p + n);
      dg1->assign(dg.p, dg.p + n);
      du1->assign(du.p, du.p + n);
    } else {
      ASSERT_TRUE(same_bits(out.p, out1->data(), n) && same_bits(dg.p, dg1->data(), n) &&
                  same_bits(du.p, du1->data(), n))
          << "N=" << N << " F=" << F << " threads=" << threads;
    }
  }
}

TEST(Swiglu, ForwardAndBackwardMatchReferenceAndThreadCount) {
  for_each_target([&] {
    for (const auto& [N, F] : kGluShapes) {
      const int64_t n = N * F;
      const int off = static_cast<int>((N + F) % 2);
      Buf g = normal_buf(n, off, 500 + F, 3.0f), u = normal_buf(n, off, 501 + F),
          dy = normal_buf(n, off, 502 + F);
      put_special_gates(g.p, n);
      Buf rout(n, off), rdg(n, off), rdu(n, off);
      cpu::ref::glu_forward(rout.p, g.p, u.p, N, F, GluAct::silu);
      cpu::ref::glu_backward(rdg.p, rdu.p, dy.p, g.p, u.p, N, F, GluAct::silu);
      std::vector<float> out1, dg1, du1;
      ASSERT_NO_FATAL_FAILURE(glu_on_threads(GluAct::silu, N, F, off, g, u, dy, &out1, &dg1, &du1));
      for (int64_t i = 0; i < n; ++i) {
        const double gi = g[i], s = 1 / (1 + std::exp(-gi)), sm = 1 / (1 + std::exp(gi));
        // exp(-|g|) is within 1 ulp, 1/(1 + e) adds two roundings and e/(1 + e) one more, so s
        // and 1 - s are within 3.5 eps relative; silu = g s and the product with up add one
        // rounding each, the reference one: 5 eps. Below FLT_MIN (g < -87) the sigmoid tail is
        // subnormal or flushed, so allow an absolute 4 FLT_MIN per unit of (1 + |g|) |factor|.
        const double floor_f = 4 * FLT_MIN * (1 + std::fabs(gi));
        ASSERT_NEAR(out1[i], rout[i], 6 * kEpsF * std::fabs(rout[i]) + floor_f * std::fabs(u[i]))
            << "g=" << gi << " N=" << N << " F=" << F;
        // silu'(g) = s (1 + g (1 - s)): both factors 3.5 eps, the inner sum two roundings on
        // terms of size 1 + |g| (1 - s) (it cancels near g = -1.278), then two products.
        const double dyu = std::fabs(double{dy[i]} * u[i]);
        ASSERT_NEAR(dg1[i], rdg[i], 10 * kEpsF * dyu * s * (1 + std::fabs(gi) * sm) + floor_f * dyu)
            << "g=" << gi << " N=" << N << " F=" << F;
        ASSERT_NEAR(du1[i], rdu[i], 6 * kEpsF * std::fabs(rdu[i]) + floor_f * std::fabs(dy[i]))
            << "g=" << gi << " N=" << N << " F=" << F;
      }
    }
  });
}

TEST(Swiglu, OutputsMayAliasInputs) {
  const int64_t N = 3, F = 37, n = N * F;
  const Buf g = normal_buf(n, 1, 510, 3.0f), u = normal_buf(n, 1, 511), dy = normal_buf(n, 1, 512);
  Buf out(n, 1), dg(n, 1), du(n, 1);
  cpu::glu_forward(pool(2), out.p, g.p, u.p, N, F, GluAct::silu);
  cpu::glu_backward(pool(2), dg.p, du.p, dy.p, g.p, u.p, N, F, GluAct::silu);
  Buf g2 = g;  // out aliases gate
  cpu::glu_forward(pool(2), g2.p, g2.p, u.p, N, F, GluAct::silu);
  EXPECT_TRUE(same_bits(g2.p, out.p, n));
  Buf dy2 = dy, u2 = u;  // dgate aliases dout, dup aliases up
  cpu::glu_backward(pool(2), dy2.p, u2.p, dy2.p, g.p, u2.p, N, F, GluAct::silu);
  EXPECT_TRUE(same_bits(dy2.p, dg.p, n));
  EXPECT_TRUE(same_bits(u2.p, du.p, n));
}

TEST(GradCheck, Swiglu) {
  const int64_t n = 203;
  const Buf g0 = normal_buf(n, 0, 520, 3.0f), u0 = normal_buf(n, 0, 521), r = normal_buf(n, 0, 522);
  Vec gd(g0.p, g0.p + n), ud(u0.p, u0.p + n);
  gd[0] = 0;
  gd[1] = -1.2785;
  gd[2] = 12;
  gd[3] = -12;
  std::vector<float> g(gd.begin(), gd.end());
  auto f = [&]() {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += gd[i] / (1 + std::exp(-gd[i])) * ud[i] * r[i];
    return s;
  };
  for (int variant = 0; variant < 2; ++variant) {
    std::vector<float> dg(n), du(n);
    if (variant == 0)
      cpu::glu_backward(pool(3), dg.data(), du.data(), r.p, g.data(), u0.p, 1, n, GluAct::silu);
    else
      cpu::ref::glu_backward(dg.data(), du.data(), r.p, g.data(), u0.p, 1, n, GluAct::silu);
    for (int64_t i = 0; i < n; ++i) {
      // |silu'| <= 1.1 and |silu(g)| <= |g|; the f32 results are within 10 eps relative of
      // their terms (see the reference test), so these bound the analytic side.
      const double dyu = std::fabs(double{r[i]} * u0[i]);
      ASSERT_NEAR(dg[i], central_diff(gd, i, f),
                  10 * kEpsF * dyu * (1 + std::fabs(gd[i])) + kFdAllow)
          << "g=" << gd[i] << " variant=" << variant;
      ASSERT_NEAR(du[i], central_diff(ud, i, f), 6 * kEpsF * std::fabs(r[i] * gd[i]) + kFdAllow)
          << "g=" << gd[i] << " variant=" << variant;
    }
  }
}

// GeGLU (Gemma): the SIMD kernel against the double reference on every target and thread count,
// and the reference against an independent double evaluation of gelu through tanh.
TEST(Geglu, ForwardAndBackwardMatchReferenceAndThreadCount) {
  for_each_target([&] {
    for (const auto& [N, F] : kGluShapes) {
      const int64_t n = N * F;
      const int off = static_cast<int>((N + F) % 2);
      Buf g = normal_buf(n, off, 530 + F, 3.0f), u = normal_buf(n, off, 531 + F),
          dy = normal_buf(n, off, 532 + F);
      put_special_gates(g.p, n);
      Buf rout(n, off), rdg(n, off), rdu(n, off);
      cpu::ref::glu_forward(rout.p, g.p, u.p, N, F, GluAct::gelu_tanh);
      cpu::ref::glu_backward(rdg.p, rdu.p, dy.p, g.p, u.p, N, F, GluAct::gelu_tanh);
      std::vector<float> out1, dg1, du1;
      ASSERT_NO_FATAL_FAILURE(
          glu_on_threads(GluAct::gelu_tanh, N, F, off, g, u, dy, &out1, &dg1, &du1));
      for (int64_t i = 0; i < n; ++i) {
        const double gi = g[i];
        const double t = std::tanh(0.79788456080286535588 * (gi + 0.044715 * gi * gi * gi));
        const double gelu = 0.5 * gi * (1 + t);
        // The reference, in double, is the tanh form up to rounding (where 1 + t has not
        // cancelled: the reference's sigmoid form is the accurate one below g = -5).
        if (gi > -5) {
          ASSERT_NEAR(rout[i], gelu * u[i], kEpsF * std::fabs(gelu * u[i]) + 1e-37) << "g=" << gi;
        }
        // The kernel's sigmoid(2u) costs an Exp (1 ulp), a divide and the cubic's roundings,
        // amplified where u is large by |du/dx| |x| <= 3 |u|: 12 eps (1 + |g|) relative. It caps
        // -2u at 80 (gelu-inl.h), so below g ~ -5.4 it returns x / (1 + e^80) instead of ~0:
        // an absolute 2e-35 (1 + g^2) besides.
        const double floor_f = 4 * FLT_MIN * (1 + std::fabs(gi)) + 2e-35 * (1 + gi * gi);
        ASSERT_NEAR(
            out1[i], rout[i],
            12 * kEpsF * (1 + std::fabs(gi)) * std::fabs(rout[i]) + floor_f * std::fabs(u[i]))
            << "g=" << gi << " N=" << N << " F=" << F;
        const double dyu = std::fabs(double{dy[i]} * u[i]);
        ASSERT_NEAR(dg1[i], rdg[i], 40 * kEpsF * (1 + gi * gi) * dyu + floor_f * dyu)
            << "g=" << gi << " N=" << N << " F=" << F;
        ASSERT_NEAR(
            du1[i], rdu[i],
            12 * kEpsF * (1 + std::fabs(gi)) * std::fabs(rdu[i]) + floor_f * std::fabs(dy[i]))
            << "g=" << gi << " N=" << N << " F=" << F;
      }
    }
  });
}

TEST(GradCheck, Geglu) {
  const int64_t n = 203;
  const Buf g0 = normal_buf(n, 0, 540, 3.0f), u0 = normal_buf(n, 0, 541), r = normal_buf(n, 0, 542);
  Vec gd(g0.p, g0.p + n), ud(u0.p, u0.p + n);
  gd[0] = 0;
  gd[1] = -0.75;  // near gelu's minimum, where gelu' = 0
  gd[2] = 12;
  gd[3] = -12;
  std::vector<float> g(gd.begin(), gd.end());
  auto f = [&]() {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double x = gd[i];
      s += 0.5 * x * (1 + std::tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x))) * ud[i] *
           r[i];
    }
    return s;
  };
  for (int variant = 0; variant < 2; ++variant) {
    std::vector<float> dg(n), du(n);
    if (variant == 0)
      cpu::glu_backward(pool(3), dg.data(), du.data(), r.p, g.data(), u0.p, 1, n,
                        GluAct::gelu_tanh);
    else
      cpu::ref::glu_backward(dg.data(), du.data(), r.p, g.data(), u0.p, 1, n, GluAct::gelu_tanh);
    for (int64_t i = 0; i < n; ++i) {
      const double dyu = std::fabs(double{r[i]} * u0[i]);
      ASSERT_NEAR(dg[i], central_diff(gd, i, f), 40 * kEpsF * dyu * (1 + gd[i] * gd[i]) + kFdAllow)
          << "g=" << gd[i] << " variant=" << variant;
      ASSERT_NEAR(du[i], central_diff(ud, i, f), 12 * kEpsF * std::fabs(r[i] * gd[i]) + kFdAllow)
          << "g=" << gd[i] << " variant=" << variant;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Argument errors name the parameter.

TEST(LlamaOps, BadArgumentsThrowNamingTheParameter) {
  float buf[64] = {};
  int32_t pos[2] = {0, 1};
  expect_error([] { ops::make_rope_table(8, 7, kTheta); }, "rotary_dim=7");
  expect_error([] { ops::make_rope_table(8, 0, kTheta); }, "rotary_dim=0");
  expect_error([] { ops::make_rope_table(8, 4, -1.0); }, "theta");
  expect_error([] { ops::make_rope_table(-1, 4, kTheta); }, "max_pos");
  const auto table = ops::make_rope_table(8, 8, kTheta);
  for (int variant = 0; variant < 2; ++variant) {
    auto rope = [&](const int32_t* p, int64_t pos0, int64_t T, int64_t D) {
      if (variant == 0)
        cpu::rope_forward(pool(1), buf, buf, table, p, pos0, 1, T, 1, D, RopeLayout::half);
      else
        cpu::ref::rope_backward(buf, buf, table, p, pos0, 1, T, 1, D, RopeLayout::interleaved);
    };
    expect_error([&] { rope(nullptr, 0, 1, 6); }, "rotary_dim=8 exceeds head dim D=6");
    expect_error([&] { rope(nullptr, 7, 2, 8); }, "pos0=7");
    pos[1] = 8;
    expect_error([&] { rope(pos, 0, 2, 8); }, "positions[1]=8");
    pos[1] = -1;
    expect_error([&] { rope(pos, 0, 2, 8); }, "positions[1]=-1");
    ops::RopeTable odd = table;
    odd.rotary_dim = 5;
    expect_error(
        [&] {
          cpu::rope_forward(pool(1), buf, buf, odd, nullptr, 0, 1, 1, 1, 8, RopeLayout::half);
        },
        "rotary_dim=5");
  }
  expect_error([&] { cpu::rmsnorm_forward(pool(1), buf, buf, buf, buf, 2, 0, 1e-6f); }, "C=0");
  expect_error([&] { cpu::ref::rmsnorm_forward(buf, buf, buf, buf, 2, -3, 1e-6f); }, "C=-3");
  expect_error([&] { cpu::rmsnorm_backward(pool(1), buf, buf, buf, buf, buf, buf, 2, 0); }, "C=0");
  expect_error([&] { cpu::rmsnorm_forward(pool(1), buf, buf, buf, buf, 2, 4, -1.0f); }, "eps");
  expect_error([&] { cpu::glu_forward(pool(1), buf, buf, buf, 2, 0, GluAct::silu); }, "F=0");
  expect_error([&] { cpu::glu_forward(pool(1), buf, buf, buf, 2, 0, GluAct::gelu_tanh); }, "F=0");
  expect_error([&] { cpu::ref::glu_backward(buf, buf, buf, buf, buf, -1, 4, GluAct::silu); },
               "N=-1");
}

}  // namespace
}  // namespace tessera
