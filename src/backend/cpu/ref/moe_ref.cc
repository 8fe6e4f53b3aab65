// Reference of the mixture-of-experts router (ops::moe_route): softmax and normalization in
// double, the top k by a stable sort of the ids on descending logits.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/ref/ref_kernels.h"

namespace tessera::cpu::ref {

void moe_route(int32_t* ids, float* weights, const float* logits, int64_t n, int64_t E, int64_t k,
               bool normalize) {
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t r = 0; r < n; ++r) {
    const float* x = logits + r * E;
    double mx = x[0], sum = 0.0;
    for (int64_t e = 1; e < E; ++e) mx = std::max(mx, static_cast<double>(x[e]));
    for (int64_t e = 0; e < E; ++e) sum += std::exp(x[e] - mx);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return x[a] > x[b]; });
    double chosen = 0.0;
    for (int64_t j = 0; j < k; ++j) chosen += std::exp(x[order[static_cast<size_t>(j)]] - mx) / sum;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = order[static_cast<size_t>(j)];
      const double p = std::exp(x[e] - mx) / sum;
      ids[r * k + j] = e;
      weights[r * k + j] = static_cast<float>(normalize ? p / chosen : p);
    }
  }
}

}  // namespace tessera::cpu::ref
