// Reference AdamW step. Written as a fixed sequence of f32 operations (no fused multiply-add)
// that the SIMD kernel repeats exactly, so both give bit-identical parameters.
#include <cmath>

#include "backend/cpu/ref/ref_kernels.h"
#include "core/error.h"

// No a * b + c contraction into FMA (GCC's C++ default on FMA-capable -march), so this matches
// the SIMD kernel's separately rounded operations on every build.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace tessera::cpu::ref {

// params, grads, m, v (n). g = grads * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g g;
// params -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * params), mhat = m / (1 - b1^t),
// vhat = v / (1 - b2^t), in the form ops::adamw_bias states.
void adamw(float* params, const float* grads, float* m, float* v, int64_t n,
           const ops::AdamWArgs& a) {
  TS_CHECK(a.t >= 1, "[adamw] step t must count from 1, got ", a.t);
  TS_CHECK(a.beta1 >= 0.0f && a.beta1 < 1.0f, "[adamw] beta1 must be in [0, 1), got ", a.beta1);
  TS_CHECK(a.beta2 >= 0.0f && a.beta2 < 1.0f, "[adamw] beta2 must be in [0, 1), got ", a.beta2);
  const ops::AdamWBias bc = ops::adamw_bias(a);
  const float one_minus_b1 = 1.0f - a.beta1, one_minus_b2 = 1.0f - a.beta2;
  for (int64_t i = 0; i < n; ++i) {
    const float g = grads[i] * a.grad_scale;
    const float mi = a.beta1 * m[i] + one_minus_b1 * g;
    const float vi = a.beta2 * v[i] + one_minus_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi * bc.inv_bc1;
    const float denom = std::sqrt(vi) * bc.rsqrt_bc2 + a.eps;
    params[i] -= a.lr * (mhat / denom + a.weight_decay * params[i]);
  }
}

}  // namespace tessera::cpu::ref
