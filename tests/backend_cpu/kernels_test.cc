// Highway elementwise, layernorm and embedding kernels vs their plain-loop references: odd
// sizes, misaligned pointers, 1..3 threads, tolerances derived from f32 rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/ref/ref_kernels.h"
#include "core/error.h"
#include "kernel_test_util.h"

namespace tessera {
namespace {

using test::Buf;
using test::kEpsF;
using test::normal_buf;
using test::pool;

const int64_t kSizes[] = {1, 3, 17, 63, 64, 65, 769, 4099};
constexpr double kSqrt2OverPi = 0.79788456080286535588;

TEST(Elementwise, AddAndScaleAreExact) {
  // One IEEE add or multiply per element: the SIMD result must equal the scalar one exactly.
  for (int threads = 1; threads <= 3; ++threads) {
    for (int64_t n : kSizes) {
      for (int off : {0, 1}) {
        Buf a = normal_buf(n, off, 1 + n), b = normal_buf(n, off, 2 + n);
        Buf out(n, off), ref(n, off);
        cpu::add(pool(threads), out.p, a.p, b.p, n);
        cpu::ref::add(ref.p, a.p, b.p, n);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], ref[i]) << "add n=" << n << " i=" << i;
        // In place (out aliases a).
        cpu::add(pool(threads), a.p, a.p, b.p, n);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(a[i], ref[i]) << "add alias n=" << n;
        Buf s = normal_buf(n, off, 3 + n), sref = s;
        cpu::scale(pool(threads), s.p, n, 0.37f);
        cpu::ref::scale(sref.p, n, 0.37f);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(s[i], sref[i]) << "scale n=" << n;
      }
    }
  }
  // Nothing outside [0, n) is touched.
  Buf x(5, 1);
  x.storage[0] = 42.0f;
  cpu::scale(pool(2), x.p, 4, 2.0f);
  EXPECT_EQ(x.storage[0], 42.0f);
  EXPECT_EQ(x[4], 0.0f);
}

TEST(Elementwise, SumSquaresMatchesReferenceAndThreadCount) {
  // Both sums add exact squares (24+24 bits fit in a double) of one sign; recursive summation
  // in any order has relative error below (n-1) * 2^-53, so two orders differ by < 2n * 2^-53.
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{17}, int64_t{769}, int64_t{100003}}) {
    Buf x = normal_buf(n, 1, 7 + n, 3.0f);
    const double ref = cpu::ref::sum_squares(x.p, n);
    const double one = cpu::sum_squares(pool(1), x.p, n);
    EXPECT_NEAR(one, ref, 2.0 * n * 0x1p-53 * ref) << "n=" << n;
    // Chunking depends only on n, so every thread count gives the same bits.
    for (int threads = 2; threads <= 3; ++threads)
      EXPECT_EQ(cpu::sum_squares(pool(threads), x.p, n), one) << "n=" << n;
  }
}

// Bound on |fast - ref| for gelu: u = sqrt(2/pi)(x + 0.044715 x^3) carries ~3 roundings, and
// the factor 1/(1 + exp(-2u)) has relative sensitivity 2|u| to u, so its relative error is at
// most ~(6|u| + 6) eps (Exp is 1 ulp); we allow (8|u| + 8) eps. The kernel caps -2u at 80,
// which changes results only below |x| exp(-80) < 2e-35 |x| (absolute floor).
double gelu_u(double x) {
  return kSqrt2OverPi * (x + 0.044715 * x * x * x);
}

std::vector<float> gelu_inputs(int64_t n, int off, uint64_t seed) {
  Buf x = normal_buf(n, off, seed, 3.0f);
  const float special[] = {0.0f, -0.0f, 1e-4f, -1e-4f, 5.0f, -5.0f, 10.0f, -10.0f, 30.0f, -30.0f};
  for (int64_t i = 0; i < n && i < 10; ++i) x[i] = special[i];
  return std::vector<float>(x.p, x.p + n);
}

TEST(Elementwise, GeluForwardMatchesReference) {
  for (int threads = 1; threads <= 3; ++threads) {
    for (int64_t n : kSizes) {
      for (int off : {0, 1}) {
        const std::vector<float> xs = gelu_inputs(n, off, 11 + n);
        Buf x(n, off), out(n, off), ref(n, off);
        std::copy(xs.begin(), xs.end(), x.p);
        cpu::gelu_forward(pool(threads), out.p, x.p, n);
        cpu::ref::gelu_forward(ref.p, x.p, n);
        for (int64_t i = 0; i < n; ++i) {
          const double u = std::fabs(gelu_u(x[i]));
          const double tol = (8 * u + 8) * kEpsF * std::fabs(ref[i]) + 2e-35 * std::fabs(x[i]);
          ASSERT_NEAR(out[i], ref[i], tol) << "x=" << x[i] << " n=" << n << " threads=" << threads;
        }
      }
    }
  }
}

TEST(Elementwise, GeluBackwardMatchesReferenceAndMayAlias) {
  for (int threads = 1; threads <= 3; ++threads) {
    for (int64_t n : kSizes) {
      for (int off : {0, 1}) {
        const std::vector<float> xs = gelu_inputs(n, off, 13 + n);
        Buf x(n, off), dout = normal_buf(n, off, 17 + n), din(n, off), ref(n, off);
        std::copy(xs.begin(), xs.end(), x.p);
        cpu::gelu_backward(pool(threads), din.p, x.p, dout.p, n);
        cpu::ref::gelu_backward(ref.p, x.p, dout.p, n);
        for (int64_t i = 0; i < n; ++i) {
          // gelu' = s + x s (1-s) 2u'; each term has the forward's relative error plus a few
          // roundings, so the bound scales with the sum of the two terms' magnitudes.
          const double xi = x[i], u = gelu_u(xi);
          const double s = 1.0 / (1.0 + std::exp(-2.0 * u));
          const double du = kSqrt2OverPi * (1.0 + 3.0 * 0.044715 * xi * xi);
          const double mag = s + std::fabs(xi * s * (1.0 - s) * 2.0 * du);
          // The cap on -2u overstates s by at most exp(-80) < 2e-35, scaled by (1 + 2|x|u').
          const double cap = 2e-35 * (1 + 2 * std::fabs(xi) * du);
          const double tol = ((8 * std::fabs(u) + 12) * kEpsF * mag + cap) * std::fabs(dout[i]);
          ASSERT_NEAR(din[i], ref[i], tol) << "x=" << xi << " n=" << n;
        }
        // dinp aliasing dout gives the same values.
        cpu::gelu_backward(pool(threads), dout.p, x.p, dout.p, n);
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(dout[i], din[i]) << "alias n=" << n;
      }
    }
  }
}

struct LnShape {
  int64_t N, C;
};
const LnShape kLnShapes[] = {{1, 1}, {3, 17}, {17, 3}, {5, 63}, {7, 65}, {64, 769}, {300, 64}};

TEST(LayerNorm, ForwardMatchesReference) {
  for (int threads = 1; threads <= 3; ++threads) {
    for (const auto& s : kLnShapes) {
      const int64_t N = s.N, C = s.C, off = (N + C) % 2;
      // A mean offset of 2 makes the mean subtraction matter.
      Buf x = normal_buf(N * C, off, 100 + C, 1.5f), w = normal_buf(C, off, 101),
          b = normal_buf(C, off, 102);
      for (int64_t i = 0; i < N * C; ++i) x[i] += 2.0f;
      Buf out(N * C, off), mean(N, off), rstd(N, off), rout(N * C, off), rmean(N, off),
          rrstd(N, off);
      cpu::layernorm_forward(pool(threads), out.p, mean.p, rstd.p, x.p, w.p, b.p, N, C);
      cpu::ref::layernorm_forward(rout.p, rmean.p, rrstd.p, x.p, w.p, b.p, N, C);
      // f32 sums of C terms in any grouping err by at most g = (C + 4) eps relative to the sum
      // of magnitudes: the mean by g * mean|x|, the variance (and rstd) by ~g relatively.
      const double g = (C + 4) * kEpsF;
      for (int64_t n = 0; n < N; ++n) {
        double abs_mean = 0;
        for (int64_t c = 0; c < C; ++c) abs_mean += std::fabs(x[n * C + c]) / C;
        ASSERT_NEAR(mean[n], rmean[n], g * abs_mean + kEpsF * std::fabs(rmean[n])) << "n=" << n;
        ASSERT_NEAR(rstd[n], rrstd[n], (g + 4 * kEpsF) * rrstd[n]) << "n=" << n;
        for (int64_t c = 0; c < C; ++c) {
          const int64_t i = n * C + c;
          const double xhat = (x[i] - rmean[n]) * rrstd[n];
          // out = xhat w + b: xhat inherits rstd's relative error and the mean's error * rstd.
          const double tol = std::fabs(w[c]) * (std::fabs(xhat) * (g + 4 * kEpsF) +
                                                (g * abs_mean + kEpsF) * rrstd[n]) +
                             2 * kEpsF * (std::fabs(rout[i]) + std::fabs(b[c]));
          ASSERT_NEAR(out[i], rout[i], tol) << "N=" << N << " C=" << C << " n=" << n << " c=" << c;
        }
      }
    }
  }
}

TEST(LayerNorm, BackwardMatchesReferenceAndAccumulates) {
  for (int threads = 1; threads <= 3; ++threads) {
    for (const auto& s : kLnShapes) {
      const int64_t N = s.N, C = s.C, off = (N + C + 1) % 2;
      Buf x = normal_buf(N * C, off, 200 + C), w = normal_buf(C, off, 201),
          b = normal_buf(C, off, 202);
      Buf dout = normal_buf(N * C, off, 203 + N), out(N * C, off), mean(N, off), rstd(N, off);
      cpu::ref::layernorm_forward(out.p, mean.p, rstd.p, x.p, w.p, b.p, N, C);
      // Start from non-zero gradients: backward accumulates.
      Buf dx = normal_buf(N * C, off, 204), dw = normal_buf(C, off, 205),
          db = normal_buf(C, off, 206);
      Buf rdx = dx, rdw = dw, rdb = db;
      cpu::layernorm_backward(pool(threads), dx.p, dw.p, db.p, dout.p, x.p, w.p, mean.p, rstd.p, N,
                              C);
      cpu::ref::layernorm_backward(rdx.p, rdw.p, rdb.p, dout.p, x.p, w.p, mean.p, rstd.p, N, C);
      const double g = (C + 4) * kEpsF, gn = (N + 4) * kEpsF;
      for (int64_t n = 0; n < N; ++n) {
        // dinp = rstd (gc - mean(g) - xhat mean(g xhat)): the two means are f32 sums (error g
        // times the mean of magnitudes), every other step a few roundings.
        double mg = 0, mgx = 0;
        for (int64_t c = 0; c < C; ++c) {
          const double gc = static_cast<double>(dout[n * C + c]) * w[c];
          const double xhat = (x[n * C + c] - mean[n]) * static_cast<double>(rstd[n]);
          mg += std::fabs(gc) / C;
          mgx += std::fabs(gc * xhat) / C;
        }
        for (int64_t c = 0; c < C; ++c) {
          const int64_t i = n * C + c;
          const double xhat = (x[i] - mean[n]) * static_cast<double>(rstd[n]);
          const double gc = std::fabs(static_cast<double>(dout[i]) * w[c]);
          const double tol = rstd[n] * (g + 6 * kEpsF) * (gc + mg + std::fabs(xhat) * mgx) +
                             2 * kEpsF * std::fabs(rdx[i]) + kEpsF * std::fabs(dx.storage[0]);
          ASSERT_NEAR(dx[i], rdx[i], tol) << "N=" << N << " C=" << C << " n=" << n << " c=" << c;
        }
      }
      for (int64_t c = 0; c < C; ++c) {
        // dw, db: f32 sums over N rows (error (N + 4) eps times the sum of magnitudes).
        double sw = 0, sb = 0;
        for (int64_t n = 0; n < N; ++n) {
          const double xhat = (x[n * C + c] - mean[n]) * static_cast<double>(rstd[n]);
          sw += std::fabs(dout[n * C + c] * xhat);
          sb += std::fabs(dout[n * C + c]);
        }
        ASSERT_NEAR(dw[c], rdw[c], gn * sw + 2 * kEpsF * std::fabs(rdw[c])) << "c=" << c;
        ASSERT_NEAR(db[c], rdb[c], gn * sb + 2 * kEpsF * std::fabs(rdb[c])) << "c=" << c;
      }
    }
  }
}

TEST(LayerNorm, ResultsIdenticalForAnyThreadCount) {
  // Row chunks and column blocks depend only on (N, C): 1, 2 and 3 threads agree bit for bit.
  const int64_t N = 97, C = 769;
  Buf x = normal_buf(N * C, 1, 300), w = normal_buf(C, 1, 301), b = normal_buf(C, 1, 302);
  Buf dout = normal_buf(N * C, 1, 303);
  std::vector<std::vector<float>> results;
  for (int threads = 1; threads <= 3; ++threads) {
    Buf out(N * C, 0), mean(N, 0), rstd(N, 0), dx(N * C, 0), dw(C, 0), db(C, 0);
    cpu::layernorm_forward(pool(threads), out.p, mean.p, rstd.p, x.p, w.p, b.p, N, C);
    cpu::layernorm_backward(pool(threads), dx.p, dw.p, db.p, dout.p, x.p, w.p, mean.p, rstd.p, N,
                            C);
    std::vector<float> all(out.p, out.p + N * C);
    all.insert(all.end(), dx.p, dx.p + N * C);
    all.insert(all.end(), dw.p, dw.p + C);
    all.insert(all.end(), db.p, db.p + C);
    results.push_back(all);
  }
  EXPECT_EQ(0, std::memcmp(results[0].data(), results[1].data(), results[0].size() * 4));
  EXPECT_EQ(0, std::memcmp(results[0].data(), results[2].data(), results[0].size() * 4));
}

TEST(Embedding, ForwardAndBackwardMatchReferenceExactly) {
  // Forward is one add per element; backward adds rows in token order in both kernels, so
  // every value must match bit for bit (repeated tokens included).
  struct S {
    int64_t B, T, C, V;
  };
  for (int threads = 1; threads <= 3; ++threads) {
    for (const S s :
         {S{1, 1, 1, 1}, S{2, 3, 17, 5}, S{3, 7, 63, 4}, S{4, 33, 65, 9}, S{2, 64, 769, 50}}) {
      const int64_t N = s.B * s.T, off = s.C % 2;
      Rng rng(400 + s.C);
      std::vector<int32_t> tokens(static_cast<size_t>(N));
      for (auto& t : tokens) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(s.V)));
      Buf wte = normal_buf(s.V * s.C, off, 401), wpe = normal_buf(s.T * s.C, off, 402);
      Buf out(N * s.C, off), rout(N * s.C, off);
      cpu::embedding_forward(pool(threads), out.p, tokens.data(), wte.p, wpe.p, s.B, s.T, s.C, s.V);
      cpu::ref::embedding_forward(rout.p, tokens.data(), wte.p, wpe.p, s.B, s.T, s.C, s.V);
      ASSERT_EQ(0, std::memcmp(out.p, rout.p, static_cast<size_t>(N * s.C) * 4)) << "C=" << s.C;
      Buf dout = normal_buf(N * s.C, off, 403);
      Buf dwte = normal_buf(s.V * s.C, off, 404), dwpe = normal_buf(s.T * s.C, off, 405);
      std::vector<float> rdwte(dwte.p, dwte.p + s.V * s.C), rdwpe(dwpe.p, dwpe.p + s.T * s.C);
      cpu::embedding_backward(pool(threads), dwte.p, dwpe.p, dout.p, tokens.data(), s.B, s.T, s.C,
                              s.V);
      cpu::ref::embedding_backward(rdwte.data(), rdwpe.data(), dout.p, tokens.data(), s.B, s.T, s.C,
                                   s.V);
      ASSERT_EQ(0, std::memcmp(dwte.p, rdwte.data(), rdwte.size() * 4)) << "C=" << s.C;
      ASSERT_EQ(0, std::memcmp(dwpe.p, rdwpe.data(), rdwpe.size() * 4)) << "C=" << s.C;
      // Without a position table (Llama): the token rows alone, and no position gradient.
      cpu::embedding_forward(pool(threads), out.p, tokens.data(), wte.p, nullptr, s.B, s.T, s.C,
                             s.V);
      for (int64_t n = 0; n < N; ++n)
        ASSERT_EQ(0, std::memcmp(out.p + n * s.C, wte.p + tokens[static_cast<size_t>(n)] * s.C,
                                 static_cast<size_t>(s.C) * 4))
            << n;
      cpu::ref::embedding_forward(rout.p, tokens.data(), wte.p, nullptr, s.B, s.T, s.C, s.V);
      ASSERT_EQ(0, std::memcmp(out.p, rout.p, static_cast<size_t>(N * s.C) * 4));
      cpu::embedding_backward(pool(threads), dwte.p, nullptr, dout.p, tokens.data(), s.B, s.T, s.C,
                              s.V);
      cpu::ref::embedding_backward(rdwte.data(), nullptr, dout.p, tokens.data(), s.B, s.T, s.C,
                                   s.V);
      ASSERT_EQ(0, std::memcmp(dwte.p, rdwte.data(), rdwte.size() * 4)) << "C=" << s.C;
    }
  }
}

TEST(Embedding, TokenOutsideTheVocabularyThrows) {
  // wte has V = 2 rows; -3 and 2 both lie outside, and neither may be read or written.
  for (const int32_t bad : {-3, 2}) {
    std::vector<int32_t> tokens = {0, bad};
    std::vector<float> wte(4, 1.0f), wpe(4, 1.0f), out(4), dwte(4, 0.0f), dwpe(4, 0.0f);
    EXPECT_THROW(cpu::embedding_forward(pool(2), out.data(), tokens.data(), wte.data(), wpe.data(),
                                        1, 2, 2, 2),
                 Error)
        << bad;
    EXPECT_THROW(
        cpu::ref::embedding_forward(out.data(), tokens.data(), wte.data(), wpe.data(), 1, 2, 2, 2),
        Error)
        << bad;
    EXPECT_THROW(cpu::embedding_backward(pool(2), dwte.data(), dwpe.data(), out.data(),
                                         tokens.data(), 1, 2, 2, 2),
                 Error)
        << bad;
    EXPECT_THROW(cpu::ref::embedding_backward(dwte.data(), dwpe.data(), out.data(), tokens.data(),
                                              1, 2, 2, 2),
                 Error)
        << bad;
    // Validation happens before any update.
    for (float v : dwte) EXPECT_EQ(v, 0.0f);
    for (float v : dwpe) EXPECT_EQ(v, 0.0f);
  }
}

TEST(Shapes, BadShapesThrow) {
  std::vector<float> buf(16, 0.0f);
  std::vector<int32_t> tokens(4, 0);
  float* f = buf.data();
  EXPECT_THROW(cpu::layernorm_forward(pool(2), f, f, f, f, f, f, 2, 0), Error);
  EXPECT_THROW(cpu::ref::layernorm_forward(f, f, f, f, f, f, -1, 4), Error);
  EXPECT_THROW(cpu::layernorm_backward(pool(2), f, f, f, f, f, f, f, f, -2, 4), Error);
  EXPECT_THROW(cpu::ref::layernorm_backward(f, f, f, f, f, f, f, f, 2, 0), Error);
  EXPECT_THROW(cpu::embedding_forward(pool(2), f, tokens.data(), f, f, 1, 2, 0, 4), Error);
  EXPECT_THROW(cpu::ref::embedding_backward(f, f, f, tokens.data(), -1, 2, 2, 4), Error);
}

}  // namespace
}  // namespace tessera
