// The mixture-of-experts router on the CPU (ops::moe_route): softmax in f32 as llama.cpp and the
// CUDA kernel compute it, then the top k by repeated scans (k is 1 to 8 in the models we run,
// against 8 to 128 experts: no sort pays).
#include <cmath>

#include "backend/cpu/cpu_kernels.h"

namespace tessera::cpu {

void moe_route(ThreadPool& pool, int32_t* ids, float* weights, const float* logits, int64_t n,
               int64_t E, int64_t k, bool normalize) {
  (void)pool;  // a few thousand values a layer
  for (int64_t r = 0; r < n; ++r) {
    const float* x = logits + r * E;
    int32_t* id = ids + r * k;
    float* w = weights + r * k;
    float mx = x[0];
    for (int64_t e = 1; e < E; ++e) mx = std::fmax(mx, x[e]);
    float sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(x[e] - mx);
    // The j-th choice: the largest logit not chosen yet (the lower id on ties); p follows it.
    float chosen = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < E; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken = taken || id[i] == e;
        if (!taken && (best < 0 || x[e] > x[best])) best = e;
      }
      id[j] = static_cast<int32_t>(best);
      w[j] = std::exp(x[best] - mx) / sum;
      chosen += w[j];
    }
    if (normalize)
      for (int64_t j = 0; j < k; ++j) w[j] /= chosen;
  }
}

}  // namespace tessera::cpu

namespace tessera::cpu {

// Per row: p recomputed as the forward computes it, then the closed forms of ops.h.
void moe_route_backward(ThreadPool& pool, float* dlogits, const float* dweights, const int32_t* ids,
                        const float* logits, int64_t n, int64_t E, int64_t k, bool normalize) {
  (void)pool;  // a few thousand values a layer, like the forward
  for (int64_t r = 0; r < n; ++r) {
    const float* x = logits + r * E;
    const int32_t* id = ids + r * k;
    const float* dw = dweights + r * k;
    float* d = dlogits + r * E;
    float mx = x[0];
    for (int64_t e = 1; e < E; ++e) mx = std::fmax(mx, x[e]);
    float sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) sum += std::exp(x[e] - mx);
    float chosen = 0.0f;  // S, the chosen experts' share of p
    for (int64_t j = 0; j < k; ++j) chosen += std::exp(x[id[j]] - mx) / sum;
    auto w = [&](int64_t j) {  // the forward's weight of choice j
      const float p = std::exp(x[id[j]] - mx) / sum;
      return normalize ? p / chosen : p;
    };
    float s = 0.0f;
    for (int64_t j = 0; j < k; ++j) s += dw[j] * w(j);
    if (normalize) {
      for (int64_t e = 0; e < E; ++e) d[e] = 0.0f;
      for (int64_t j = 0; j < k; ++j) d[id[j]] = w(j) * (dw[j] - s);
    } else {
      for (int64_t e = 0; e < E; ++e) d[e] = -(std::exp(x[e] - mx) / sum) * s;
      for (int64_t j = 0; j < k; ++j) d[id[j]] += w(j) * dw[j];
    }
  }
}

}  // namespace tessera::cpu
