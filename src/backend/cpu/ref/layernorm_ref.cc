// Reference layer normalization, forward and backward; row statistics accumulate in double.
#include <cmath>

#include "backend/cpu/ref/ref_kernels.h"
#include "core/error.h"

namespace tessera::cpu::ref {

namespace {
constexpr double kEps = 1e-5;
}  // namespace

// out (N,C) = (inp - mean) * rstd * w + b; mean (N), rstd (N) saved for backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, int64_t N, int64_t C) {
  TS_CHECK(N >= 0 && C > 0, "[layernorm_forward] bad shape N=", N, " C=", C);
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * C;
    double sum = 0;
    for (int64_t c = 0; c < C; ++c) sum += x[c];
    const double m = sum / static_cast<double>(C);
    double var = 0;
    for (int64_t c = 0; c < C; ++c) var += (x[c] - m) * (x[c] - m);
    var /= static_cast<double>(C);
    const double s = 1.0 / std::sqrt(var + kEps);
    float* o = out + n * C;
    for (int64_t c = 0; c < C; ++c) o[c] = static_cast<float>((x[c] - m) * s * w[c] + b[c]);
    mean[n] = static_cast<float>(m);
    rstd[n] = static_cast<float>(s);
  }
}

// With xhat = (x - mean) * rstd and g = dout * w (per row):
//   dinp += rstd * (g - mean(g) - xhat * mean(g * xhat)),  dw += dout * xhat,  db += dout.
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, int64_t N,
                        int64_t C) {
  TS_CHECK(N >= 0 && C > 0, "[layernorm_backward] bad shape N=", N, " C=", C);
  for (int64_t n = 0; n < N; ++n) {
    const float* x = inp + n * C;
    const float* d = dout + n * C;
    const double m = mean[n], s = rstd[n];
    double g_mean = 0, gx_mean = 0;
    for (int64_t c = 0; c < C; ++c) {
      const double g = static_cast<double>(d[c]) * w[c];
      g_mean += g;
      gx_mean += g * (x[c] - m) * s;
    }
    g_mean /= static_cast<double>(C);
    gx_mean /= static_cast<double>(C);
    float* di = dinp + n * C;
    for (int64_t c = 0; c < C; ++c) {
      const double xhat = (x[c] - m) * s;
      const double g = static_cast<double>(d[c]) * w[c];
      di[c] += static_cast<float>(s * (g - g_mean - xhat * gx_mean));
      dw[c] += static_cast<float>(d[c] * xhat);
      db[c] += d[c];
    }
  }
}

}  // namespace tessera::cpu::ref
