// Quantized-weight op entry points: argument checks, dispatch to ctx.device's backend, costs for
// the profiler, and row lookups (embeddings) from stored-type weights.
#include "ops/quant.h"

#include <vector>

#include "core/error.h"
#include "core/interleave.h"
#include "ops/backend.h"
#include "ops/observed.h"

namespace tessera::ops {

void check_matmul_wt_args(int64_t ldy, int64_t M, int64_t K, DType w_type, int64_t N) {
  TS_CHECK(M >= 0, "[matmul_wt] rows M=", M, " must be >= 0");
  TS_CHECK(N >= 0, "[matmul_wt] outputs N=", N, " must be >= 0");
  TS_CHECK(K > 0, "[matmul_wt] inner dimension K=", K, " must be positive");
  TS_CHECK(ldy >= N, "[matmul_wt] ldy=", ldy, " is smaller than N=", N);
  const DType plain_t = plain_type(w_type);
  const bool is_float = plain_t == DType::f32 || plain_t == DType::f16 || plain_t == DType::bf16;
  TS_CHECK(is_float || act_block_elems(w_type) > 0, "[matmul_wt] weight type ", dtype_name(w_type),
           " is not supported");
  const int64_t block = traits(w_type).block_elems;
  TS_CHECK(K % block == 0, "[matmul_wt] K=", K, " is not a multiple of the ", dtype_name(w_type),
           " block size ", block);
  const int64_t group = traits(w_type).interleave_rows;
  TS_CHECK(N % group == 0, "[matmul_wt] N=", N, " is not a multiple of the ", group, " rows a ",
           dtype_name(w_type), " group interleaves");
}

void matmul_wt(const Context& ctx, float* y, int64_t ldy, const float* x, int64_t M, int64_t K,
               const void* w, DType w_type, int64_t N, const float* bias) {
  check_matmul_wt_args(ldy, M, K, w_type, N);
  TS_CHECK(M * N == 0 || (y && x && w), "[matmul_wt] null y, x or w");
  detail::observed(
      ctx, "matmul_wt",
      [&] {
        return OpShape{"m k n", {M, K, N}, dtype_name(w_type)};
      },
      [&] { return matmul_wt_cost(M, K, N, w_type, bias != nullptr); },
      [&] { backend(ctx.device).matmul_wt(ctx, y, ldy, x, M, K, w, w_type, N, bias); });
}

int64_t quantized_rows_bytes(const Context& ctx, int64_t rows, int64_t cols, DType for_type) {
  TS_CHECK(rows >= 0 && cols >= 0, "[quantized_rows] bad shape (", rows, ", ", cols, ")");
  return backend(ctx.device).quantized_rows_bytes(rows, cols, for_type);
}

void check_quantized_rows(const Context& ctx, const QuantizedRows* q, int64_t rows, int64_t cols,
                          const char* op) {
  if (!q) return;
  TS_CHECK(q->data && q->rows == rows && q->cols == cols, "[", op, "] quantized rows (", q->rows,
           ", ", q->cols, ") for (", rows, ", ", cols, ") rows, or without memory");
  TS_CHECK(quantized_rows_bytes(ctx, rows, cols, q->for_type) > 0, "[", op, "] ",
           device_name(ctx.device), " has no quantized rows of (", rows, ", ", cols, ") for ",
           dtype_name(q->for_type), " weights");
}

void matmul_wt_group(const Context& ctx, const float* x, int64_t M, int64_t K,
                     std::span<const WtProduct> products, const QuantizedRows* xq) {
  check_quantized_rows(ctx, xq, M, K, "matmul_wt_group");
  for (const WtProduct& p : products) {
    check_matmul_wt_args(p.ldy, M, K, p.w_type, p.N);
    TS_CHECK(M * p.N == 0 || (p.y && x && p.w), "[matmul_wt] null y, x or w");
  }
  auto cost = [&] {
    OpCost c;
    for (const WtProduct& p : products) {
      const OpCost one = matmul_wt_cost(M, K, p.N, p.w_type, p.bias != nullptr);
      c.flops += one.flops;
      c.bytes += one.bytes;
      c.state_bytes += one.state_bytes;
    }
    if (!products.empty())
      c.bytes -= 4.0 * static_cast<double>(M * K) * static_cast<double>(products.size() - 1);
    return c;  // x is read once for the whole group
  };
  auto shape = [&] {  // the products side by side: n is their sum
    OpShape s{"m k n", {M, K, 0}, products.empty() ? "f32" : dtype_name(products[0].w_type)};
    for (const WtProduct& p : products) s.dims[2] += p.N;
    return s;
  };
  detail::observed(ctx, "matmul_wt_group", shape, cost,
                   [&] { backend(ctx.device).matmul_wt_group(ctx, x, M, K, products, xq); });
}

void matmul_w(const Context& ctx, float* dx, int64_t ldx, const float* dy, int64_t M, int64_t N,
              const void* w, DType w_type, int64_t K, bool accumulate) {
  check_matmul_wt_args(N, M, K, w_type, N);  // W (N,K) as matmul_wt would read it
  TS_CHECK(ldx >= K, "[matmul_w] ldx=", ldx, " is smaller than K=", K);
  TS_CHECK(M * K == 0 || (dx && dy && w), "[matmul_w] null dx, dy or w");
  detail::observed(
      ctx, "matmul_w",
      [&] {
        return OpShape{"m n k", {M, N, K}, dtype_name(w_type)};
      },
      [&] { return matmul_w_cost(M, N, K, w_type, accumulate); },
      [&] { backend(ctx.device).matmul_w(ctx, dx, ldx, dy, M, N, w, w_type, K, accumulate); });
}

OpCost matmul_w_cost(int64_t M, int64_t N, int64_t K, DType w_type, bool accumulate) {
  OpCost c;
  c.flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K);
  c.state_bytes = static_cast<double>(N) * static_cast<double>(dtype_bytes(w_type, K));
  c.bytes = c.state_bytes +
            4.0 * static_cast<double>(M) * (static_cast<double>(N) + (accumulate ? 2.0 : 1.0) * K);
  return c;
}

OpCost matmul_wt_cost(int64_t M, int64_t K, int64_t N, DType w_type, bool bias) {
  OpCost c;
  c.flops = 2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) +
            (bias ? static_cast<double>(M) * static_cast<double>(N) : 0.0);
  c.state_bytes = static_cast<double>(N) * static_cast<double>(dtype_bytes(w_type, K)) +
                  (bias ? 4.0 * N : 0.0);  // the weights
  c.bytes = c.state_bytes + 4.0 * static_cast<double>(M) * static_cast<double>(K + N);
  return c;
}

int64_t matmul_wt_saturating_rows(const Context& ctx, DType w_type) {
  if (ctx.reference) return 512;  // the reference kernels gain nothing from fewer rows
  return backend(ctx.device).matmul_wt_saturating_rows(w_type);
}

DType cpu_preferred_layout(DType t, int64_t n_rows) {
  return backend(Device::cpu).preferred_layout(t, n_rows);
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
