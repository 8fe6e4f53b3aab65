// Reference token + position embedding, forward and backward (plain loops, the test oracle).
#include "backend/cpu/ref/ref_kernels.h"
#include "core/error.h"

namespace tessera::cpu::ref {

// out (B,T,C) = wte[tokens[b,t]] + wpe[t]; tokens (B,T) in [0, V), wte (V,C), wpe (>=T,C) or
// null (no position table).
void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       int64_t B, int64_t T, int64_t C, int64_t V) {
  TS_CHECK(B >= 0 && T >= 0 && C > 0, "[embedding_forward] bad shape B=", B, " T=", T, " C=", C);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t n = b * T + t;
      const int32_t tok = tokens[n];
      TS_CHECK(tok >= 0 && tok < V, "[embedding_forward] tokens[", n, "] = ", tok,
               " is outside the vocabulary [0, ", V, ")");
      const float* e = wte + static_cast<int64_t>(tok) * C;
      float* o = out + n * C;
      for (int64_t c = 0; c < C; ++c) o[c] = e[c] + (wpe != nullptr ? wpe[t * C + c] : 0.0f);
    }
  }
}

// dwte (V,C) += dout rows scattered by token; dwpe (>=T,C) += dout summed over the batch (none
// when dwpe is null).
// Rows are accumulated in token order (b, then t), the order the SIMD kernel also uses.
void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                        int64_t B, int64_t T, int64_t C, int64_t V) {
  TS_CHECK(B >= 0 && T >= 0 && C > 0, "[embedding_backward] bad shape B=", B, " T=", T, " C=", C);
  // Validate first so a bad token leaves the gradients untouched.
  for (int64_t n = 0; n < B * T; ++n)
    TS_CHECK(tokens[n] >= 0 && tokens[n] < V, "[embedding_backward] tokens[", n, "] = ", tokens[n],
             " is outside the vocabulary [0, ", V, ")");
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t n = b * T + t;
      const int32_t tok = tokens[n];
      const float* d = dout + n * C;
      float* dw = dwte + static_cast<int64_t>(tok) * C;
      for (int64_t c = 0; c < C; ++c) {
        dw[c] += d[c];
        if (dwpe != nullptr) dwpe[t * C + c] += d[c];
      }
    }
  }
}

}  // namespace tessera::cpu::ref
