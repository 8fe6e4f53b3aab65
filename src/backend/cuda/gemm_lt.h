// Dense GEMM through cuBLASLt with the project's row-major convention (ops::GemmArgs): bf16/fp16
// (and f32) inputs with f32 accumulation, e4m3 inputs on sm_89+, fused bias / bias+GELU / bias
// gradient epilogues, one cached algorithm choice per problem.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace tessera::cuda {

// Element types crossing this API. bf16 and f16 are raw 16-bit patterns (uint16_t or
// __nv_bfloat16 / __half storage), e4m3 one byte per element (OCP FP8 E4M3, as __nv_fp8_e4m3).
enum class LtType : uint8_t { f32, bf16, f16, e4m3 };
const char* lt_type_name(LtType t);
size_t lt_type_bytes(LtType t);

enum class LtEpilogue : uint8_t {
  none,
  bias,       // c = op(a) op(b) + bias; bias (N) has c's type
  bias_gelu,  // c = gelu_tanh(op(a) op(b) + bias); optionally saves the pre-activation
  bias_grad,  // c = op(a) op(b) as usual, and bias (M) = row sums of op(a) (overwritten): with
              // a = dy (T, K) transposed this is the bias gradient of the wgrad dW = dy^T x.
              // Needs trans_a (cuBLASLt's BGRADB takes its B operand transposed only).
};
const char* lt_epilogue_name(LtEpilogue e);

// c (M,N) = epilogue(alpha * op(a) (M,K) * op(b) (K,N) [+ c if accumulate]), row-major with
// leading dimensions in elements; op(x) = x^T when trans_x (cuBLASLt adds beta * c before the
// bias and the GELU). The three training forms:
// y = x W^T (trans_b), dx = dy W (neither), dW += dy^T x (trans_a, accumulate).
// Types: a and b alike; bf16 -> c bf16 or f32; f16 -> c f16 or f32; f32 -> c f32 (no TF32);
// e4m3 -> c bf16, f16 or f32 (sm_89+, only the y = x W^T form, K and lda/ldb multiples of 16,
// scales applied as a_scale * b_scale * product; bias needs c bf16 or f16).
struct LtGemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  LtType a_type = LtType::bf16;
  int64_t lda = 0;
  const void* b = nullptr;
  LtType b_type = LtType::bf16;
  int64_t ldb = 0;
  void* c = nullptr;
  LtType c_type = LtType::f32;
  int64_t ldc = 0;
  float alpha = 1.0f;
  bool accumulate = false;  // beta = 1 (c read first) or 0 (c only written)
  LtEpilogue epilogue = LtEpilogue::none;
  void* bias = nullptr;  // device (N) input, or (M) output for bias_grad; type c_type
  // bias_gelu only, optional: (M, ld_gelu_input) device buffer of c_type receiving the
  // pre-activation op(a) op(b) + bias (what the GELU backward needs); ld a multiple of 8, >= N.
  void* gelu_input = nullptr;
  int64_t ld_gelu_input = 0;
  // e4m3 only: device pointers to one f32 scale each (null means 1).
  const float* a_scale = nullptr;
  const float* b_scale = nullptr;
};

// The three forms of a linear layer y = x W^T [+ b] (x (rows, K), W (N, K), row-major, packed):
// forward y (rows, N) of type out (the bias, if any, of type out too); the weight gradient
// dW (N, K) f32 += dy^T x; the input gradient dx (rows, K) of type out = dy W.
inline LtGemmArgs lt_linear(void* y, LtType out, const void* x, const void* w, LtType in,
                            int64_t rows, int64_t N, int64_t K, void* bias = nullptr) {
  LtGemmArgs g;
  g.trans_b = true;
  g.m = rows, g.n = N, g.k = K;
  g.a = x, g.a_type = in, g.lda = K;
  g.b = w, g.b_type = in, g.ldb = K;
  g.c = y, g.c_type = out, g.ldc = N;
  if (bias) g.epilogue = LtEpilogue::bias, g.bias = bias;
  return g;
}
inline LtGemmArgs lt_linear_weight_grad(float* dw, const void* dy, const void* x, LtType in,
                                        int64_t rows, int64_t N, int64_t K) {
  LtGemmArgs g;
  g.trans_a = true;
  g.m = N, g.n = K, g.k = rows;
  g.a = dy, g.a_type = in, g.lda = N;
  g.b = x, g.b_type = in, g.ldb = K;
  g.c = dw, g.c_type = LtType::f32, g.ldc = K;
  g.accumulate = true;
  return g;
}
inline LtGemmArgs lt_linear_input_grad(void* dx, LtType out, const void* dy, const void* w,
                                       LtType in, int64_t rows, int64_t N, int64_t K) {
  LtGemmArgs g;
  g.m = rows, g.n = K, g.k = N;
  g.a = dy, g.a_type = in, g.lda = N;
  g.b = w, g.b_type = in, g.ldb = K;
  g.c = dx, g.c_type = out, g.ldc = K;
  return g;
}

// Throws Error naming the offending parameter. Host-only (touches no device). Returns false when
// M or N is 0 (nothing to do).
bool check_gemm_lt_args(const LtGemmArgs& g);

// Runs the GEMM on `stream` on the current device. The first call for a problem (shape, types,
// layouts, epilogue, pointer alignments) asks cuBLASLt's heuristic for an algorithm and caches
// it; later calls reuse it. A 32 MiB workspace per (device, stream) comes from the memory pool.
void gemm_lt(const LtGemmArgs& g, cudaStream_t stream);

// Loads cuBLASLt (dlopen on first use, not linked: see cublaslt_lazy.cc) and resolves every
// entry point the backend calls; throws Error naming the library or the missing symbol. Needs
// no GPU, so a test can check it on any machine with the toolkit.
void load_cublaslt_entry_points();

// Number of cached algorithm choices on the current device (tests check the cache is used).
size_t gemm_lt_cached_plans();
// Number of per-stream workspaces (kWorkspaceBytes each) held on the current device.
size_t gemm_lt_workspaces();
// Drops the workspace of a stream whose work has finished and which is being destroyed, on every
// device (Stream's destructor calls this; a long-lived server creating streams would otherwise
// keep one workspace per stream it ever used).
void gemm_lt_retire_stream(cudaStream_t stream) noexcept;

// The row-major problem in cuBLAS's column-major terms. A row-major (R, C) matrix with leading
// dimension ld is the column-major (C, R) matrix with the same ld, so row-major C = op(A) op(B)
// is column-major C^T = op(B)^T op(A)^T: cuBLAS's first operand is our b, its second our a, and
// its (m, n) is our (N, M). Layouts are of the matrices as stored (before the op).
struct ColMajorGemm {
  bool op_t_first = false, op_t_second = false;  // CUBLAS_OP_T on cuBLAS's A (our b) / B (our a)
  int64_t m = 0, n = 0, k = 0;                   // cuBLAS's m, n, k
  int64_t first_rows = 0, first_cols = 0, first_ld = 0;     // cuBLAS's A = our b
  int64_t second_rows = 0, second_cols = 0, second_ld = 0;  // cuBLAS's B = our a
  int64_t c_rows = 0, c_cols = 0, c_ld = 0;                 // cuBLAS's C and D = our c
};

inline ColMajorGemm to_col_major(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                 int64_t lda, int64_t ldb, int64_t ldc) {
  ColMajorGemm g;
  g.m = n;
  g.n = m;
  g.k = k;
  // Our b stored row-major (K, N) is column-major (N, K) = op(b)^T already: no op. Stored
  // row-major (N, K) (trans_b) is column-major (K, N): cuBLAS must transpose it.
  g.op_t_first = trans_b;
  g.first_rows = trans_b ? k : n;
  g.first_cols = trans_b ? n : k;
  g.first_ld = ldb;
  // Our a stored row-major (M, K) is column-major (K, M) = op(a)^T; stored (K, M) (trans_a) is
  // column-major (M, K), transposed by cuBLAS.
  g.op_t_second = trans_a;
  g.second_rows = trans_a ? m : k;
  g.second_cols = trans_a ? k : m;
  g.second_ld = lda;
  g.c_rows = n;
  g.c_cols = m;
  g.c_ld = ldc;
  return g;
}

}  // namespace tessera::cuda
