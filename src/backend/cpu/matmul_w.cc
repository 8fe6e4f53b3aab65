// dx = dy W against weights in their stored type (the backward of matmul_wt through its input):
// W widened a panel of rows at a time into per-call scratch, each panel one packed f32 GEMM.
#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "core/error.h"
#include "ops/quant.h"

namespace tessera::cpu {

namespace {
// Rows of W widened per GEMM: the GEMM's default depth block (kc = 256), so each panel is one
// depth block of the packed product and its widened copy (256 K floats: 1.5 MB at K = 1536)
// stays in L2/L3 while the GEMM packs it.
constexpr int64_t kMatmulWPanel = 256;
}  // namespace

void matmul_w(ThreadPool& pool, float* dx, int64_t ldx, const float* dy, int64_t M, int64_t N,
              const void* w, DType w_type, int64_t K, bool accumulate) {
  if (M == 0 || K == 0) return;
  if (N == 0) {
    if (!accumulate)
      for (int64_t i = 0; i < M; ++i) std::fill(dx + i * ldx, dx + i * ldx + K, 0.0f);
    return;
  }
  ops::GemmArgs g;
  g.m = M, g.n = K;
  g.c = dx, g.ldc = ldx;
  g.a_type = g.b_type = DType::f32;
  if (w_type == DType::f32 || w_type == DType::bf16) {  // the GEMM reads W as it is
    g.k = N;
    g.a = dy, g.lda = N;
    g.b = w, g.b_type = w_type, g.ldb = K;
    g.accumulate = accumulate;
    gemm(pool, g);
    return;
  }
  thread_local std::vector<float> panel;
  panel.resize(static_cast<size_t>(std::min(N, kMatmulWPanel) * K));
  for (int64_t j0 = 0; j0 < N; j0 += kMatmulWPanel) {
    const int64_t rows = std::min(kMatmulWPanel, N - j0);
    float* dst = panel.data();
    pool.parallel_for(rows, 8, [&](int64_t b, int64_t e) {
      for (int64_t j = b; j < e; ++j) ops::dequantize_row(w, w_type, K, j0 + j, dst + j * K);
    });
    g.k = rows;
    g.a = dy + j0, g.lda = N;
    g.b = dst, g.ldb = K;
    g.accumulate = accumulate || j0 > 0;
    gemm(pool, g);
  }
}

}  // namespace tessera::cpu
