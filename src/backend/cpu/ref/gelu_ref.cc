// Reference elementwise kernels: GELU (tanh approximation) forward/backward, add, scale,
// sum of squares. Evaluated in double and rounded once, so they are accurate oracles.
#include <cmath>

#include "backend/cpu/ref/ref_kernels.h"

namespace tessera::cpu::ref {

namespace {
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi)
constexpr double kGeluCubic = 0.044715;

// 0.5 (1 + tanh(u)) is evaluated as the identical sigmoid(2u) = 1 / (1 + exp(-2u)): for very
// negative x, 1 + tanh(u) cancels to 0 even in double, while the sigmoid form keeps full
// relative accuracy (gelu(-9) ~ -1e-26 is still a normal float).
double gelu_sigmoid(double x, double* e) {
  const double u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  *e = std::exp(-2.0 * u);
  return 1.0 / (1.0 + *e);
}
}  // namespace

double gelu(double x) {
  double e;
  return x * gelu_sigmoid(x, &e);
}

// With s = sigmoid(2u): gelu' = s + x * 2 s (1 - s) * u'(x), and 1 - s = 1 / (1 + 1/e), which
// stays exact (no cancellation) and is 1, not NaN, when e overflows to inf.
double gelu_grad(double x) {
  double e;
  const double s = gelu_sigmoid(x, &e);
  const double one_minus_s = 1.0 / (1.0 + 1.0 / e);
  const double du = kSqrt2OverPi * (1.0 + 3.0 * kGeluCubic * x * x);
  return s + x * 2.0 * s * one_minus_s * du;
}

// out (n) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(float* out, const float* inp, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(gelu(inp[i]));
}

// dinp (n) = gelu'(inp) * dout; dinp may alias dout (each element is read before written).
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dinp[i] = static_cast<float>(gelu_grad(inp[i]) * dout[i]);
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
