// Highway Llama ops: RMSNorm forward/backward, RoPE (rotate-half and interleaved pairs) from a
// precomputed table, SwiGLU and GeGLU forward/backward. Work is cut into chunks whose boundaries
// depend only on the shapes, and reductions run in a fixed order, so results do not depend on the
// thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/fixed_chunks.h"
#include "backend/cpu/ref/ref_kernels.h"
#include "core/error.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/llama_ops.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// Separate block: these need highway.h first (and include sorting would swap them).
#include "backend/cpu/gelu-inl.h"
#include "hwy/contrib/math/math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tessera::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Column block for the final dw reduction: 256 floats (1 KiB) per partial row.
constexpr int64_t kColBlock = 256;

int64_t RowsPerChunk(int64_t row_elems) {
  return std::max<int64_t>(1, kElementwiseChunk / std::max<int64_t>(row_elems, 1));
}

// ---- RMSNorm ----

void RmsNormForward(ThreadPool& pool, float* out, float* rstd, const float* inp, const float* w,
                    int64_t N, int64_t C, float eps) {
  for_each_chunk(pool, N, RowsPerChunk(C), [&](int64_t, int64_t n0, int64_t n1) {
    const hn::ScalableTag<float> d;
    const int64_t L = static_cast<int64_t>(hn::Lanes(d));
    for (int64_t n = n0; n < n1; ++n) {
      const float* x = inp + n * C;
      // Two accumulators, lanes reduced in a fixed order, then the scalar tail.
      auto a0 = hn::Zero(d), a1 = hn::Zero(d);
      int64_t c = 0;
      for (; c + 2 * L <= C; c += 2 * L) {
        const auto x0 = hn::LoadU(d, x + c), x1 = hn::LoadU(d, x + c + L);
        a0 = hn::MulAdd(x0, x0, a0);
        a1 = hn::MulAdd(x1, x1, a1);
      }
      for (; c + L <= C; c += L) {
        const auto x0 = hn::LoadU(d, x + c);
        a0 = hn::MulAdd(x0, x0, a0);
      }
      float ss = hn::GetLane(hn::SumOfLanes(d, hn::Add(a0, a1)));
      for (; c < C; ++c) ss += x[c] * x[c];
      const float r = 1.0f / std::sqrt(ss / static_cast<float>(C) + eps);
      const auto vr = hn::Set(d, r);
      float* o = out + n * C;
      c = 0;
      for (; c + L <= C; c += L)
        hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(d, x + c), vr), hn::LoadU(d, w + c)), d, o + c);
      for (; c < C; ++c) o[c] = x[c] * r * w[c];
      rstd[n] = r;
    }
  });
}

// With xhat = x r and g = dout w: dinp += r (g - xhat mean(g xhat)), dw += dout xhat.
// Rows [0, N) are cut into chunks of `rows` rows; chunk k writes its partial sum of dout * xhat
// into partial + k * C; dw then adds the partials in chunk order.
void RmsNormBackward(ThreadPool& pool, float* dinp, float* dw, const float* dout, const float* inp,
                     const float* w, const float* rstd, int64_t N, int64_t C, int64_t rows,
                     float* partial) {
  for_each_chunk(pool, N, rows, [&](int64_t k, int64_t n0, int64_t n1) {
    const hn::ScalableTag<float> d;
    const int64_t L = static_cast<int64_t>(hn::Lanes(d));
    float* pw = partial + k * C;
    std::fill(pw, pw + C, 0.0f);
    for (int64_t n = n0; n < n1; ++n) {
      const float* x = inp + n * C;
      const float* dy = dout + n * C;
      const float r = rstd[n];
      const auto vr = hn::Set(d, r);
      auto gx0 = hn::Zero(d);
      int64_t c = 0;
      for (; c + L <= C; c += L) {
        const auto dyv = hn::LoadU(d, dy + c);
        const auto xhat = hn::Mul(hn::LoadU(d, x + c), vr);
        gx0 = hn::MulAdd(hn::Mul(dyv, hn::LoadU(d, w + c)), xhat, gx0);
        hn::StoreU(hn::MulAdd(dyv, xhat, hn::LoadU(d, pw + c)), d, pw + c);
      }
      float gxs = hn::GetLane(hn::SumOfLanes(d, gx0));
      for (int64_t t = c; t < C; ++t) {
        const float xhat = x[t] * r;
        gxs += dy[t] * w[t] * xhat;
        pw[t] += dy[t] * xhat;
      }
      const float gx_mean = gxs / static_cast<float>(C);
      const auto vgxm = hn::Set(d, gx_mean);
      float* di = dinp + n * C;
      c = 0;
      for (; c + L <= C; c += L) {
        const auto g = hn::Mul(hn::LoadU(d, dy + c), hn::LoadU(d, w + c));
        const auto xhat = hn::Mul(hn::LoadU(d, x + c), vr);
        const auto t = hn::NegMulAdd(xhat, vgxm, g);
        hn::StoreU(hn::MulAdd(t, vr, hn::LoadU(d, di + c)), d, di + c);
      }
      for (; c < C; ++c) di[c] += (dy[c] * w[c] - x[c] * r * gx_mean) * r;
    }
  });
  const int64_t n_chunks = (N + rows - 1) / rows;
  for_each_chunk(pool, C, kColBlock, [&](int64_t, int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      float sw = 0;
      for (int64_t k = 0; k < n_chunks; ++k) sw += partial[k * C + c];
      dw[c] += sw;
    }
  });
}

// ---- RoPE ----

// One head: pair i (elements ia, ib) becomes (xa c - xb s, xb c + xa s) with c, s of pair i.
// Both elements are loaded before either is stored, so out may equal inp. `inverse` negates s
// (exactly), giving the rotation by the negative angle.
void RopeHead(float* o, const float* x, const float* cs, const float* sn, int64_t R, int64_t D,
              ops::RopeLayout layout, bool inverse) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d)), half = R / 2;
  int64_t i = 0;
  if (layout == ops::RopeLayout::half) {
    for (; i + L <= half; i += L) {
      const auto c = hn::LoadU(d, cs + i);
      auto s = hn::LoadU(d, sn + i);
      if (inverse) s = hn::Neg(s);
      const auto xa = hn::LoadU(d, x + i), xb = hn::LoadU(d, x + i + half);
      hn::StoreU(hn::NegMulAdd(xb, s, hn::Mul(xa, c)), d, o + i);
      hn::StoreU(hn::MulAdd(xa, s, hn::Mul(xb, c)), d, o + i + half);
    }
    for (; i < half; ++i) {
      const float c = cs[i], s = inverse ? -sn[i] : sn[i];
      const float xa = x[i], xb = x[i + half];
      o[i] = xa * c - xb * s;
      o[i + half] = xb * c + xa * s;
    }
  } else {
    // Even and odd elements are split into two vectors (and merged back on store).
    for (; i + L <= half; i += L) {
      const auto c = hn::LoadU(d, cs + i);
      auto s = hn::LoadU(d, sn + i);
      if (inverse) s = hn::Neg(s);
      hn::Vec<decltype(d)> xa, xb;
      hn::LoadInterleaved2(d, x + 2 * i, xa, xb);
      hn::StoreInterleaved2(hn::NegMulAdd(xb, s, hn::Mul(xa, c)), hn::MulAdd(xa, s, hn::Mul(xb, c)),
                            d, o + 2 * i);
    }
    for (; i < half; ++i) {
      const float c = cs[i], s = inverse ? -sn[i] : sn[i];
      const float xa = x[2 * i], xb = x[2 * i + 1];
      o[2 * i] = xa * c - xb * s;
      o[2 * i + 1] = xb * c + xa * s;
    }
  }
  if (o != x) std::memcpy(o + R, x + R, static_cast<size_t>(D - R) * sizeof(float));
}

// Chunks of whole tokens (all H heads of a token share one table row).
void Rope(ThreadPool& pool, float* out, const float* inp, const ops::RopeTable& table,
          const int32_t* positions, int64_t pos0, int64_t B, int64_t T, int64_t H, int64_t D,
          ops::RopeLayout layout, bool inverse) {
  const int64_t R = table.rotary_dim, half = R / 2;
  const float* cos_tab = table.cos.data();
  const float* sin_tab = table.sin.data();
  for_each_chunk(pool, B * T, RowsPerChunk(H * D), [&](int64_t, int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = r % T;
      const int64_t pos = positions ? positions[t] : pos0 + t;
      const float* cs = cos_tab + pos * half;
      const float* sn = sin_tab + pos * half;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t base = (r * H + h) * D;
        RopeHead(out + base, inp + base, cs, sn, R, D, layout, inverse);
      }
    }
  });
}

// ---- SwiGLU ----

// s = sigmoid(g) and sm = 1 - s from e = exp(-|g|) <= 1: never overflows (Exp's valid range
// ends at +104) and neither value is formed by a cancelling subtraction.
template <class D, class V>
HWY_INLINE void SigmoidPair(D d, V g, V* s, V* sm) {
  const V e = hn::Exp(d, hn::Neg(hn::Abs(g)));
  const V r = hn::Div(hn::Set(d, 1.0f), hn::Add(hn::Set(d, 1.0f), e));
  const V er = hn::Mul(e, r);
  const auto pos = hn::Ge(g, hn::Zero(d));
  *s = hn::IfThenElse(pos, r, er);
  *sm = hn::IfThenElse(pos, er, r);
}

// Runs op on whole vectors of [0, n), then on the tail through zero-padded buffers, so every
// element gets the same arithmetic wherever it falls and nothing past n is touched.
// op(a, b, c, &y0, &y1) maps three input vectors to two outputs (y1 ignored if out1 is null).
template <class D, class Op>
HWY_INLINE void Map3To2(D d, float* out0, float* out1, const float* a, const float* b,
                        const float* c, int64_t n, const Op& op) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    hn::Vec<D> y0, y1;
    op(hn::LoadU(d, a + i), hn::LoadU(d, b + i), hn::LoadU(d, c + i), &y0, &y1);
    hn::StoreU(y0, d, out0 + i);
    if (out1) hn::StoreU(y1, d, out1 + i);
  }
  if (i < n) {
    HWY_ALIGN float ba[HWY_MAX_BYTES / sizeof(float)] = {};
    HWY_ALIGN float bb[HWY_MAX_BYTES / sizeof(float)] = {};
    HWY_ALIGN float bc[HWY_MAX_BYTES / sizeof(float)] = {};
    const size_t rem = static_cast<size_t>(n - i);
    std::memcpy(ba, a + i, rem * sizeof(float));
    std::memcpy(bb, b + i, rem * sizeof(float));
    std::memcpy(bc, c + i, rem * sizeof(float));
    hn::Vec<D> y0, y1;
    op(hn::Load(d, ba), hn::Load(d, bb), hn::Load(d, bc), &y0, &y1);
    hn::Store(y0, d, ba);
    hn::Store(y1, d, bb);
    std::memcpy(out0 + i, ba, rem * sizeof(float));
    if (out1) std::memcpy(out1 + i, bb, rem * sizeof(float));
  }
}

void SwigluForward(ThreadPool& pool, float* out, const float* gate, const float* up, int64_t n) {
  for_each_chunk(pool, n, kElementwiseChunk, [&](int64_t, int64_t i0, int64_t i1) {
    const hn::ScalableTag<float> d;
    Map3To2(d, out + i0, nullptr, gate + i0, up + i0, up + i0, i1 - i0,
            [d](auto g, auto u, auto, auto* y0, auto* y1) {
              decltype(g) s, sm;
              SigmoidPair(d, g, &s, &sm);
              *y0 = hn::Mul(hn::Mul(g, s), u);
              *y1 = *y0;
            });
  });
}

// silu'(g) = s (1 + g (1 - s)); dgate = dout u silu'(g), dup = dout g s.
void SwigluBackward(ThreadPool& pool, float* dgate, float* dup, const float* dout,
                    const float* gate, const float* up, int64_t n) {
  for_each_chunk(pool, n, kElementwiseChunk, [&](int64_t, int64_t i0, int64_t i1) {
    const hn::ScalableTag<float> d;
    Map3To2(d, dgate + i0, dup + i0, dout + i0, gate + i0, up + i0, i1 - i0,
            [d](auto dy, auto g, auto u, auto* y0, auto* y1) {
              decltype(g) s, sm;
              SigmoidPair(d, g, &s, &sm);
              const auto dsilu = hn::Mul(s, hn::MulAdd(g, sm, hn::Set(d, 1.0f)));
              *y0 = hn::Mul(hn::Mul(dy, u), dsilu);
              *y1 = hn::Mul(dy, hn::Mul(g, s));
            });
  });
}

void GegluForward(ThreadPool& pool, float* out, const float* gate, const float* up, int64_t n) {
  for_each_chunk(pool, n, kElementwiseChunk, [&](int64_t, int64_t i0, int64_t i1) {
    const hn::ScalableTag<float> d;
    Map3To2(d, out + i0, nullptr, gate + i0, up + i0, up + i0, i1 - i0,
            [d](auto g, auto u, auto, auto* y0, auto* y1) {
              decltype(g) e;
              *y0 = hn::Mul(hn::Mul(g, GeluFactor(d, g, &e)), u);
              *y1 = *y0;
            });
  });
}

// dgate = dout u gelu'(g), dup = dout gelu(g).
void GegluBackward(ThreadPool& pool, float* dgate, float* dup, const float* dout, const float* gate,
                   const float* up, int64_t n) {
  for_each_chunk(pool, n, kElementwiseChunk, [&](int64_t, int64_t i0, int64_t i1) {
    const hn::ScalableTag<float> d;
    Map3To2(d, dgate + i0, dup + i0, dout + i0, gate + i0, up + i0, i1 - i0,
            [d](auto dy, auto g, auto u, auto* y0, auto* y1) {
              decltype(g) e;
              const auto a = hn::Mul(g, GeluFactor(d, g, &e));
              *y0 = hn::Mul(hn::Mul(dy, u), GeluGrad(d, g));
              *y1 = hn::Mul(dy, a);
            });
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace tessera::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tessera::cpu {

HWY_EXPORT(RmsNormForward);
HWY_EXPORT(RmsNormBackward);
HWY_EXPORT(Rope);
HWY_EXPORT(SwigluForward);
HWY_EXPORT(SwigluBackward);
HWY_EXPORT(GegluForward);
HWY_EXPORT(GegluBackward);

namespace {

void check_rows(const char* op, const char* width, int64_t N, int64_t C) {
  TS_CHECK(C > 0, "[", op, "] width ", width, "=", C, " must be positive");
  TS_CHECK(N >= 0, "[", op, "] rows N=", N, " must be >= 0");
}

}  // namespace

void rmsnorm_forward(ThreadPool& pool, float* out, float* rstd, const float* inp, const float* w,
                     int64_t N, int64_t C, float eps) {
  check_rows("rmsnorm_forward", "C", N, C);
  TS_CHECK(eps >= 0.0f, "[rmsnorm_forward] eps=", eps, " must be >= 0");
  HWY_DYNAMIC_DISPATCH(RmsNormForward)(pool, out, rstd, inp, w, N, C, eps);
}

void rmsnorm_backward(ThreadPool& pool, float* dinp, float* dw, const float* dout, const float* inp,
                      const float* w, const float* rstd, int64_t N, int64_t C) {
  check_rows("rmsnorm_backward", "C", N, C);
  if (N == 0) return;
  // Rows per partial depend only on (N, C); at most 256 partials of C floats, kept in a
  // per-calling-thread buffer that grows once and is then reused (no allocation per step).
  const int64_t rows = std::max<int64_t>(std::max<int64_t>(1, 16384 / C), (N + 255) / 256);
  const int64_t n_chunks = (N + rows - 1) / rows;
  thread_local std::vector<float> partial;
  const size_t need = static_cast<size_t>(n_chunks * C);
  if (partial.size() < need) partial.resize(need);
  HWY_DYNAMIC_DISPATCH(RmsNormBackward)
  (pool, dinp, dw, dout, inp, w, rstd, N, C, rows, partial.data());
}

void head_rmsnorm(ThreadPool& pool, float* x, int64_t ld, int64_t n, int64_t heads, int64_t D,
                  const float* w, float eps) {
  // A few hundred floats per row: rows in chunks of 16, each slice's sum in f32 then a multiply.
  pool.parallel_for(n, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t h = 0; h < heads; ++h) {
        float* s = x + r * ld + h * D;
        float ss = 0.0f;
        for (int64_t d = 0; d < D; ++d) ss += s[d] * s[d];
        const float inv = 1.0f / std::sqrt(ss / static_cast<float>(D) + eps);
        for (int64_t d = 0; d < D; ++d) s[d] = s[d] * inv * w[d];
      }
  });
}

void rope_forward(ThreadPool& pool, float* out, const float* inp, const ops::RopeTable& table,
                  const int32_t* positions, int64_t pos0, int64_t B, int64_t T, int64_t H,
                  int64_t D, ops::RopeLayout layout) {
  ref::check_rope_args("rope_forward", table, positions, pos0, B, T, H, D);
  HWY_DYNAMIC_DISPATCH(Rope)(pool, out, inp, table, positions, pos0, B, T, H, D, layout, false);
}

void rope_backward(ThreadPool& pool, float* dinp, const float* dout, const ops::RopeTable& table,
                   const int32_t* positions, int64_t pos0, int64_t B, int64_t T, int64_t H,
                   int64_t D, ops::RopeLayout layout) {
  ref::check_rope_args("rope_backward", table, positions, pos0, B, T, H, D);
  HWY_DYNAMIC_DISPATCH(Rope)(pool, dinp, dout, table, positions, pos0, B, T, H, D, layout, true);
}

void glu_forward(ThreadPool& pool, float* out, const float* gate, const float* up, int64_t N,
                 int64_t F, ops::GluAct act) {
  check_rows("glu_forward", "F", N, F);
  if (act == ops::GluAct::silu)
    HWY_DYNAMIC_DISPATCH(SwigluForward)(pool, out, gate, up, N * F);
  else
    HWY_DYNAMIC_DISPATCH(GegluForward)(pool, out, gate, up, N * F);
}

void glu_backward(ThreadPool& pool, float* dgate, float* dup, const float* dout, const float* gate,
                  const float* up, int64_t N, int64_t F, ops::GluAct act) {
  check_rows("glu_backward", "F", N, F);
  if (act == ops::GluAct::silu)
    HWY_DYNAMIC_DISPATCH(SwigluBackward)(pool, dgate, dup, dout, gate, up, N * F);
  else
    HWY_DYNAMIC_DISPATCH(GegluBackward)(pool, dgate, dup, dout, gate, up, N * F);
}

}  // namespace tessera::cpu
#endif  // HWY_ONCE
