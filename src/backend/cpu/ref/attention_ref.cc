// Reference causal self-attention forward and backward: plain loops, one score row per query,
// double accumulation. The oracle for the tiled kernels in backend/cpu/attention.cc.
#include <cmath>
#include <vector>

#include "backend/cpu/ref/ref_kernels.h"
#include "core/error.h"

namespace tessera::cpu::ref {

namespace {

void check_shapes(const char* op, int64_t B, int64_t T, int64_t C, int64_t H) {
  TS_CHECK(B >= 0 && T >= 0, "[", op, "] negative size B=", B, " T=", T);
  TS_CHECK(H > 0 && C > 0 && C % H == 0, "[", op, "] width C=", C,
           " must be a positive multiple of heads H=", H);
}

}  // namespace

// out (B,T,C), lse (B,H,T), qkv (B,T,3C).
void attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T, int64_t C,
                       int64_t H) {
  check_shapes("attention_forward", B, T, C, H);
  const int64_t D = C / H;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::vector<double> s(static_cast<size_t>(T));
  std::vector<double> acc(static_cast<size_t>(D));
  for (int64_t b = 0; b < B; ++b) {
    const float* base = qkv + b * T * 3 * C;
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t i = 0; i < T; ++i) {
        const float* q = base + i * 3 * C + h * D;
        double m = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          const float* k = base + j * 3 * C + C + h * D;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(q[d]) * k[d];
          s[j] = dot * scale;
          if (s[j] > m) m = s[j];
        }
        double sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          s[j] = std::exp(s[j] - m);
          sum += s[j];
        }
        for (auto& a : acc) a = 0;
        for (int64_t j = 0; j <= i; ++j) {
          const float* v = base + j * 3 * C + 2 * C + h * D;
          for (int64_t d = 0; d < D; ++d) acc[d] += s[j] * v[d];
        }
        float* o = out + (b * T + i) * C + h * D;
        for (int64_t d = 0; d < D; ++d) o[d] = static_cast<float>(acc[d] / sum);
        lse[(b * H + h) * T + i] = static_cast<float>(m + std::log(sum));
      }
    }
  }
}

// dqkv (B,T,3C) overwritten; dout, out (B,T,C); qkv (B,T,3C); lse (B,H,T).
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, int64_t B, int64_t T, int64_t C, int64_t H) {
  check_shapes("attention_backward", B, T, C, H);
  const int64_t D = C / H;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  // Per-head gradients in double: dq, dk, dv each (T,D).
  std::vector<double> dq(static_cast<size_t>(T * D)), dk(dq.size()), dv(dq.size());
  for (int64_t b = 0; b < B; ++b) {
    const float* base = qkv + b * T * 3 * C;
    for (int64_t h = 0; h < H; ++h) {
      for (auto& x : dq) x = 0;
      for (auto& x : dk) x = 0;
      for (auto& x : dv) x = 0;
      for (int64_t i = 0; i < T; ++i) {
        const float* q = base + i * 3 * C + h * D;
        const float* go = dout + (b * T + i) * C + h * D;
        const float* o = out + (b * T + i) * C + h * D;
        const double l = lse[(b * H + h) * T + i];
        double di = 0;
        for (int64_t d = 0; d < D; ++d) di += static_cast<double>(go[d]) * o[d];
        for (int64_t j = 0; j <= i; ++j) {
          const float* k = base + j * 3 * C + C + h * D;
          const float* v = base + j * 3 * C + 2 * C + h * D;
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
      for (int64_t t = 0; t < T; ++t) {
        float* g = dqkv + (b * T + t) * 3 * C + h * D;
        for (int64_t d = 0; d < D; ++d) {
          g[d] = static_cast<float>(dq[t * D + d]);
          g[C + d] = static_cast<float>(dk[t * D + d]);
          g[2 * C + d] = static_cast<float>(dv[t * D + d]);
        }
      }
    }
  }
}

}  // namespace tessera::cpu::ref
