// Runs the Highway kernels on every SIMD target compiled in and supported by this CPU (SSSE3,
// SSE4, AVX2, EMU128, ...), forcing each in turn, and checks them against the references.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/ref/ref_kernels.h"
#include "hwy/highway.h"
#include "hwy/targets.h"
#include "kernel_test_util.h"

namespace tessera {
namespace {

using test::Buf;
using test::kEpsF;
using test::normal_buf;
using test::pool;

// Restores normal dispatch when a test ends, even on failure.
struct TargetMock {
  explicit TargetMock(int64_t target) { hwy::SetSupportedTargetsForTest(target); }
  ~TargetMock() { hwy::SetSupportedTargetsForTest(0); }
};

TEST(AllTargets, ExactKernelsMatchReferenceBitForBit) {
  // add, scale, embedding and AdamW are sequences of IEEE operations identical to the
  // reference on every target (see kernels_test.cc / kernels_loss_test.cc).
  const int64_t n = 1001, B = 2, T = 5, C = 67, V = 7;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    TargetMock mock(target);
    const std::string name = hwy::TargetName(target);
    Buf a = normal_buf(n, 1, 1), b = normal_buf(n, 1, 2), out(n, 1), ref(n, 1);
    cpu::add(pool(2), out.p, a.p, b.p, n);
    cpu::ref::add(ref.p, a.p, b.p, n);
    ASSERT_EQ(0, std::memcmp(out.p, ref.p, n * 4)) << name;
    cpu::scale(pool(2), a.p, n, -1.5f);
    Buf a2 = normal_buf(n, 1, 1);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(a[i], a2[i] * -1.5f) << name;

    std::vector<int32_t> tokens(B * T);
    for (int64_t i = 0; i < B * T; ++i) tokens[i] = static_cast<int32_t>((i * 3) % V);
    Buf wte = normal_buf(V * C, 1, 3), wpe = normal_buf(T * C, 1, 4),
        dout = normal_buf(B * T * C, 1, 5);
    Buf eo(B * T * C, 1), ero(B * T * C, 1), dwte(V * C, 1), rdwte(V * C, 1), dwpe(T * C, 1),
        rdwpe(T * C, 1);
    cpu::embedding_forward(pool(3), eo.p, tokens.data(), wte.p, wpe.p, B, T, C, V);
    cpu::ref::embedding_forward(ero.p, tokens.data(), wte.p, wpe.p, B, T, C, V);
    ASSERT_EQ(0, std::memcmp(eo.p, ero.p, B * T * C * 4)) << name;
    cpu::embedding_backward(pool(3), dwte.p, dwpe.p, dout.p, tokens.data(), B, T, C, V);
    cpu::ref::embedding_backward(rdwte.p, rdwpe.p, dout.p, tokens.data(), B, T, C, V);
    ASSERT_EQ(0, std::memcmp(dwte.p, rdwte.p, V * C * 4)) << name;
    ASSERT_EQ(0, std::memcmp(dwpe.p, rdwpe.p, T * C * 4)) << name;

    Buf p = normal_buf(n, 0, 6), m(n, 0), v(n, 0);
    Buf rp = p, rm = m, rv = v;
    ops::AdamWArgs args;
    args.lr = 1e-2f;
    args.weight_decay = 0.1f;
    for (int64_t t = 1; t <= 3; ++t) {
      args.t = t;
      const Buf g = normal_buf(n, 0, 10 + t);
      cpu::adamw(pool(2), p.p, g.p, m.p, v.p, n, args);
      cpu::ref::adamw(rp.p, g.p, rm.p, rv.p, n, args);
    }
    ASSERT_EQ(0, std::memcmp(p.p, rp.p, n * 4)) << name;
    ASSERT_EQ(0, std::memcmp(v.p, rv.p, n * 4)) << name;
  }
}

TEST(AllTargets, RoundedKernelsMatchReference) {
  const int64_t n = 1001, N = 9, C = 67, V = 67;
  const auto targets_list = hwy::SupportedAndGeneratedTargets();
  EXPECT_GE(targets_list.size(), 2u);  // baseline plus at least one dispatched target on x86-64
  for (int64_t target : targets_list) {
    TargetMock mock(target);
    const std::string name = hwy::TargetName(target);
    RecordProperty("target_" + name, "checked");
    // GELU: relative bound (8|u| + 8) eps derived in kernels_test.cc.
    Buf x = normal_buf(n, 1, 20, 3.0f), out(n, 1), ref(n, 1);
    cpu::gelu_forward(pool(2), out.p, x.p, n);
    cpu::ref::gelu_forward(ref.p, x.p, n);
    for (int64_t i = 0; i < n; ++i) {
      const double u = std::fabs(0.7978845608028654 * (x[i] + 0.044715 * x[i] * x[i] * x[i]));
      ASSERT_NEAR(out[i], ref[i], (8 * u + 8) * kEpsF * std::fabs(ref[i]) + 2e-35 * std::fabs(x[i]))
          << name;
    }
    // Sum of squares: two double summation orders differ by < 2n 2^-53 of the sum.
    const double ss = cpu::sum_squares(pool(2), x.p, n), rss = cpu::ref::sum_squares(x.p, n);
    ASSERT_NEAR(ss, rss, 2.0 * n * 0x1p-53 * rss) << name;
    // LayerNorm forward: the per-term bound of kernels_test.cc, with its (C + 4) eps sum error
    // rounded up to (C + 8) eps: |w| (|xhat| + mean|x| rstd + 1) + 2 (|b| + |out|).
    Buf lx = normal_buf(N * C, 1, 21), w = normal_buf(C, 1, 22), b = normal_buf(C, 1, 23);
    Buf lo(N * C, 1), lro(N * C, 1), mean(N, 1), rstd(N, 1), rmean(N, 1), rrstd(N, 1);
    cpu::layernorm_forward(pool(2), lo.p, mean.p, rstd.p, lx.p, w.p, b.p, N, C);
    cpu::ref::layernorm_forward(lro.p, rmean.p, rrstd.p, lx.p, w.p, b.p, N, C);
    for (int64_t r = 0; r < N; ++r) {
      double abs_mean = 0;
      for (int64_t c = 0; c < C; ++c) abs_mean += std::fabs(lx[r * C + c]) / C;
      for (int64_t c = 0; c < C; ++c) {
        const int64_t i = r * C + c;
        const double xhat = std::fabs((lx[i] - rmean[r]) * double{rrstd[r]});
        const double mag = std::fabs(w[c]) * (xhat + abs_mean * rrstd[r] + 1) +
                           2 * (std::fabs(b[c]) + std::fabs(lro[i]));
        ASSERT_NEAR(lo[i], lro[i], (C + 8) * kEpsF * mag) << name;
      }
    }
    // LayerNorm backward from zero accumulators: dinp within (C + 16) eps of rstd |g|max
    // (2 + |xhat|max), dw/db within (N + 4) eps of their sums of magnitudes (kernels_test.cc).
    Buf ldy = normal_buf(N * C, 1, 25), dx(N * C, 1), dw(C, 1), db(C, 1), rdx(N * C, 1), rdw(C, 1),
        rdb(C, 1);
    cpu::layernorm_backward(pool(3), dx.p, dw.p, db.p, ldy.p, lx.p, w.p, rmean.p, rrstd.p, N, C);
    cpu::ref::layernorm_backward(rdx.p, rdw.p, rdb.p, ldy.p, lx.p, w.p, rmean.p, rrstd.p, N, C);
    double g_max = 0, xhat_max = 0, rstd_max = 0, sw = 0, sb = 0;
    for (int64_t i = 0; i < N * C; ++i) {
      const double xhat = std::fabs((lx[i] - rmean[i / C]) * double{rrstd[i / C]});
      g_max = std::max(g_max, std::fabs(double{ldy[i]} * w[i % C]));
      xhat_max = std::max(xhat_max, xhat);
      rstd_max = std::max(rstd_max, double{rrstd[i / C]});
      sw = std::max(sw, std::fabs(ldy[i]) * xhat);
      sb = std::max(sb, double{std::fabs(ldy[i])});
    }
    for (int64_t i = 0; i < N * C; ++i)
      ASSERT_NEAR(dx[i], rdx[i], (C + 16) * kEpsF * rstd_max * g_max * (2 + xhat_max)) << name;
    for (int64_t c = 0; c < C; ++c) {
      ASSERT_NEAR(dw[c], rdw[c], (N + 4) * kEpsF * N * sw) << name;
      ASSERT_NEAR(db[c], rdb[c], (N + 4) * kEpsF * N * sb) << name;
    }
    // GELU backward: (8|u| + 12) eps relative to |s| + |x s (1-s) 2u'| <= 1.4 + 0.5 |x|^3
    // (s(1-s) <= 1/4, 2u' = 1.6 (1 + 0.134 x^2)); 1e-30 covers the exp-argument cap (2e-35 |x|^3).
    Buf gy = normal_buf(n, 1, 26), gdx(n, 1), grdx(n, 1);
    cpu::gelu_backward(pool(2), gdx.p, x.p, gy.p, n);
    cpu::ref::gelu_backward(grdx.p, x.p, gy.p, n);
    for (int64_t i = 0; i < n; ++i) {
      const double ax = std::fabs(x[i]), u = 0.7978845608028654 * ax * (1 + 0.044715 * ax * ax);
      const double tol = (8 * u + 12) * kEpsF * (1.4 + 0.5 * ax * ax * ax) * std::fabs(gy[i]);
      ASSERT_NEAR(gdx[i], grdx[i], tol + 1e-30) << name << " x=" << x[i];
    }
    // Softmax + cross-entropy: loss to (spread + 272) eps, spread = max|x - max| < 30 here.
    Buf logits = normal_buf(N * V, 1, 24, 3.0f), rlogits = logits, loss(N, 1), rloss(N, 1);
    std::vector<int32_t> targets(N);
    for (int64_t r = 0; r < N; ++r) targets[r] = static_cast<int32_t>((r * 7) % V);
    cpu::softmax_xent(pool(2), loss.p, logits.p, targets.data(), N, V, V, 1.0f);
    cpu::ref::softmax_xent(rloss.p, rlogits.p, targets.data(), N, V, V, 1.0f);
    for (int64_t r = 0; r < N; ++r)
      ASSERT_NEAR(loss[r], rloss[r], 310 * kEpsF * (1 + std::fabs(rloss[r]))) << name;
    for (int64_t i = 0; i < N * V; ++i)
      ASSERT_NEAR(logits[i], rlogits[i], 330 * kEpsF) << name;  // |grad| <= 1
  }
}

}  // namespace
}  // namespace tessera
