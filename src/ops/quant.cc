// Quantized-weight op entry points: argument checks, dispatch to the CPU reference or SIMD
// kernels (CUDA: not yet), costs for the profiler.
#include "ops/quant.h"

#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/quant_matmul_avx2.h"
#include "backend/cpu/ref/ref_kernels.h"
#include "backend/device.h"
#include "core/error.h"
#include "core/interleave.h"

namespace tessera::ops {

void matmul_wt(const Context& ctx, float* y, int64_t ldy, const float* x, int64_t M, int64_t K,
               const void* w, DType w_type, int64_t N, const float* bias) {
  cpu::ref::check_matmul_wt_args(ldy, M, K, w_type, N);
  TS_CHECK(M * N == 0 || (y && x && w), "[matmul_wt] null y, x or w");
  if (ctx.device == Device::cuda) backend::require_cuda("matmul_wt");
  if (ctx.reference) return cpu::ref::matmul_wt(y, ldy, x, M, K, w, w_type, N, bias);
  cpu::matmul_wt(ctx.threads(), y, ldy, x, M, K, w, w_type, N, bias);
}

void matmul_wt_group(const Context& ctx, const float* x, int64_t M, int64_t K,
                     std::span<const WtProduct> products) {
  for (const WtProduct& p : products) {
    cpu::ref::check_matmul_wt_args(p.ldy, M, K, p.w_type, p.N);
    TS_CHECK(M * p.N == 0 || (p.y && x && p.w), "[matmul_wt] null y, x or w");
  }
  if (ctx.device == Device::cuda) backend::require_cuda("matmul_wt_group");
  if (ctx.reference) {
    for (const WtProduct& p : products)
      cpu::ref::matmul_wt(p.y, p.ldy, x, M, K, p.w, p.w_type, p.N, p.bias);
    return;
  }
  cpu::matmul_wt_group(ctx.threads(), x, M, K, products.data(),
                       static_cast<int64_t>(products.size()));
}

OpCost matmul_wt_cost(int64_t M, int64_t K, int64_t N, DType w_type, bool bias) {
  OpCost c;
  c.flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) +
            (bias ? static_cast<double>(M) * static_cast<double>(N) : 0.0);
  c.bytes = static_cast<double>(N) * static_cast<double>(dtype_bytes(w_type, K)) +
            4.0 * static_cast<double>(M) * static_cast<double>(K + N) + (bias ? 4.0 * N : 0.0);
  return c;
}

int64_t matmul_wt_saturating_rows(const Context& ctx, DType w_type) {
  constexpr int64_t kPackedRows = 512, kKernelRows = 128;
  if (ctx.device == Device::cuda || ctx.reference) return kPackedRows;
  return cpu::matmul_wt_takes_packed_gemm(w_type, kPackedRows) ? kPackedRows : kKernelRows;
}

DType cpu_preferred_layout(DType t, int64_t n_rows) {
  if (!has_interleaved_layout(t) || n_rows % traits(interleaved_type(t)).interleave_rows != 0)
    return t;
  // The k-quant layouts have AVX512-VNNI kernels only (elsewhere their groups would be read back
  // into plain rows first: slower than the plain types' own AVX2 tiles).
  if (t == DType::q4_k || t == DType::q5_k || t == DType::q6_k)
    return cpu::quant_avx512_vnni_active() ? interleaved_type(t) : t;
  return cpu::quant_avx2_supported() ? interleaved_type(t) : t;
}

void dequantize_row(const void* w, DType w_type, int64_t K, int64_t row, float* dst) {
  const int64_t row_bytes = dtype_bytes(w_type, K);
  if (!is_interleaved(w_type))
    return to_f32(w_type, static_cast<const uint8_t*>(w) + row * row_bytes, dst, K);
  // Embedding lookups come here once per token row: one buffer per thread, grown once, instead
  // of an allocation per row.
  thread_local std::vector<uint8_t> plain;
  plain.resize(static_cast<size_t>(row_bytes));
  deinterleave_row(w_type, w, K, row, plain.data());
  to_f32(plain_type(w_type), plain.data(), dst, K);
}

void dequantize_row(const void* w, DType w_type, int64_t K, int64_t N, int64_t row, float* dst) {
  TS_CHECK(row >= 0 && row < N, "[dequantize_row] row ", row, " is outside [0, ", N, ")");
  dequantize_row(w, w_type, K, row, dst);
}

}  // namespace tessera::ops
