// Reference elementwise kernels: GELU (tanh approximation) forward/backward, add, scale,
// sum of squares. Evaluated in double and rounded once, so they are accurate oracles.
#include <cmath>

#include "backend/cpu/ref/ref_kernels.h"

namespace tessera::cpu::ref {

namespace {
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kGeluCubic = 0.044715;
}  // namespace

// out (n) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(float* out, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double x = inp[i];
    const double u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
    out[i] = static_cast<float>(0.5 * x * (1.0 + std::tanh(u)));
  }
}

// dinp (n) = gelu'(inp) * dout; dinp may alias dout (each element is read before written).
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double x = inp[i];
    const double u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
    const double th = std::tanh(u);
    const double sech2 = 1.0 - th * th;
    const double du = kSqrt2OverPi * (1.0 + 3.0 * kGeluCubic * x * x);
    const double grad = 0.5 * (1.0 + th) + 0.5 * x * sech2 * du;
    dinp[i] = static_cast<float>(grad * dout[i]);
  }
}

// out (n) = a + b; out may alias a or b.
void add(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// Sum of squares in double: each square is exact in double (24+24 < 53 mantissa bits).
double sum_squares(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

// x (n) *= s.
void scale(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

}  // namespace tessera::cpu::ref
