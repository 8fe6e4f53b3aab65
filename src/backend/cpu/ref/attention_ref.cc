// Reference causal self-attention forward and backward, with the optional sliding window: plain
// loops, one score row per query, double accumulation. The oracle for the tiled kernels in
// backend/cpu/attention.cc.
#include <cmath>
#include <vector>

#include "backend/cpu/ref/ref_kernels.h"

namespace tessera::cpu::ref {

// out (B,T,C), lse (B,H,T), qkv (B,T,C+2*Hkv*D): query head h reads key/value head h/(H/Hkv);
// query i reads keys a.first_key(i) .. i.
void attention_forward(float* out, float* lse, const float* qkv, const ops::AttentionArgs& a) {
  ops::check_attention_args("attention_forward", a);
  const int64_t B = a.B, T = a.T, C = a.C, H = a.H, Hkv = a.Hkv;
  const int64_t D = C / H, ld = C + 2 * Hkv * D, group = H / Hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> s(static_cast<size_t>(T));
  std::vector<double> acc(static_cast<size_t>(D));
  for (int64_t b = 0; b < B; ++b) {
    const float* base = qkv + b * T * ld;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t k_col = C + h / group * D, v_col = C + (Hkv + h / group) * D;
      for (int64_t i = 0; i < T; ++i) {
        const float* q = base + i * ld + h * D;
        const int64_t j0 = a.first_key(i);
        double m = -INFINITY;
        for (int64_t j = j0; j <= i; ++j) {
          const float* k = base + j * ld + k_col;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(q[d]) * k[d];
          s[j] = dot * scale;
          if (s[j] > m) m = s[j];
        }
        double sum = 0;
        for (int64_t j = j0; j <= i; ++j) {
          s[j] = std::exp(s[j] - m);
          sum += s[j];
        }
        for (auto& a : acc) a = 0;
        for (int64_t j = j0; j <= i; ++j) {
          const float* v = base + j * ld + v_col;
          for (int64_t d = 0; d < D; ++d) acc[d] += s[j] * v[d];
        }
        float* o = out + (b * T + i) * C + h * D;
        for (int64_t d = 0; d < D; ++d) o[d] = static_cast<float>(acc[d] / sum);
        lse[(b * H + h) * T + i] = static_cast<float>(m + std::log(sum));
      }
    }
  }
}

// dqkv (B,T,C+2*Hkv*D) overwritten; dout, out (B,T,C); qkv as dqkv; lse (B,H,T). A key/value
// head's gradient sums over the query heads of its group.
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, const ops::AttentionArgs& a) {
  ops::check_attention_args("attention_backward", a);
  const int64_t B = a.B, T = a.T, C = a.C, H = a.H, Hkv = a.Hkv;
  const int64_t D = C / H, ld = C + 2 * Hkv * D, group = H / Hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  // Per-head gradients in double: dq (T,D) per query head, dk and dv (T,D) per kv head.
  std::vector<double> dq(static_cast<size_t>(T * D)), dk(dq.size()), dv(dq.size());
  for (int64_t b = 0; b < B; ++b) {
    const float* base = qkv + b * T * ld;
    for (int64_t g = 0; g < Hkv; ++g) {
      const int64_t k_col = C + g * D, v_col = C + (Hkv + g) * D;
      for (auto& x : dk) x = 0;
      for (auto& x : dv) x = 0;
      for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        for (auto& x : dq) x = 0;
        for (int64_t i = 0; i < T; ++i) {
          const float* q = base + i * ld + h * D;
          const float* go = dout + (b * T + i) * C + h * D;
          const float* o = out + (b * T + i) * C + h * D;
          const double l = lse[(b * H + h) * T + i];
          double di = 0;
          for (int64_t d = 0; d < D; ++d) di += static_cast<double>(go[d]) * o[d];
          for (int64_t j = a.first_key(i); j <= i; ++j) {
            const float* k = base + j * ld + k_col;
            const float* v = base + j * ld + v_col;
            double s = 0, dp = 0;
            for (int64_t d = 0; d < D; ++d) {
              s += static_cast<double>(q[d]) * k[d];
              dp += static_cast<double>(go[d]) * v[d];
            }
            const double p = std::exp(s * scale - l);
            const double ds = p * (dp - di) * scale;
            for (int64_t d = 0; d < D; ++d) {
              dq[i * D + d] += ds * k[d];
              dk[j * D + d] += ds * q[d];
              dv[j * D + d] += p * go[d];
            }
          }
        }
        for (int64_t t = 0; t < T; ++t)
          for (int64_t d = 0; d < D; ++d)
            dqkv[(b * T + t) * ld + h * D + d] = static_cast<float>(dq[t * D + d]);
      }
      for (int64_t t = 0; t < T; ++t) {
        float* row = dqkv + (b * T + t) * ld;
        for (int64_t d = 0; d < D; ++d) {
          row[k_col + d] = static_cast<float>(dk[t * D + d]);
          row[v_col + d] = static_cast<float>(dv[t * D + d]);
        }
      }
    }
  }
}

}  // namespace tessera::cpu::ref
