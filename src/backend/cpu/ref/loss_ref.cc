// Reference fused softmax + cross-entropy (max-subtracted, accumulated in double).
#include <algorithm>
#include <cmath>

#include "backend/cpu/ref/ref_kernels.h"
#include "core/error.h"

namespace tessera::cpu::ref {

// losses (N); logits (N,Vp) with V real columns; targets (N) in [0,V) or < 0 for "ignore".
// When dlogits_scale != 0 each row of logits becomes dlogits_scale * (softmax - onehot(target)),
// with padded columns [V,Vp) set to 0 and ignored rows set to 0 entirely.
void softmax_xent(float* losses, float* logits, const int32_t* targets, int64_t N, int64_t V,
                  int64_t Vp, float dlogits_scale) {
  TS_CHECK(N >= 0 && V > 0 && Vp >= V, "[softmax_xent] bad shape N=", N, " V=", V, " Vp=", Vp);
  for (int64_t n = 0; n < N; ++n)  // validate first: a bad target leaves the buffers untouched
    TS_CHECK(targets[n] < V, "[softmax_xent] targets[", n, "] = ", targets[n],
             " is not below vocab V=", V);
  for (int64_t n = 0; n < N; ++n) {
    float* x = logits + n * Vp;
    const int32_t target = targets[n];
    if (target < 0) {
      losses[n] = 0.0f;
      if (dlogits_scale != 0.0f)
        for (int64_t j = 0; j < Vp; ++j) x[j] = 0.0f;
      continue;
    }
    double mx = x[0];
    for (int64_t j = 1; j < V; ++j) mx = std::max(mx, static_cast<double>(x[j]));
    double sum = 0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(x[j] - mx);
    losses[n] = static_cast<float>(std::log(sum) - (x[target] - mx));
    if (dlogits_scale == 0.0f) continue;
    for (int64_t j = 0; j < V; ++j) {
      const double p = std::exp(x[j] - mx) / sum;
      x[j] = static_cast<float>((p - (j == target ? 1.0 : 0.0)) * dlogits_scale);
    }
    for (int64_t j = V; j < Vp; ++j) x[j] = 0.0f;
  }
}

}  // namespace tessera::cpu::ref
