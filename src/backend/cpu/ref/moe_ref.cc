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

namespace tessera::cpu::ref {

// The chain rule written out over the full softmax's Jacobian dp_a/dz_e = p_a (delta_ae - p_e),
// through the normalization w_j = p_{a_j} / S (S = sum_l p_{a_l}) where it applies: an
// independent derivation of the kernel's simplified forms.
void moe_route_backward(float* dlogits, const float* dweights, const int32_t* ids,
                        const float* logits, int64_t n, int64_t E, int64_t k, bool normalize) {
  std::vector<double> p(static_cast<size_t>(E));
  for (int64_t r = 0; r < n; ++r) {
    const float* x = logits + r * E;
    const int32_t* id = ids + r * k;
    const float* dw = dweights + r * k;
    double mx = x[0], sum = 0.0;
    for (int64_t e = 1; e < E; ++e) mx = std::max(mx, static_cast<double>(x[e]));
    for (int64_t e = 0; e < E; ++e) sum += p[static_cast<size_t>(e)] = std::exp(x[e] - mx);
    for (double& v : p) v /= sum;
    double S = 0.0;
    for (int64_t j = 0; j < k; ++j) S += p[static_cast<size_t>(id[j])];
    for (int64_t e = 0; e < E; ++e) {
      const double pe = p[static_cast<size_t>(e)];
      auto dp = [&](int32_t a) { return p[static_cast<size_t>(a)] * ((a == e) - pe); };
      double dS = 0.0;
      for (int64_t l = 0; l < k; ++l) dS += dp(id[l]);
      double g = 0.0;
      for (int64_t j = 0; j < k; ++j) {
        const double pa = p[static_cast<size_t>(id[j])];
        g += dw[j] * (normalize ? (dp(id[j]) * S - pa * dS) / (S * S) : dp(id[j]));
      }
      dlogits[r * E + e] = static_cast<float>(g);
    }
  }
}

}  // namespace tessera::cpu::ref
