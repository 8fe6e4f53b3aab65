// The tanh GELU's factor for the Highway kernels, compiled once per SIMD target: GELU
// (elementwise.cc) and GeGLU (llama_ops.cc) share it. Included after hwy/foreach_target.h.
#if defined(TESSERA_BACKEND_CPU_GELU_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TESSERA_BACKEND_CPU_GELU_INL_H_
#undef TESSERA_BACKEND_CPU_GELU_INL_H_
#else
#define TESSERA_BACKEND_CPU_GELU_INL_H_
#endif

#include "hwy/highway.h"
// Separate block: math-inl.h needs highway.h first (and include sorting would swap them).
#include "hwy/contrib/math/math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tessera::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

inline constexpr double kSqrt2OverPi = 0.79788456080286535588;
inline constexpr double kGeluCubic = 0.044715;

// gelu(x) = x s with s = 0.5 (1 + tanh(u)) == 1 / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715
// x^3), returned with e = exp(-2u). The sigmoid form has no cancellation for negative x (where
// 1 + tanh(u) loses all digits) and costs one Exp. -2u is capped at 80 so Exp stays in range
// (exp(80) ~ 5.5e34; the factor is then below 2e-35, i.e. gelu is ~0 anyway).
template <class D, class V>
HWY_INLINE V GeluFactor(D d, V x, V* e_out) {
  const V x2 = hn::Mul(x, x);
  const V u = hn::Mul(x, hn::MulAdd(hn::Set(d, static_cast<float>(kSqrt2OverPi * kGeluCubic)), x2,
                                    hn::Set(d, static_cast<float>(kSqrt2OverPi))));
  const V e = hn::Exp(d, hn::Min(hn::Mul(hn::Set(d, -2.0f), u), hn::Set(d, 80.0f)));
  *e_out = e;
  return hn::Div(hn::Set(d, 1.0f), hn::Add(hn::Set(d, 1.0f), e));
}

// gelu'(x) = s + x s (1 - s) 2 u'(x), with 1 - s = e s (cancellation-free) and u'(x) = sqrt(2/pi)
// (1 + 3 * 0.044715 x^2).
template <class D, class V>
HWY_INLINE V GeluGrad(D d, V x) {
  V e;
  const V s = GeluFactor(d, x, &e);
  const V du2 = hn::MulAdd(hn::Set(d, static_cast<float>(2 * kSqrt2OverPi * 3 * kGeluCubic)),
                           hn::Mul(x, x), hn::Set(d, static_cast<float>(2 * kSqrt2OverPi)));
  const V ds = hn::Mul(hn::Mul(s, hn::Mul(e, s)), du2);
  return hn::MulAdd(x, ds, s);
}

}  // namespace tessera::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // TESSERA_BACKEND_CPU_GELU_INL_H_
