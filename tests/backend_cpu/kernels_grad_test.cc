// Backward kernels (Highway and reference) vs central finite differences of double-precision
// forwards, for the objective f = sum(forward(x) * r) with random r.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/ref/ref_kernels.h"
#include "kernel_test_util.h"

namespace tessera {
namespace {

using test::kEpsF;
using test::pool;
using Vec = std::vector<double>;

std::vector<float> randn(int64_t n, uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  test::fill_normal(v.data(), n, seed, scale);
  return v;
}
Vec to_d(const std::vector<float>& v) {
  return Vec(v.begin(), v.end());
}

// Central difference of f at x along coordinate i. With h = 1e-5 (scaled by |x_i|) the
// truncation error h^2 |f'''| / 6 is ~1e-10 for these O(1) objectives and the rounding error
// ~1e-16 |f| / h ~ 1e-10, so the FD value is good to ~1e-9: far below the f32 analytic errors.
double central_diff(Vec& x, size_t i, const std::function<double(const Vec&)>& f) {
  const double x0 = x[i], h = 1e-5 * std::max(1.0, std::fabs(x0));
  x[i] = x0 + h;
  const double fp = f(x);
  x[i] = x0 - h;
  const double fm = f(x);
  x[i] = x0;
  return (fp - fm) / (2 * h);
}
constexpr double kFdAllow = 1e-8;

// Double-precision layernorm objective sum(out * r); out (N,C).
double ln_objective(const Vec& x, const Vec& w, const Vec& b, const Vec& r, int64_t N, int64_t C) {
  double f = 0;
  for (int64_t n = 0; n < N; ++n) {
    double m = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) m += x[n * C + c] / C;
    for (int64_t c = 0; c < C; ++c) var += (x[n * C + c] - m) * (x[n * C + c] - m) / C;
    const double s = 1 / std::sqrt(var + 1e-5);
    for (int64_t c = 0; c < C; ++c) f += ((x[n * C + c] - m) * s * w[c] + b[c]) * r[n * C + c];
  }
  return f;
}

TEST(GradCheck, LayerNorm) {
  for (const auto& [N, C] : {std::pair<int64_t, int64_t>{3, 17}, {2, 65}, {4, 1}}) {
    const auto x = randn(N * C, 10 + C), w = randn(C, 11), b = randn(C, 12), r = randn(N * C, 13);
    Vec xd = to_d(x), wd = to_d(w), bd = to_d(b);
    const Vec rd = to_d(r);
    for (int variant = 0; variant < 2; ++variant) {
      std::vector<float> out(N * C), mean(N), rstd(N), dx(N * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
      if (variant == 0) {
        cpu::layernorm_forward(pool(2), out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                               b.data(), N, C);
        cpu::layernorm_backward(pool(2), dx.data(), dw.data(), db.data(), r.data(), x.data(),
                                w.data(), mean.data(), rstd.data(), N, C);
      } else {
        cpu::ref::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                    b.data(), N, C);
        cpu::ref::layernorm_backward(dx.data(), dw.data(), db.data(), r.data(), x.data(), w.data(),
                                     mean.data(), rstd.data(), N, C);
      }
      // dinp = rstd (g - mean(g) - xhat mean(g xhat)), g = r w: f32 sums over C (and rstd from
      // an f32 forward) give relative errors ~(C + 16) eps on terms of size rstd |g|max (2 +
      // |xhat|max). dw, db: f32 sums over N rows of |r xhat| and |r|, plus xhat's own error.
      double rstd_max = 0, g_max = 0, xhat_max = 0;
      for (int64_t n = 0; n < N; ++n) rstd_max = std::max(rstd_max, double{rstd[n]});
      for (int64_t i = 0; i < N * C; ++i) {
        g_max = std::max(g_max, std::fabs(double{r[i]} * w[i % C]));
        xhat_max = std::max(xhat_max, std::fabs((x[i] - mean[i / C]) * double{rstd[i / C]}));
      }
      const double tol_x = (C + 16) * kEpsF * rstd_max * g_max * (2 + xhat_max) + kFdAllow;
      auto f = [&](const Vec&) { return ln_objective(xd, wd, bd, rd, N, C); };
      for (int64_t i = 0; i < N * C; ++i)
        ASSERT_NEAR(dx[i], central_diff(xd, i, f), tol_x)
            << "dinp N=" << N << " C=" << C << " i=" << i;
      for (int64_t c = 0; c < C; ++c) {
        double sw = 0, sb = 0;
        for (int64_t n = 0; n < N; ++n) {
          sw += std::fabs(r[n * C + c]) * xhat_max;
          sb += std::fabs(r[n * C + c]);
        }
        ASSERT_NEAR(dw[c], central_diff(wd, c, f), (N + C + 16) * kEpsF * sw + kFdAllow)
            << "dw c=" << c;
        ASSERT_NEAR(db[c], central_diff(bd, c, f), (N + 4) * kEpsF * sb + kFdAllow) << "db c=" << c;
      }
    }
  }
}

TEST(GradCheck, Gelu) {
  const int64_t n = 203;
  auto x = randn(n, 20, 2.5f);
  x[0] = 0.0f;
  x[1] = -6.0f;
  x[2] = 6.0f;
  const auto r = randn(n, 21);
  Vec xd = to_d(x);
  auto f = [&](const Vec& v) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double u = 0.7978845608028654 * (v[i] + 0.044715 * v[i] * v[i] * v[i]);
      s += 0.5 * v[i] * (1 + std::tanh(u)) * r[i];
    }
    return s;
  };
  for (int variant = 0; variant < 2; ++variant) {
    std::vector<float> dx(n);
    if (variant == 0)
      cpu::gelu_backward(pool(3), dx.data(), x.data(), r.data(), n);
    else
      cpu::ref::gelu_backward(dx.data(), x.data(), r.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      // |gelu'| <= 1.13 and its f32 evaluation errs by ~(8|u| + 12) eps relative (|u| <= 10
      // here), so 150 eps |r| bounds the analytic side.
      ASSERT_NEAR(dx[i], central_diff(xd, i, f), 150 * kEpsF * std::fabs(r[i]) + kFdAllow)
          << "x=" << x[i] << " variant=" << variant;
    }
  }
}

TEST(GradCheck, Embedding) {
  const int64_t B = 2, T = 3, C = 5, V = 4;
  const std::vector<int32_t> tokens = {1, 3, 1, 0, 1, 2};  // token 1 repeats
  const auto wte = randn(V * C, 30), wpe = randn(T * C, 31), r = randn(B * T * C, 32);
  Vec wted = to_d(wte), wped = to_d(wpe);
  auto f = [&](const Vec&) {
    double s = 0;
    for (int64_t n = 0; n < B * T; ++n)
      for (int64_t c = 0; c < C; ++c)
        s += (wted[tokens[n] * C + c] + wped[(n % T) * C + c]) * r[n * C + c];
    return s;
  };
  for (int variant = 0; variant < 2; ++variant) {
    std::vector<float> dwte(V * C, 0.0f), dwpe(T * C, 0.0f);
    if (variant == 0)
      cpu::embedding_backward(pool(2), dwte.data(), dwpe.data(), r.data(), tokens.data(), B, T, C,
                              V);
    else
      cpu::ref::embedding_backward(dwte.data(), dwpe.data(), r.data(), tokens.data(), B, T, C, V);
    // The objective is linear: the FD is exact up to ~1e-10, and the analytic value is an f32
    // sum of at most B*T terms of size <= max|r| (< 6 here): (B*T + 1) eps * 6 bounds it.
    const double tol = (B * T + 1) * kEpsF * 6 + kFdAllow;
    for (int64_t i = 0; i < V * C; ++i)
      ASSERT_NEAR(dwte[i], central_diff(wted, i, f), tol) << "dwte i=" << i;
    for (int64_t i = 0; i < T * C; ++i)
      ASSERT_NEAR(dwpe[i], central_diff(wped, i, f), tol) << "dwpe i=" << i;
  }
}

TEST(GradCheck, SoftmaxXent) {
  const int64_t N = 4, V = 37, Vp = 40;
  const float scale = 0.7f;
  const auto x = randn(N * Vp, 40, 3.0f);
  const std::vector<int32_t> targets = {5, -1, 36, 0};
  Vec xd = to_d(x);
  // Objective: scale * sum of losses; loss = logsumexp(x[0:V]) - x[target].
  auto f = [&](const Vec& v) {
    double s = 0;
    for (int64_t n = 0; n < N; ++n) {
      if (targets[n] < 0) continue;
      const double* row = v.data() + n * Vp;
      const double mx = *std::max_element(row, row + V);
      double z = 0;
      for (int64_t j = 0; j < V; ++j) z += std::exp(row[j] - mx);
      s += std::log(z) + mx - row[targets[n]];
    }
    return scale * s;
  };
  for (int variant = 0; variant < 2; ++variant) {
    std::vector<float> g = x, loss(N);
    if (variant == 0)
      cpu::softmax_xent(pool(2), loss.data(), g.data(), targets.data(), N, V, Vp, scale);
    else
      cpu::ref::softmax_xent(loss.data(), g.data(), targets.data(), N, V, Vp, scale);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t j = 0; j < Vp; ++j) {
        const int64_t i = n * Vp + j;
        if (j >= V) {
          ASSERT_EQ(g[i], 0.0f);  // padded columns: no gradient, exact zeros
          continue;
        }
        // |grad| <= scale; p's f32 error is below (spread + 280) eps relative with spread
        // = max|x - max| < 30 here, plus one rounding for the one-hot subtraction.
        ASSERT_NEAR(g[i], central_diff(xd, i, f), scale * 320 * kEpsF + kFdAllow)
            << "n=" << n << " j=" << j << " variant=" << variant;
      }
    }
  }
}

}  // namespace
}  // namespace tessera
