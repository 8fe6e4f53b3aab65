// Tests for causal self-attention (grouped key/value heads and sliding windows included):
// reference and tiled kernels against a double-precision naive attention, against each other,
// against finite differences, and for causality, windows and determinism.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/cpu/attention_bf16.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/ref/ref_kernels.h"
#include "core/error.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "hwy/targets.h"

namespace tessera::cpu {
namespace {

constexpr double kU = FLT_EPSILON / 2;  // f32 unit roundoff
constexpr double kUb = 1.0 / 512;       // bf16 unit roundoff, 2^-9

// Hkv 0 means H (one key/value head per query head, GPT-2). W: the sliding window (0: none).
struct AttnShape {
  int64_t B, T, H, D, Hkv = 0, W = 0;
  ops::AttentionArgs args(bool bf16 = false) const { return {B, T, C(), H, kv(), W, bf16}; }
  int64_t first_key(int64_t i) const { return W > 0 ? std::max<int64_t>(0, i + 1 - W) : 0; }
  int64_t C() const { return H * D; }
  int64_t kv() const { return Hkv ? Hkv : H; }
  int64_t KV() const { return kv() * D; }        // width of k (and of v) in a row
  int64_t ld() const { return C() + 2 * KV(); }  // row of qkv: q | k | v
  int64_t group() const { return H / kv(); }
};

// A float buffer whose data() starts `offset` floats past a 64-byte boundary, so kernels see
// misaligned pointers when offset % 16 != 0.
class Buf {
 public:
  Buf(size_t n, size_t offset) : mem_(n + offset + 16), n_(n) {
    auto addr = reinterpret_cast<uintptr_t>(mem_.data());
    const size_t skip = ((64 - addr % 64) % 64) / sizeof(float);
    p_ = mem_.data() + skip + offset;
  }
  float* data() { return p_; }
  const float* data() const { return p_; }
  size_t size() const { return n_; }
  float& operator[](size_t i) { return p_[i]; }
  float operator[](size_t i) const { return p_[i]; }

 private:
  std::vector<float> mem_;
  size_t n_;
  float* p_;
};

void fill_uniform(Buf& b, Rng& rng) {
  for (size_t i = 0; i < b.size(); ++i) b[i] = 2.0f * rng.uniform() - 1.0f;
}

double max_abs(const Buf& b, size_t begin, size_t stride, size_t width) {
  double m = 0;
  for (size_t r = begin; r < b.size(); r += stride)
    for (size_t d = 0; d < width; ++d) m = std::max(m, std::fabs(static_cast<double>(b[r + d])));
  return m;
}

// Double-precision naive attention on the float inputs (exact up to double rounding). Also
// collects what the error bounds need: the largest scaled |q|.|k| sum and, per (b,h,j), the
// column sum of the probabilities P_ij over queries i.
struct Exact {
  std::vector<double> out, lse, colsum;
  double s_abs = 0;  // max over (i, j) of scale * sum_d |q_id k_jd|
};

Exact naive_forward(const std::vector<double>& qkv, const AttnShape& s) {
  const int64_t C = s.C(), D = s.D, T = s.T;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Exact e;
  e.out.assign(static_cast<size_t>(s.B * T * C), 0.0);
  e.lse.assign(static_cast<size_t>(s.B * s.H * T), 0.0);
  e.colsum.assign(e.lse.size(), 0.0);
  std::vector<double> p(static_cast<size_t>(T));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        const double* q = &qkv[static_cast<size_t>((b * T + i) * s.ld() + h * D)];
        const int64_t k_col = C + h / s.group() * D, v_col = k_col + s.KV();
        const int64_t j_lo = s.first_key(i);
        double m = -INFINITY;
        for (int64_t j = j_lo; j <= i; ++j) {
          const double* k = &qkv[static_cast<size_t>((b * T + j) * s.ld() + k_col)];
          double dot = 0, abs_dot = 0;
          for (int64_t d = 0; d < D; ++d) {
            dot += q[d] * k[d];
            abs_dot += std::fabs(q[d] * k[d]);
          }
          p[j] = dot * scale;
          m = std::max(m, p[j]);
          e.s_abs = std::max(e.s_abs, abs_dot * scale);
        }
        double sum = 0;
        for (int64_t j = j_lo; j <= i; ++j) sum += std::exp(p[j] - m);
        const size_t row = static_cast<size_t>((b * s.H + h) * T);
        e.lse[row + i] = m + std::log(sum);
        for (int64_t j = j_lo; j <= i; ++j) {
          const double pj = std::exp(p[j] - m) / sum;
          e.colsum[row + j] += pj;
          const double* v = &qkv[static_cast<size_t>((b * T + j) * s.ld() + v_col)];
          for (int64_t d = 0; d < D; ++d)
            e.out[static_cast<size_t>((b * T + i) * C + h * D + d)] += pj * v[d];
        }
      }
  return e;
}

std::vector<double> to_double(const Buf& b) {
  return std::vector<double>(b.data(), b.data() + b.size());
}

// Worst-case f32 error bounds of the kernels (first-order, unit roundoff u):
// - a score is a D-term dot product: |ds| <= D u s_abs;
// - a probability p = exp(s - lse) (or its online-softmax form) then carries a relative error
//   E <= 3 D u s_abs (the score, the running max or lse, and lse's own rounding) plus
//   (2T + D + 16) u for the T-term sums behind lse and the exp/log/divide roundings;
// - out is a convex combination of v rows, so its error is <= vmax (E + (T + 2) u) (the
//   weights' error, then a T-term accumulation);
// - backward: dS_ij = P_ij (dP_ij - D_i) with |dP_ij - D_i| <= M = 2 D domax vmax, each term
//   wrong by at most P_ij M (2E + (D + 4) u); dq_i sums over j with sum_j P_ij = 1, dk_j and dv_j
//   sum over i, weighted by the column sum of P; each sum adds (T + 2) u.
struct Bounds {
  double E, out, lse_abs, dq, dk_per_col, dv_per_col;
};

// ub: the unit roundoff of what the products' operands are rounded to first (0: f32 operands;
// kUb for the bf16 products). It widens the bounds by the operands' rounding: q (scaled)
// and k in the scores (|ds| <= 2 ub s_abs), P before P V and P^T dO, v and dO, dS before dS K and
// dS^T Q (ub each, relative).
Bounds bounds(const AttnShape& s, const Exact& e, const Buf& qkv, const Buf& dout, double ub = 0) {
  const size_t C = static_cast<size_t>(s.C()), KV = static_cast<size_t>(s.KV());
  const size_t ld = static_cast<size_t>(s.ld());
  const double T = static_cast<double>(s.T), D = static_cast<double>(s.D);
  const double scale = 1.0 / std::sqrt(D);
  const double qmax = max_abs(qkv, 0, ld, C), kmax = max_abs(qkv, C, ld, KV);
  const double vmax = max_abs(qkv, C + KV, ld, KV), domax = max_abs(dout, 0, C, C);
  Bounds b;
  b.E = 3 * D * kU * e.s_abs + (2 * T + D + 16) * kU + 2 * ub * e.s_abs + ub;
  b.out = vmax * (b.E + ub + (T + 2) * kU);
  b.lse_abs = b.E;
  const double M = 2 * D * domax * vmax, Eb = 2 * b.E + 4 * ub + (D + 4) * kU + (T + 2) * kU;
  b.dq = scale * kmax * M * Eb;
  b.dk_per_col = scale * qmax * M * Eb;
  b.dv_per_col = domax * (b.E + 2 * ub + (T + 2) * kU);
  return b;
}

ThreadPool& pool(int n) {
  static ThreadPool p1(1), p2(2), p3(3);
  return n == 1 ? p1 : n == 2 ? p2 : p3;
}

// Checks a (B,T,C+2*KV) gradient against `want` with the per-element bounds above; a key/value
// head's bound sums the column sums of its group's query heads.
void expect_dqkv_near(const Buf& got, const std::vector<double>& want, const AttnShape& s,
                      const Exact& e, const Bounds& bd, double abs_extra, const char* what) {
  const int64_t C = s.C(), KV = s.KV();
  int failures = 0;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t t = 0; t < s.T; ++t)
      for (int64_t part = 0; part < 3; ++part)
        for (int64_t c = 0; c < (part == 0 ? C : KV); ++c) {
          const int64_t first = part == 0 ? 0 : part == 1 ? C : C + KV;
          const size_t idx = static_cast<size_t>((b * s.T + t) * s.ld() + first + c);
          double col = 0;
          for (int64_t h = c / s.D * s.group(); part > 0 && h < (c / s.D + 1) * s.group(); ++h)
            col += e.colsum[static_cast<size_t>((b * s.H + h) * s.T + t)];
          const double tol = abs_extra + (part == 0   ? bd.dq
                                          : part == 1 ? bd.dk_per_col * col
                                                      : bd.dv_per_col * col);
          if (std::fabs(got[idx] - want[idx]) > tol + 1e-30 && ++failures <= 5)
            ADD_FAILURE() << what << " B=" << s.B << " T=" << s.T << " H=" << s.H
                          << " Hkv=" << s.kv() << " D=" << s.D << " b=" << b << " t=" << t
                          << " part=" << part << " c=" << c << ": got " << got[idx] << " want "
                          << want[idx] << " tol " << tol;
        }
  EXPECT_EQ(failures, 0) << what;
}

struct Case {
  AttnShape s;
  Buf qkv, dout;
  Exact exact;
  Bounds bd;
  Case(const AttnShape& sh, uint64_t seed, size_t offset)
      : s(sh),
        qkv(static_cast<size_t>(sh.B * sh.T * sh.ld()), offset),
        dout(static_cast<size_t>(sh.B * sh.T * sh.C()), offset + 1) {
    Rng rng(seed);
    fill_uniform(qkv, rng);
    fill_uniform(dout, rng);
    exact = naive_forward(to_double(qkv), s);
    bd = bounds(s, exact, qkv, dout);
  }
  size_t n_out() const { return static_cast<size_t>(s.B * s.T * s.C()); }
  size_t n_lse() const { return static_cast<size_t>(s.B * s.H * s.T); }
};

TEST(AttentionRef, ForwardMatchesDoubleNaive) {
  for (const AttnShape& s : {AttnShape{1, 1, 1, 3}, AttnShape{2, 7, 3, 5}, AttnShape{1, 65, 4, 64},
                             AttnShape{1, 65, 4, 64, 0, 10}, AttnShape{2, 7, 3, 5, 1, 1}}) {
    Case c(s, 11, 0);
    Buf out(c.n_out(), 0), lse(c.n_lse(), 0);
    ref::attention_forward(out.data(), lse.data(), c.qkv.data(), s.args());
    // The reference works in double and rounds once: a few units of f32 rounding.
    const double vmax = max_abs(c.qkv, 2 * s.C(), 3 * s.C(), s.C());
    for (size_t i = 0; i < c.n_out(); ++i) ASSERT_NEAR(out[i], c.exact.out[i], 4 * kU * vmax);
    for (size_t i = 0; i < c.n_lse(); ++i)
      ASSERT_NEAR(lse[i], c.exact.lse[i], 4 * kU * (1 + std::fabs(c.exact.lse[i])));
  }
}

// The shapes of the fast-vs-reference sweep: T around the 64-row tile edges, odd head dims.
std::vector<AttnShape> sweep_shapes() {
  std::vector<AttnShape> v;
  for (int64_t T : {1, 2, 7, 64, 65, 130})
    for (int64_t D : {3, 8, 64})
      for (int64_t H : {1, 3, 4})
        for (int64_t B : {1, 2}) v.push_back({B, T, H, D});
  // 16 or more key/value heads in all: the backward's one-task-per-head path (fewer heads split
  // key tiles).
  v.push_back({4, 130, 4, 8});
  v.push_back({2, 65, 8, 3});
  // Grouped key/value heads (Llama's GQA, and one head for all: multi-query), split key tiles
  // and not.
  v.push_back({1, 65, 4, 8, 2});
  v.push_back({2, 130, 4, 5, 1});
  v.push_back({1, 70, 6, 64, 3});
  v.push_back({2, 7, 8, 16, 2});
  v.push_back({4, 130, 8, 8, 4});
  // Sliding windows shorter than T: one key, under a tile, not a multiple of the 64-key tile
  // (windows that end mid-tile and span tiles and the backward's runs of key tiles), exactly a
  // tile, and over many tiles with the backward's one-task-per-head path.
  for (int64_t W : {1, 5, 63, 64, 70, 129}) v.push_back({1, 130, 4, 8, 2, W});
  v.push_back({2, 200, 3, 5, 1, 37});
  v.push_back({1, 300, 2, 64, 0, 100});
  v.push_back({4, 200, 8, 3, 4, 65});
  return v;
}

TEST(Attention, ForwardMatchesReference) {
  uint64_t seed = 100;
  for (const AttnShape& s : sweep_shapes()) {
    ++seed;
    Case c(s, seed, seed % 5);
    Buf out_ref(c.n_out(), 0), lse_ref(c.n_lse(), 0);
    ref::attention_forward(out_ref.data(), lse_ref.data(), c.qkv.data(), s.args());
    std::vector<float> first_out, first_lse;
    for (int threads = 1; threads <= 3; ++threads) {
      Buf out(c.n_out(), 3), lse(c.n_lse(), 1);
      attention_forward(pool(threads), out.data(), lse.data(), c.qkv.data(), s.args());
      for (size_t i = 0; i < c.n_out(); ++i)
        ASSERT_NEAR(out[i], out_ref[i], c.bd.out)
            << "out B=" << s.B << " T=" << s.T << " H=" << s.H << " D=" << s.D << " i=" << i;
      for (size_t i = 0; i < c.n_lse(); ++i)
        ASSERT_NEAR(lse[i], c.exact.lse[i], c.bd.lse_abs + 2 * kU * std::fabs(c.exact.lse[i]))
            << "lse B=" << s.B << " T=" << s.T << " H=" << s.H << " D=" << s.D << " i=" << i;
      // Bit-identical whatever the thread count: each output has one writer and a fixed order.
      if (threads == 1) {
        first_out.assign(out.data(), out.data() + out.size());
        first_lse.assign(lse.data(), lse.data() + lse.size());
      } else {
        ASSERT_EQ(0, std::memcmp(first_out.data(), out.data(), out.size() * sizeof(float)));
        ASSERT_EQ(0, std::memcmp(first_lse.data(), lse.data(), lse.size() * sizeof(float)));
      }
    }
  }
}

TEST(Attention, BackwardMatchesReference) {
  uint64_t seed = 200;
  for (const AttnShape& s : sweep_shapes()) {
    ++seed;
    Case c(s, seed, seed % 7);
    Buf out(c.n_out(), 0), lse(c.n_lse(), 0), g_ref(c.qkv.size(), 0);
    ref::attention_forward(out.data(), lse.data(), c.qkv.data(), s.args());
    ref::attention_backward(g_ref.data(), c.dout.data(), c.qkv.data(), out.data(), lse.data(),
                            s.args());
    const std::vector<double> want = to_double(g_ref);
    std::vector<float> first;
    for (int threads = 1; threads <= 3; ++threads) {
      Buf g(c.qkv.size(), 5);
      std::fill(g.data(), g.data() + g.size(), NAN);  // every element must be overwritten
      attention_backward(pool(threads), g.data(), c.dout.data(), c.qkv.data(), out.data(),
                         lse.data(), s.args());
      expect_dqkv_near(g, want, s, c.exact, c.bd, 0.0, "fast vs ref");
      if (threads == 1) {
        first.assign(g.data(), g.data() + g.size());
      } else {
        ASSERT_EQ(0, std::memcmp(first.data(), g.data(), g.size() * sizeof(float)));
      }
    }
  }
}

// Every SIMD target compiled in and supported here (e.g. SSE2, SSSE3, SSE4, AVX2 on an AVX2
// machine: 4- and 8-lane vectors) must meet the same bounds, with odd D and partial tiles.
TEST(Attention, EverySimdTargetMatchesReference) {
  const AttnShape s{2, 70, 4, 5, 2};
  Case c(s, 77, 3);
  Buf out_ref(c.n_out(), 0), lse_ref(c.n_lse(), 0), g_ref(c.qkv.size(), 0);
  ref::attention_forward(out_ref.data(), lse_ref.data(), c.qkv.data(), s.args());
  ref::attention_backward(g_ref.data(), c.dout.data(), c.qkv.data(), out_ref.data(), lse_ref.data(),
                          s.args());
  const std::vector<double> want = to_double(g_ref);
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  EXPECT_FALSE(targets.empty());
  for (int64_t target : targets) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    Buf out(c.n_out(), 1), lse(c.n_lse(), 2), g(c.qkv.size(), 3);
    attention_forward(pool(2), out.data(), lse.data(), c.qkv.data(), s.args());
    for (size_t i = 0; i < c.n_out(); ++i) ASSERT_NEAR(out[i], out_ref[i], c.bd.out);
    for (size_t i = 0; i < c.n_lse(); ++i)
      ASSERT_NEAR(lse[i], c.exact.lse[i], c.bd.lse_abs + 2 * kU * std::fabs(c.exact.lse[i]));
    attention_backward(pool(2), g.data(), c.dout.data(), c.qkv.data(), out_ref.data(),
                       lse_ref.data(), s.args());
    expect_dqkv_near(g, want, s, c.exact, c.bd, 0.0, hwy::TargetName(target));
  }
  hwy::SetSupportedTargetsForTest(0);  // back to the best target
}

// d/dqkv of L = sum(out * R) by central differences of the double naive forward. With step h
// the truncation error is h^2/6 |L'''|; L is smooth with derivatives of order 1 at these sizes,
// so h = 1e-3 leaves ~1e-7, and double rounding adds ~1e-16 |L| / h: both far below the f32
// bounds checked against.
TEST(Attention, BackwardMatchesFiniteDifferences) {
  for (const AttnShape& s :
       {AttnShape{2, 9, 2, 5}, AttnShape{2, 9, 4, 5, 2}, AttnShape{2, 9, 4, 5, 2, 3}}) {
    Case c(s, 7, 1);
    std::vector<double> x = to_double(c.qkv);
    auto loss = [&](const std::vector<double>& in) {
      const Exact e = naive_forward(in, s);
      double l = 0;
      for (size_t i = 0; i < e.out.size(); ++i) l += e.out[i] * c.dout[i];
      return l;
    };
    std::vector<double> fd(x.size());
    const double h = 1e-3;
    for (size_t i = 0; i < x.size(); ++i) {
      const double x0 = x[i];
      x[i] = x0 + h;
      const double lp = loss(x);
      x[i] = x0 - h;
      const double lm = loss(x);
      x[i] = x0;
      fd[i] = (lp - lm) / (2 * h);
    }
    const double kFdErr = 1e-6;
    for (int use_ref = 0; use_ref < 2; ++use_ref) {
      Buf out(c.n_out(), 0), lse(c.n_lse(), 0), g(c.qkv.size(), 2);
      if (use_ref) {
        ref::attention_forward(out.data(), lse.data(), c.qkv.data(), s.args());
        ref::attention_backward(g.data(), c.dout.data(), c.qkv.data(), out.data(), lse.data(),
                                s.args());
      } else {
        attention_forward(pool(2), out.data(), lse.data(), c.qkv.data(), s.args());
        attention_backward(pool(2), g.data(), c.dout.data(), c.qkv.data(), out.data(), lse.data(),
                           s.args());
      }
      expect_dqkv_near(g, fd, s, c.exact, c.bd, kFdErr, use_ref ? "ref vs fd" : "fast vs fd");
    }
  }
}

// Changing the tokens after position t must leave out and lse at positions <= t bit-identical.
TEST(Attention, Causal) {
  const AttnShape s{1, 130, 4, 8, 2};
  Case c(s, 3, 0);
  const size_t C = static_cast<size_t>(s.C());
  for (int64_t t : {0, 63, 64, 100}) {
    Buf changed(c.qkv.size(), 0);
    std::copy(c.qkv.data(), c.qkv.data() + c.qkv.size(), changed.data());
    for (size_t i = static_cast<size_t>((t + 1) * s.ld()); i < changed.size(); ++i)
      changed[i] += 1.5f;
    for (int use_ref = 0; use_ref < 2; ++use_ref) {
      Buf o1(c.n_out(), 0), l1(c.n_lse(), 0), o2(c.n_out(), 0), l2(c.n_lse(), 0);
      if (use_ref) {
        ref::attention_forward(o1.data(), l1.data(), c.qkv.data(), s.args());
        ref::attention_forward(o2.data(), l2.data(), changed.data(), s.args());
      } else {
        attention_forward(pool(2), o1.data(), l1.data(), c.qkv.data(), s.args());
        attention_forward(pool(2), o2.data(), l2.data(), changed.data(), s.args());
      }
      const size_t n = static_cast<size_t>(t + 1);
      EXPECT_EQ(0, std::memcmp(o1.data(), o2.data(), n * C * sizeof(float))) << "t=" << t;
      for (int64_t h = 0; h < s.H; ++h)
        EXPECT_EQ(0, std::memcmp(l1.data() + h * s.T, l2.data() + h * s.T, n * sizeof(float)));
      // ...and the change is visible right after t (the test could fail).
      EXPECT_NE(o1[n * C], o2[n * C]);
    }
  }
}

// With window W, out and lse at position i depend on positions i - W + 1 .. i only: changing the
// rows before i - W + 1 (and after i) leaves them bit-identical, changing row i - W + 1 does not.
TEST(Attention, WindowHidesTheRowsBeforeIt) {
  const AttnShape s{1, 200, 4, 8, 2, 70};
  Case c(s, 5, 0);
  const size_t C = static_cast<size_t>(s.C()), ld = static_cast<size_t>(s.ld());
  for (int64_t i : {69, 70, 100, 199}) {
    const size_t lo = static_cast<size_t>(i + 1 - s.W);
    for (int use_ref = 0; use_ref < 2; ++use_ref) {
      auto run = [&](const Buf& qkv, Buf& o, Buf& l) {
        if (use_ref)
          ref::attention_forward(o.data(), l.data(), qkv.data(), s.args());
        else
          attention_forward(pool(2), o.data(), l.data(), qkv.data(), s.args());
      };
      Buf o1(c.n_out(), 0), l1(c.n_lse(), 0), o2(c.n_out(), 0), l2(c.n_lse(), 0);
      Buf changed(c.qkv.size(), 0);
      for (int hidden = 1; hidden >= 0; --hidden) {
        std::copy(c.qkv.data(), c.qkv.data() + c.qkv.size(), changed.data());
        // Every row but lo .. i changes; with hidden = 0 row lo (its key and value) too.
        for (size_t r = 0; r < static_cast<size_t>(s.T); ++r)
          if (r < lo || r > static_cast<size_t>(i) || (!hidden && r == lo))
            for (size_t d = C; d < ld; ++d) changed[r * ld + d] += 1.5f;
        run(c.qkv, o1, l1);
        run(changed, o2, l2);
        const size_t at = static_cast<size_t>(i) * C;
        const bool same = std::memcmp(o1.data() + at, o2.data() + at, C * sizeof(float)) == 0 &&
                          l1[static_cast<size_t>(i)] == l2[static_cast<size_t>(i)];
        EXPECT_EQ(same, hidden == 1) << "i=" << i << " ref=" << use_ref << " hidden=" << hidden;
      }
    }
  }
}

// A window of T or more hides nothing: forward and backward equal the unwindowed ones bit for bit
// (the reference and the tiled kernels, f32 and bf16 products).
TEST(Attention, WindowOfTOrMoreEqualsNoWindowBitForBit) {
  for (const AttnShape& s0 : {AttnShape{1, 130, 4, 8, 2}, AttnShape{2, 65, 3, 5}}) {
    Case c(s0, 9, 2);
    auto run = [&](int64_t W, int mode) {  // mode 0: reference, 1: tiled f32, 2: tiled bf16
      AttnShape s = s0;
      s.W = W;
      Buf o(c.n_out(), 0), l(c.n_lse(), 0), g(c.qkv.size(), 0);
      if (mode == 0) {
        ref::attention_forward(o.data(), l.data(), c.qkv.data(), s.args());
        ref::attention_backward(g.data(), c.dout.data(), c.qkv.data(), o.data(), l.data(),
                                s.args());
      } else {
        attention_forward(pool(3), o.data(), l.data(), c.qkv.data(), s.args(mode == 2));
        attention_backward(pool(3), g.data(), c.dout.data(), c.qkv.data(), o.data(), l.data(),
                           s.args(mode == 2));
      }
      std::vector<float> all(o.data(), o.data() + o.size());
      all.insert(all.end(), l.data(), l.data() + l.size());
      all.insert(all.end(), g.data(), g.data() + g.size());
      return all;
    };
    for (int mode = 0; mode < 3; ++mode) {
      const std::vector<float> none = run(0, mode);
      for (int64_t W : {s0.T, s0.T + 1, int64_t{1000}}) EXPECT_EQ(run(W, mode), none) << "W=" << W;
      // ...while a window one shorter than T changes something (the test could fail).
      EXPECT_NE(run(s0.T - 1, mode), none);
    }
  }
}

// The work a window saves, as the cost model counts it: the (query, key) pairs of one head.
TEST(Attention, PairsCountTheWindow) {
  // Brute force over the rule i - W < j <= i.
  for (int64_t T : {1, 7, 130})
    for (int64_t W : {0, 1, 5, 129, 130, 500}) {
      double n = 0;
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j <= i; ++j) n += W == 0 || j > i - W;
      EXPECT_EQ(ops::attention_pairs(T, W), n) << "T=" << T << " W=" << W;
    }
}

TEST(Attention, EmptyShapesAreNoOps) {
  float x = 1.0f;
  attention_forward(pool(2), &x, &x, &x, ops::AttentionArgs{0, 5, 4, 2, 2});
  attention_backward(pool(2), &x, &x, &x, &x, &x, ops::AttentionArgs{3, 0, 4, 2, 1});
  ref::attention_forward(&x, &x, &x, ops::AttentionArgs{0, 5, 4, 2, 2});
  EXPECT_EQ(x, 1.0f);
}

TEST(Attention, RejectsBadShapes) {
  std::vector<float> buf(1000);
  float* p = buf.data();
  EXPECT_THROW(attention_forward(pool(1), p, p, p, ops::AttentionArgs{1, 4, 10, 3, 3}),
               Error);  // C % H != 0
  EXPECT_THROW(attention_forward(pool(1), p, p, p, ops::AttentionArgs{1, -1, 4, 2, 2}), Error);
  EXPECT_THROW(attention_backward(pool(1), p, p, p, p, p, ops::AttentionArgs{1, 4, 4, 0, 1}),
               Error);
  EXPECT_THROW(attention_forward(pool(1), nullptr, p, p, ops::AttentionArgs{1, 4, 4, 2, 2}), Error);
  EXPECT_THROW(ref::attention_forward(p, p, p, ops::AttentionArgs{1, 4, 10, 3, 3}), Error);
  EXPECT_THROW(ref::attention_backward(p, p, p, p, p, ops::AttentionArgs{-2, 4, 4, 2, 2}), Error);
  // Key/value heads must divide the query heads.
  EXPECT_THROW(attention_forward(pool(1), p, p, p, ops::AttentionArgs{1, 4, 12, 3, 2}), Error);
  EXPECT_THROW(attention_backward(pool(1), p, p, p, p, p, ops::AttentionArgs{1, 4, 12, 3, 0}),
               Error);
  EXPECT_THROW(ref::attention_forward(p, p, p, ops::AttentionArgs{1, 4, 12, 3, 2}), Error);
  // A negative window.
  EXPECT_THROW(attention_forward(pool(1), p, p, p, ops::AttentionArgs{1, 4, 4, 2, 2, -1}), Error);
  EXPECT_THROW(ref::attention_backward(p, p, p, p, p, ops::AttentionArgs{1, 4, 4, 2, 2, -3}),
               Error);
}

// ---- bf16 products (round_bf16) ----

// Against the double-precision naive attention within the bounds widened for bf16 operands, over
// tile edges, odd and large head dims (D = 128: two column blocks) and 1-3 threads, bit-identical
// across thread counts; and not the f32 kernel's result (the bf16 products ran).
TEST(AttentionBf16, MatchesDoubleNaiveWithinBf16Bounds) {
  if (!attention_bf16::supported())
    GTEST_SKIP() << "this CPU has no AVX512-BF16 (" << simd_summary() << ")";
  uint64_t seed = 300;
  for (const AttnShape& s :
       {AttnShape{1, 1, 1, 64}, AttnShape{2, 7, 3, 5}, AttnShape{1, 65, 4, 64},
        AttnShape{2, 130, 3, 8}, AttnShape{1, 70, 2, 128}, AttnShape{4, 130, 4, 16},
        AttnShape{1, 129, 1, 3}, AttnShape{2, 130, 4, 16, 2}, AttnShape{1, 65, 8, 64, 1},
        AttnShape{1, 200, 2, 16, 1, 70}, AttnShape{2, 130, 4, 64, 2, 5}}) {
    ++seed;
    Case c(s, seed, seed % 5);
    const Bounds bd = bounds(s, c.exact, c.qkv, c.dout, kUb);
    Buf out_ref(c.n_out(), 0), lse_ref(c.n_lse(), 0), g_ref(c.qkv.size(), 0);
    ref::attention_forward(out_ref.data(), lse_ref.data(), c.qkv.data(), s.args());
    ref::attention_backward(g_ref.data(), c.dout.data(), c.qkv.data(), out_ref.data(),
                            lse_ref.data(), s.args());
    const std::vector<double> want = to_double(g_ref);
    std::vector<float> first_out, first_g;
    for (int threads = 1; threads <= 3; ++threads) {
      Buf out(c.n_out(), 3), lse(c.n_lse(), 1), g(c.qkv.size(), 5);
      std::fill(g.data(), g.data() + g.size(), NAN);  // every element must be overwritten
      attention_forward(pool(threads), out.data(), lse.data(), c.qkv.data(), s.args(true));
      for (size_t i = 0; i < c.n_out(); ++i)
        ASSERT_NEAR(out[i], c.exact.out[i], bd.out)
            << "out B=" << s.B << " T=" << s.T << " H=" << s.H << " D=" << s.D << " i=" << i;
      for (size_t i = 0; i < c.n_lse(); ++i)
        ASSERT_NEAR(lse[i], c.exact.lse[i], bd.lse_abs + 2 * kU * std::fabs(c.exact.lse[i]));
      // The backward from the exact forward's outputs, as in the f32 test.
      attention_backward(pool(threads), g.data(), c.dout.data(), c.qkv.data(), out_ref.data(),
                         lse_ref.data(), s.args(true));
      expect_dqkv_near(g, want, s, c.exact, bd, 0.0, "bf16 vs ref");
      if (threads == 1) {
        first_out.assign(out.data(), out.data() + out.size());
        first_g.assign(g.data(), g.data() + g.size());
      } else {
        ASSERT_EQ(0, std::memcmp(first_out.data(), out.data(), out.size() * sizeof(float)));
        ASSERT_EQ(0, std::memcmp(first_g.data(), g.data(), g.size() * sizeof(float)));
      }
    }
    if (s.T > 1) {
      Buf out32(c.n_out(), 0), lse32(c.n_lse(), 0);
      attention_forward(pool(2), out32.data(), lse32.data(), c.qkv.data(), s.args());
      EXPECT_NE(0, std::memcmp(first_out.data(), out32.data(), out32.size() * sizeof(float)))
          << "round_bf16 gave the f32 kernel's result bit for bit";
    }
  }
}

}  // namespace
}  // namespace tessera::cpu
