// Reference paged attention: plain loops in double, a full softmax per query head (the oracle
// for the online-softmax SIMD kernel).
#include <cmath>
#include <vector>

#include "backend/cpu/paged_attention.h"

namespace tessera::cpu::ref {

void paged_attention(const ops::PagedAttentionArgs& a) {
  const int64_t group = a.H / a.Hkv;
  auto cache = [&](int64_t i) -> double {
    if (a.kv_type == DType::f16) return f16_to_f32(static_cast<const uint16_t*>(a.kv)[i]);
    return static_cast<const float*>(a.kv)[i];
  };
  std::vector<double> scores, acc(static_cast<size_t>(a.D));
  for (int64_t r = 0; r < a.rows; ++r) {
    const int64_t nk = a.n_keys[r], first = a.first_key ? a.first_key[r] : 0;
    scores.assign(static_cast<size_t>(nk), 0.0);
    for (int64_t h = 0; h < a.H; ++h) {
      const int64_t g = h / group;
      const float* q = a.q + (r * a.H + h) * a.D;
      // Element index of key j's row; values sit v_offset elements later.
      auto key = [&](int64_t j) {
        const int64_t block = a.block_tables[r * a.table_stride + j / a.block_tokens];
        return block * a.block_stride + (g * a.block_tokens + j % a.block_tokens) * a.D;
      };
      // Element index of key j's dimension d in either K layout.
      auto k_elem = [&](int64_t j, int64_t d) {
        const int64_t block = a.block_tables[r * a.table_stride + j / a.block_tokens],
                      t = j % a.block_tokens;
        const int64_t head = block * a.block_stride + g * a.block_tokens * a.D;
        return a.k_transposed ? head + d * a.block_tokens + t : head + t * a.D + d;
      };
      double mx = -INFINITY;
      for (int64_t j = first; j < nk; ++j) {
        double s = 0;
        for (int64_t d = 0; d < a.D; ++d) s += static_cast<double>(q[d]) * cache(k_elem(j, d));
        scores[static_cast<size_t>(j)] = s * a.scale;
        mx = std::max(mx, scores[static_cast<size_t>(j)]);
      }
      double sum = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = first; j < nk; ++j) {
        const double p = std::exp(scores[static_cast<size_t>(j)] - mx);
        sum += p;
        const int64_t v = key(j) + a.v_offset;
        for (int64_t d = 0; d < a.D; ++d) acc[static_cast<size_t>(d)] += p * cache(v + d);
      }
      float* out = a.out + (r * a.H + h) * a.D;
      for (int64_t d = 0; d < a.D; ++d)
        out[d] = static_cast<float>(acc[static_cast<size_t>(d)] / sum);
    }
  }
}

}  // namespace tessera::cpu::ref
