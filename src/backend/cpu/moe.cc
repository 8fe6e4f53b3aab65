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
