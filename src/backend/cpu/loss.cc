// Highway fused softmax + cross-entropy: per row one max pass, one exp-sum pass (exps kept in
// the logits buffer when a gradient is wanted), one gradient pass; rows run in parallel.
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/fixed_chunks.h"
#include "core/error.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/loss.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// Separate block: math-inl.h needs highway.h first (and include sorting would swap them).
#include "hwy/contrib/math/math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tessera::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The exp-sum runs in f32 lanes over blocks of kSumBlock columns, each block's total added in
// double: the relative error of the sum stays ~(kSumBlock / lanes) * eps for any vocabulary.
constexpr int64_t kSumBlock = 256;

// x (Vp): one row of logits. Returns the loss; when scale != 0 overwrites x with the gradient.
float XentRow(float* HWY_RESTRICT x, int32_t target, int64_t V, int64_t Vp, float scale) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  constexpr size_t kBuf = HWY_MAX_BYTES / sizeof(float);
  const float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t v_full = V / L * L;  // columns handled as whole vectors
  const size_t rem = static_cast<size_t>(V - v_full);

  // Pass 1: row max. The tail goes through a buffer padded with -inf (no read past V).
  auto vmax = hn::Set(d, kNegInf);
  for (int64_t j = 0; j < v_full; j += L) vmax = hn::Max(vmax, hn::LoadU(d, x + j));
  HWY_ALIGN float buf[kBuf];
  if (rem) {
    for (size_t k = 0; k < kBuf; ++k) buf[k] = kNegInf;
    std::memcpy(buf, x + v_full, rem * sizeof(float));
    vmax = hn::Max(vmax, hn::Load(d, buf));
  }
  const float mx = hn::GetLane(hn::MaxOfLanes(d, vmax));
  const float x_target = x[target];

  // Pass 2: sum of exp(x - max); exps are stored back when the gradient will be written.
  const auto vm = hn::Set(d, mx);
  const bool store = scale != 0.0f;
  double sum = 0;
  for (int64_t b0 = 0; b0 < v_full; b0 += kSumBlock) {
    const int64_t b1 = std::min(v_full, b0 + kSumBlock);
    auto acc = hn::Zero(d);
    for (int64_t j = b0; j < b1; j += L) {
      const auto e = hn::Exp(d, hn::Sub(hn::LoadU(d, x + j), vm));
      if (store) hn::StoreU(e, d, x + j);
      acc = hn::Add(acc, e);
    }
    sum += hn::GetLane(hn::SumOfLanes(d, acc));
  }
  if (rem) {
    // Padding lanes hold -inf, whose exp is 0, so they add nothing.
    const auto e = hn::Exp(d, hn::Sub(hn::Load(d, buf), vm));
    hn::Store(e, d, buf);
    if (store) std::memcpy(x + v_full, buf, rem * sizeof(float));
    sum += hn::GetLane(hn::SumOfLanes(d, e));
  }
  const float loss = static_cast<float>(std::log(sum) - (static_cast<double>(x_target) - mx));
  if (!store) return loss;

  // Pass 3: x = scale * (softmax - onehot); padded columns get exact zeros.
  const auto c = hn::Set(d, static_cast<float>(scale / sum));
  for (int64_t j = 0; j < v_full; j += L) hn::StoreU(hn::Mul(hn::LoadU(d, x + j), c), d, x + j);
  for (int64_t j = v_full; j < V; ++j) x[j] *= hn::GetLane(c);
  x[target] -= scale;
  for (int64_t j = V; j < Vp; ++j) x[j] = 0.0f;
  return loss;
}

void SoftmaxXent(ThreadPool& pool, float* losses, float* logits, const int32_t* targets, int64_t N,
                 int64_t V, int64_t Vp, float scale) {
  // Rows are independent, so any split is deterministic; aim for ~32K logits per chunk.
  const int64_t rows_per_chunk = std::max<int64_t>(1, 32768 / Vp);
  for_each_chunk(pool, N, rows_per_chunk, [&](int64_t, int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      float* x = logits + n * Vp;
      const int32_t target = targets[n];
      if (target < 0) {
        losses[n] = 0.0f;
        if (scale != 0.0f) std::memset(x, 0, static_cast<size_t>(Vp) * sizeof(float));
        continue;
      }
      losses[n] = XentRow(x, target, V, Vp, scale);
    }
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace tessera::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tessera::cpu {

HWY_EXPORT(SoftmaxXent);

void softmax_xent(ThreadPool& pool, float* losses, float* logits, const int32_t* targets, int64_t N,
                  int64_t V, int64_t Vp, float dlogits_scale) {
  TS_CHECK(N >= 0 && V > 0 && Vp >= V, "[softmax_xent] bad shape N=", N, " V=", V, " Vp=", Vp);
  // Validate every target first so a bad one leaves logits and losses untouched.
  for (int64_t n = 0; n < N; ++n)
    TS_CHECK(targets[n] < V, "[softmax_xent] targets[", n, "] = ", targets[n],
             " is not below vocab V=", V);
  HWY_DYNAMIC_DISPATCH(SoftmaxXent)(pool, losses, logits, targets, N, V, Vp, dlogits_scale);
}

}  // namespace tessera::cpu
#endif  // HWY_ONCE
