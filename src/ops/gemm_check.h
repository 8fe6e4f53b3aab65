// Argument checks shared by every GEMM entry point (ops::gemm and the CPU kernels called
// directly). Header-only, so a backend can use it without linking the ops library.
#pragma once

#include "core/error.h"
#include "ops/ops.h"

namespace tessera::ops {

// Throws Error naming the bad size, dtype, leading dimension or pointer. Returns whether there is
// anything to compute (m > 0 and n > 0; k == 0 still writes bias (+ C)).
inline bool validate_gemm_args(const GemmArgs& g) {
  TS_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0, "[gemm] negative size m=", g.m, " n=", g.n,
           " k=", g.k);
  auto is_input = [](DType t) { return t == DType::f32 || t == DType::bf16; };
  TS_CHECK(is_input(g.a_type) && is_input(g.b_type), "[gemm] inputs must be f32 or bf16, got ",
           dtype_name(g.a_type), " and ", dtype_name(g.b_type));
  if (g.m == 0 || g.n == 0) return false;
  const int64_t a_cols = g.trans_a == Trans::N ? g.k : g.m;
  const int64_t b_cols = g.trans_b == Trans::N ? g.n : g.k;
  TS_CHECK(g.lda >= a_cols && g.ldb >= b_cols && g.ldc >= g.n,
           "[gemm] leading dimension too small: lda=", g.lda, " ldb=", g.ldb, " ldc=", g.ldc,
           " for m=", g.m, " n=", g.n, " k=", g.k);
  TS_CHECK(g.c != nullptr && (g.k == 0 || (g.a != nullptr && g.b != nullptr)),
           "[gemm] null pointer for a, b or c");
  return true;
}

}  // namespace tessera::ops
