// Highway layer normalization over row chunks. Backward computes dinp and, per fixed row chunk,
// partial dw/db sums in one pass over the data; the partials are then added in chunk order, so
// no two threads write the same output and the result does not depend on the thread count.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/fixed_chunks.h"
#include "core/error.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/layernorm.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tessera::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr float kEps = 1e-5f;
// Column block for the final dw/db reduction: 256 floats (1 KiB) per partial row.
constexpr int64_t kColBlock = 256;

// Rows per chunk: ~16K elements, at least one row.
int64_t RowChunk(int64_t C) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(C, 1));
}

// Sum of term(c) over whole vectors of [0, C) with two accumulators, lanes reduced in a fixed
// order; returns the sum and sets *tail to where the caller's scalar tail starts.
template <class D, class F>
HWY_INLINE float VectorRowSum(D d, int64_t C, const F& term, int64_t* tail) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  auto a0 = hn::Zero(d), a1 = hn::Zero(d);
  int64_t c = 0;
  for (; c + 2 * L <= C; c += 2 * L) {
    a0 = hn::Add(a0, term(c));
    a1 = hn::Add(a1, term(c + L));
  }
  for (; c + L <= C; c += L) a0 = hn::Add(a0, term(c));
  *tail = c;
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(a0, a1)));
}

void LayerNormForward(ThreadPool& pool, float* out, float* mean, float* rstd, const float* inp,
                      const float* w, const float* b, int64_t N, int64_t C) {
  for_each_chunk(pool, N, RowChunk(C), [&](int64_t, int64_t n0, int64_t n1) {
    const hn::ScalableTag<float> d;
    const int64_t L = static_cast<int64_t>(hn::Lanes(d));
    for (int64_t n = n0; n < n1; ++n) {
      const float* x = inp + n * C;
      int64_t tail = 0;
      float sum = VectorRowSum(
          d, C, [&](int64_t c) { return hn::LoadU(d, x + c); }, &tail);
      for (int64_t c = tail; c < C; ++c) sum += x[c];
      const float m = sum / static_cast<float>(C);
      const auto vm = hn::Set(d, m);
      // Two-pass variance: sum of squared deviations (no cancellation as in E[x^2] - m^2).
      float ss = VectorRowSum(
          d, C,
          [&](int64_t c) {
            const auto dx = hn::Sub(hn::LoadU(d, x + c), vm);
            return hn::Mul(dx, dx);
          },
          &tail);
      for (int64_t c = tail; c < C; ++c) ss += (x[c] - m) * (x[c] - m);
      const float s = 1.0f / std::sqrt(ss / static_cast<float>(C) + kEps);
      const auto vs = hn::Set(d, s);
      float* o = out + n * C;
      int64_t c = 0;
      for (; c + L <= C; c += L) {
        const auto xhat = hn::Mul(hn::Sub(hn::LoadU(d, x + c), vm), vs);
        hn::StoreU(hn::MulAdd(xhat, hn::LoadU(d, w + c), hn::LoadU(d, b + c)), d, o + c);
      }
      for (; c < C; ++c) o[c] = (x[c] - m) * s * w[c] + b[c];
      mean[n] = m;
      rstd[n] = s;
    }
  });
}

// With xhat = (x - mean) rstd and g = dout w: dinp += rstd (g - mean(g) - xhat mean(g xhat)).
// Rows [0, N) are cut into chunks of `rows` rows; chunk k also writes its partial sums
// dout * xhat and dout into partial + k * 2C (C floats each). Then dw, db += the partials
// added in chunk order.
void LayerNormBackward(ThreadPool& pool, float* dinp, float* dw, float* db, const float* dout,
                       const float* inp, const float* w, const float* mean, const float* rstd,
                       int64_t N, int64_t C, int64_t rows, float* partial) {
  for_each_chunk(pool, N, rows, [&](int64_t k, int64_t n0, int64_t n1) {
    const hn::ScalableTag<float> d;
    const int64_t L = static_cast<int64_t>(hn::Lanes(d));
    float* pw = partial + k * 2 * C;
    float* pb = pw + C;
    std::fill(pw, pw + 2 * C, 0.0f);
    for (int64_t n = n0; n < n1; ++n) {
      const float* x = inp + n * C;
      const float* dy = dout + n * C;
      const float m = mean[n], s = rstd[n];
      const auto vm = hn::Set(d, m), vs = hn::Set(d, s);
      auto g0 = hn::Zero(d), gx0 = hn::Zero(d);
      int64_t c = 0;
      for (; c + L <= C; c += L) {
        const auto dyv = hn::LoadU(d, dy + c);
        const auto g = hn::Mul(dyv, hn::LoadU(d, w + c));
        const auto xhat = hn::Mul(hn::Sub(hn::LoadU(d, x + c), vm), vs);
        g0 = hn::Add(g0, g);
        gx0 = hn::MulAdd(g, xhat, gx0);
        hn::StoreU(hn::MulAdd(dyv, xhat, hn::LoadU(d, pw + c)), d, pw + c);
        hn::StoreU(hn::Add(hn::LoadU(d, pb + c), dyv), d, pb + c);
      }
      float gs = hn::GetLane(hn::SumOfLanes(d, g0));
      float gxs = hn::GetLane(hn::SumOfLanes(d, gx0));
      for (int64_t t = c; t < C; ++t) {
        const float g = dy[t] * w[t];
        const float xhat = (x[t] - m) * s;
        gs += g;
        gxs += g * xhat;
        pw[t] += dy[t] * xhat;
        pb[t] += dy[t];
      }
      const float g_mean = gs / static_cast<float>(C), gx_mean = gxs / static_cast<float>(C);
      const auto vgm = hn::Set(d, g_mean), vgxm = hn::Set(d, gx_mean);
      float* di = dinp + n * C;
      c = 0;
      for (; c + L <= C; c += L) {
        const auto g = hn::Mul(hn::LoadU(d, dy + c), hn::LoadU(d, w + c));
        const auto xhat = hn::Mul(hn::Sub(hn::LoadU(d, x + c), vm), vs);
        const auto t = hn::NegMulAdd(xhat, vgxm, hn::Sub(g, vgm));
        hn::StoreU(hn::MulAdd(t, vs, hn::LoadU(d, di + c)), d, di + c);
      }
      for (; c < C; ++c) {
        const float xhat = (x[c] - m) * s;
        di[c] += (dy[c] * w[c] - g_mean - xhat * gx_mean) * s;
      }
    }
  });
  const int64_t n_chunks = (N + rows - 1) / rows;
  for_each_chunk(pool, C, kColBlock, [&](int64_t, int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      float sw = 0, sb = 0;
      for (int64_t k = 0; k < n_chunks; ++k) {
        sw += partial[k * 2 * C + c];
        sb += partial[k * 2 * C + C + c];
      }
      dw[c] += sw;
      db[c] += sb;
    }
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace tessera::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tessera::cpu {

HWY_EXPORT(LayerNormForward);
HWY_EXPORT(LayerNormBackward);

void layernorm_forward(ThreadPool& pool, float* out, float* mean, float* rstd, const float* inp,
                       const float* w, const float* b, int64_t N, int64_t C) {
  TS_CHECK(N >= 0 && C > 0, "[layernorm_forward] bad shape N=", N, " C=", C);
  HWY_DYNAMIC_DISPATCH(LayerNormForward)(pool, out, mean, rstd, inp, w, b, N, C);
}

void layernorm_backward(ThreadPool& pool, float* dinp, float* dw, float* db, const float* dout,
                        const float* inp, const float* w, const float* mean, const float* rstd,
                        int64_t N, int64_t C) {
  TS_CHECK(N >= 0 && C > 0, "[layernorm_backward] bad shape N=", N, " C=", C);
  if (N == 0) return;
  // Rows per partial: depends only on (N, C); at most 256 partials (2C floats each), kept in a
  // per-calling-thread buffer that grows once and is then reused (no allocation per step).
  const int64_t rows = std::max<int64_t>(std::max<int64_t>(1, 16384 / C), (N + 255) / 256);
  const int64_t n_chunks = (N + rows - 1) / rows;
  thread_local std::vector<float> partial;
  const size_t need = static_cast<size_t>(n_chunks * 2 * C);
  if (partial.size() < need) partial.resize(need);
  HWY_DYNAMIC_DISPATCH(LayerNormBackward)
  (pool, dinp, dw, db, dout, inp, w, mean, rstd, N, C, rows, partial.data());
}

}  // namespace tessera::cpu
#endif  // HWY_ONCE
