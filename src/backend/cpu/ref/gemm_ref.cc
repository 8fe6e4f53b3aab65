// Reference GEMM: plain loops with double accumulation; the oracle for the packed GEMM.
#include <cstdint>
#include <vector>

#include "backend/cpu/ref/ref_kernels.h"
#include "core/dtype.h"
#include "core/error.h"
#include "ops/gemm_check.h"

namespace tessera::cpu::ref {

namespace {

// Element (r, c) of a row-major matrix of f32 or bf16 with leading dimension ld, as f32; with
// round_bf16 an f32 value is rounded to bf16 first (what the bf16 GEMM sees).
float load(const void* p, DType t, int64_t ld, int64_t r, int64_t c, bool round_bf16) {
  const int64_t i = r * ld + c;
  if (t == DType::bf16) return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
  const float v = static_cast<const float*>(p)[i];
  return round_bf16 ? bf16_to_f32(f32_to_bf16(v)) : v;
}

}  // namespace

// c (M,N) = op(a) (M,K) * op(b) (K,N) [+ bias (N)] [+ c]; see ops::GemmArgs.
void gemm(const ops::GemmArgs& g) {
  if (!ops::validate_gemm_args(g)) return;
  // Convert op(A) row i and op(B) column j once each so the inner loop is a plain dot product.
  std::vector<float> a_row(g.k), bt(g.n * g.k);
  for (int64_t j = 0; j < g.n; ++j)
    for (int64_t p = 0; p < g.k; ++p)
      bt[j * g.k + p] = g.trans_b == ops::Trans::N ? load(g.b, g.b_type, g.ldb, p, j, g.round_bf16)
                                                   : load(g.b, g.b_type, g.ldb, j, p, g.round_bf16);
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t p = 0; p < g.k; ++p)
      a_row[p] = g.trans_a == ops::Trans::N ? load(g.a, g.a_type, g.lda, i, p, g.round_bf16)
                                            : load(g.a, g.a_type, g.lda, p, i, g.round_bf16);
    float* c_row = g.c + i * g.ldc;
    for (int64_t j = 0; j < g.n; ++j) {
      double acc = 0.0;
      const float* b_col = bt.data() + j * g.k;
      for (int64_t p = 0; p < g.k; ++p) acc += static_cast<double>(a_row[p]) * b_col[p];
      if (g.bias) acc += g.bias[j];
      if (g.accumulate) acc += c_row[j];
      c_row[j] = static_cast<float>(acc);
    }
  }
}

}  // namespace tessera::cpu::ref
