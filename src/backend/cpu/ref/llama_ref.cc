// Reference Llama ops: RMSNorm, RoPE (both pair layouts) and the gated activations, forward and
// backward; every value is computed in double and rounded once, so these are the oracle for the
// tests.
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/ref/ref_kernels.h"
#include "core/error.h"

namespace tessera::cpu::ref {

namespace {

void check_rmsnorm(const char* op, int64_t N, int64_t C) {
  TS_CHECK(C > 0, "[", op, "] width C=", C, " must be positive");
  TS_CHECK(N >= 0, "[", op, "] rows N=", N, " must be >= 0");
}

void check_glu(const char* op, int64_t N, int64_t F) {
  TS_CHECK(F > 0, "[", op, "] width F=", F, " must be positive");
  TS_CHECK(N >= 0, "[", op, "] rows N=", N, " must be >= 0");
}

// Rotates every head of x by the angles of its token's position times `sign` (+1 forward,
// -1 backward). The angle of pair i is pos * theta^(-2i/R), evaluated exactly as
// make_rope_table does (so the two differ only by the table's one rounding of cos and sin).
void rope_apply(float* out, const float* inp, const ops::RopeTable& table, const int32_t* positions,
                int64_t pos0, int64_t B, int64_t T, int64_t H, int64_t D, ops::RopeLayout layout,
                double sign) {
  const int64_t R = table.rotary_dim, half = R / 2;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const double pos = positions ? positions[t] : static_cast<double>(pos0 + t);
      for (int64_t h = 0; h < H; ++h) {
        const int64_t base = ((b * T + t) * H + h) * D;
        const float* x = inp + base;
        float* o = out + base;
        for (int64_t i = 0; i < half; ++i) {
          const double inv_freq = table.inv_freq[static_cast<size_t>(i)];
          const double angle = pos * inv_freq;
          const double c = table.scale * std::cos(angle), s = sign * table.scale * std::sin(angle);
          const int64_t ia = layout == ops::RopeLayout::half ? i : 2 * i;
          const int64_t ib = layout == ops::RopeLayout::half ? i + half : 2 * i + 1;
          const double xa = x[ia], xb = x[ib];
          o[ia] = static_cast<float>(xa * c - xb * s);
          o[ib] = static_cast<float>(xb * c + xa * s);
        }
        if (o != x) std::memcpy(o + R, x + R, static_cast<size_t>(D - R) * sizeof(float));
      }
    }
  }
}

// sigmoid(g) and 1 - sigmoid(g), each without cancellation or overflow.
void sigmoid_pair(double g, double* s, double* sm) {
  *s = 1.0 / (1.0 + std::exp(-g));
  *sm = 1.0 / (1.0 + std::exp(g));
}

}  // namespace

void check_rope_args(const char* op, const ops::RopeTable& table, const int32_t* positions,
                     int64_t pos0, int64_t B, int64_t T, int64_t H, int64_t D) {
  const int64_t R = table.rotary_dim;
  TS_CHECK(R > 0 && R % 2 == 0, "[", op, "] rotary_dim=", R, " must be positive and even");
  TS_CHECK(D > 0, "[", op, "] head dim D=", D, " must be positive");
  TS_CHECK(R <= D, "[", op, "] rotary_dim=", R, " exceeds head dim D=", D);
  TS_CHECK(B >= 0 && T >= 0 && H >= 0, "[", op, "] negative size B=", B, " T=", T, " H=", H);
  TS_CHECK(table.max_pos >= 0 && table.cos.size() == static_cast<size_t>(table.max_pos * (R / 2)) &&
               table.sin.size() == table.cos.size(),
           "[", op, "] rope table holds ", table.cos.size(), " cos and ", table.sin.size(),
           " sin values, expected max_pos * rotary_dim / 2 = ", table.max_pos * (R / 2));
  TS_CHECK(table.inv_freq.size() == static_cast<size_t>(R / 2), "[", op, "] rope table holds ",
           table.inv_freq.size(), " frequencies, expected rotary_dim / 2 = ", R / 2);
  if (T == 0) return;
  if (positions) {
    for (int64_t t = 0; t < T; ++t)
      TS_CHECK(positions[t] >= 0 && positions[t] < table.max_pos, "[", op, "] positions[", t,
               "]=", positions[t], " outside the rope table's [0, ", table.max_pos, ")");
  } else {
    TS_CHECK(pos0 >= 0 && pos0 + T <= table.max_pos, "[", op, "] pos0=", pos0, " with T=", T,
             " runs outside the rope table's [0, ", table.max_pos, ")");
  }
}

// out = x * r * w, r = 1 / sqrt(mean(x^2) + eps).
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, int64_t N,
                     int64_t C, float eps) {
  check_rmsnorm("rmsnorm_forward", N, C);
  TS_CHECK(eps >= 0.0f, "[rmsnorm_forward] eps=", eps, " must be >= 0");
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * C;
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += static_cast<double>(x[c]) * x[c];
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(C) + eps);
    float* o = out + n * C;
    for (int64_t c = 0; c < C; ++c) o[c] = static_cast<float>(x[c] * r * w[c]);
    rstd[n] = static_cast<float>(r);
  }
}

void head_rmsnorm(float* x, int64_t ld, int64_t n, int64_t heads, int64_t D, const float* w,
                  float eps) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      float* s = x + r * ld + h * D;
      double ss = 0;
      for (int64_t d = 0; d < D; ++d) ss += static_cast<double>(s[d]) * s[d];
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(D) + eps);
      for (int64_t d = 0; d < D; ++d) s[d] = static_cast<float>(s[d] * inv * w[d]);
    }
}

void head_rmsnorm_backward(float* dx, float* dw, const float* dy, const float* x, int64_t ld,
                           int64_t ld_x, int64_t n, int64_t heads, int64_t D, const float* w,
                           float eps) {
  std::vector<double> g(static_cast<size_t>(D));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      const float* xs = x + r * ld_x + h * D;
      const float* dys = dy + r * ld + h * D;
      double ss = 0;
      for (int64_t d = 0; d < D; ++d) ss += static_cast<double>(xs[d]) * xs[d];
      const double rs = 1.0 / std::sqrt(ss / static_cast<double>(D) + eps);
      double mean = 0;
      for (int64_t d = 0; d < D; ++d) {
        g[static_cast<size_t>(d)] = static_cast<double>(dys[d]) * w[d];
        mean += g[static_cast<size_t>(d)] * xs[d] * rs;
        dw[d] += static_cast<float>(static_cast<double>(dys[d]) * xs[d] * rs);
      }
      mean /= static_cast<double>(D);
      float* dxs = dx + r * ld + h * D;  // may be dys: each element read before it is written
      for (int64_t d = 0; d < D; ++d)
        dxs[d] = static_cast<float>(rs * (g[static_cast<size_t>(d)] - xs[d] * rs * mean));
    }
}

// With xhat = x r and g = dout w, and dr/dx_j = -r^3 x_j / C:
//   dinp += r (g - xhat mean(g xhat)),  dw += dout xhat.
void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, int64_t N, int64_t C) {
  check_rmsnorm("rmsnorm_backward", N, C);
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * C;
    const float* dy = dout + n * C;
    const double r = rstd[n];
    double gx_mean = 0;
    for (int64_t c = 0; c < C; ++c) gx_mean += static_cast<double>(dy[c]) * w[c] * x[c] * r;
    gx_mean /= static_cast<double>(C);
    float* di = dinp + n * C;
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = x[c] * r;
      di[c] += static_cast<float>(r * (static_cast<double>(dy[c]) * w[c] - xhat * gx_mean));
      dw[c] += static_cast<float>(dy[c] * xhat);
    }
  }
}

void rope_forward(float* out, const float* inp, const ops::RopeTable& table,
                  const int32_t* positions, int64_t pos0, int64_t B, int64_t T, int64_t H,
                  int64_t D, ops::RopeLayout layout) {
  check_rope_args("rope_forward", table, positions, pos0, B, T, H, D);
  rope_apply(out, inp, table, positions, pos0, B, T, H, D, layout, 1.0);
}

void rope_backward(float* dinp, const float* dout, const ops::RopeTable& table,
                   const int32_t* positions, int64_t pos0, int64_t B, int64_t T, int64_t H,
                   int64_t D, ops::RopeLayout layout) {
  check_rope_args("rope_backward", table, positions, pos0, B, T, H, D);
  rope_apply(dinp, dout, table, positions, pos0, B, T, H, D, layout, -1.0);
}

void glu_forward(float* out, const float* gate, const float* up, int64_t N, int64_t F,
                 ops::GluAct act) {
  check_glu("glu_forward", N, F);
  for (int64_t i = 0; i < N * F; ++i) {
    double a;
    if (act == ops::GluAct::silu) {
      double s, sm;
      sigmoid_pair(gate[i], &s, &sm);
      a = gate[i] * s;
    } else {
      a = gelu(gate[i]);
    }
    out[i] = static_cast<float>(a * up[i]);
  }
}

// silu'(g) = s + g s (1 - s) = s (1 + g (1 - s)); gelu' as gelu_grad.
void glu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                  int64_t N, int64_t F, ops::GluAct act) {
  check_glu("glu_backward", N, F);
  for (int64_t i = 0; i < N * F; ++i) {
    const double g = gate[i], u = up[i], dy = dout[i];
    double a, da;
    if (act == ops::GluAct::silu) {
      double s, sm;
      sigmoid_pair(g, &s, &sm);
      a = g * s;
      da = s * (1.0 + g * sm);
    } else {
      a = gelu(g);
      da = gelu_grad(g);
    }
    dgate[i] = static_cast<float>(dy * u * da);
    dup[i] = static_cast<float>(dy * a);
  }
}

}  // namespace tessera::cpu::ref
