// The mixture-of-experts router on the CPU (ops::moe_route): softmax in f32 as llama.cpp and the
// CUDA kernel compute it, then the top k by repeated scans (k is 1 to 8 in the models we run,
// against 8 to 128 experts: no sort pays).
#include <cmath>

#include "backend/cpu/cpu_kernels.h"

namespace tessera::cpu {

namespace {

// A row's softmax over its E logits, in f32: p(v) = exp(v - max) / sum (forward and backward
// compute it alike, so the backward's p are the forward's bits).
struct Softmax {
  float mx = 0.0f, sum = 0.0f;
  float p(float v) const { return std::exp(v - mx) / sum; }
};
Softmax softmax_of(const float* x, int64_t E) {
  Softmax s;
  s.mx = x[0];
  for (int64_t e = 1; e < E; ++e) s.mx = std::fmax(s.mx, x[e]);
  for (int64_t e = 0; e < E; ++e) s.sum += std::exp(x[e] - s.mx);
  return s;
}

}  // namespace

void moe_route(ThreadPool& pool, int32_t* ids, float* weights, const float* logits, int64_t n,
               int64_t E, int64_t k, bool normalize) {
  (void)pool;  // a few thousand values a layer
  for (int64_t r = 0; r < n; ++r) {
    const float* x = logits + r * E;
    int32_t* id = ids + r * k;
    float* w = weights + r * k;
    const Softmax sm = softmax_of(x, E);
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
      w[j] = sm.p(x[best]);
      chosen += w[j];
    }
    if (normalize)
      for (int64_t j = 0; j < k; ++j) w[j] /= chosen;
  }
}

// Per row: p recomputed as the forward computes it, then the closed forms of ops.h.
void moe_route_backward(ThreadPool& pool, float* dlogits, const float* dweights, const int32_t* ids,
                        const float* logits, int64_t n, int64_t E, int64_t k, bool normalize) {
  (void)pool;  // a few thousand values a layer, like the forward
  for (int64_t r = 0; r < n; ++r) {
    const float* x = logits + r * E;
    const int32_t* id = ids + r * k;
    const float* dw = dweights + r * k;
    float* d = dlogits + r * E;
    const Softmax sm = softmax_of(x, E);
    float chosen = 0.0f;  // S, the chosen experts' share of p
    for (int64_t j = 0; j < k; ++j) chosen += sm.p(x[id[j]]);
    auto w = [&](int64_t j) {  // the forward's weight of choice j
      const float p = sm.p(x[id[j]]);
      return normalize ? p / chosen : p;
    };
    float s = 0.0f;
    for (int64_t j = 0; j < k; ++j) s += dw[j] * w(j);
    if (normalize) {
      for (int64_t e = 0; e < E; ++e) d[e] = 0.0f;
      for (int64_t j = 0; j < k; ++j) d[id[j]] = w(j) * (dw[j] - s);
    } else {
      for (int64_t e = 0; e < E; ++e) d[e] = -sm.p(x[e]) * s;
      for (int64_t j = 0; j < k; ++j) d[id[j]] += w(j) * dw[j];
    }
  }
}

}  // namespace tessera::cpu
