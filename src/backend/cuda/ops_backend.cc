// ops::Backend on CUDA: argument mapping from ops/ onto the kernels' launch functions, device
// memory, copies and a growable scratch buffer. Training attention runs only with its operands
// rounded to bf16 (the flash kernels' type); asked in f32 it throws, naming the op.
#include "backend/cuda/ops_backend.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm_lt.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels_rows.h"
#include "backend/cuda/quant_matvec.h"
#include "backend/cuda/runtime.h"
#include "backend/cuda/train_kernels.h"
#include "core/error.h"
#include "ops/backend.h"

namespace tessera::cuda {

namespace {

// Rows from which a block-typed or 16-bit weight's product takes the f16 tensor-core GEMM (the
// weight widened first) instead of matvec passes of 8 rows, each of which reads the whole
// weight: past 64 rows, eight passes.
constexpr int64_t kGemmMinRows = 65;
// Splits per (row, head) the paged decode kernel may use on long contexts.
constexpr int64_t kAttnSplits = 32;
// With an f16 cache, runs of at least this many rows of one sequence (a prompt) take the
// tensor-core prefill attention in tiles of 64 rows; shorter runs (decode rows) the decode
// kernel, which splits long contexts over the GPU where a lone row's tile could not.
constexpr int64_t kPrefillMinRows = 16;

// The attention plan of `rows` rows (ops::plan_paged_attention): the prefill tiles, then, 16-byte
// aligned, the decode rows; their counts are the plan's key (tiles << 32 | decode rows; 0: no
// tiles, every row on the decode kernel).
size_t plan_decode_rows_at(int64_t rows) {
  return (static_cast<size_t>(rows) * sizeof(PagedPrefillTile) + 15) / 16 * 16;
}

[[noreturn]] void not_here(const char* op, const char* why) {
  throw Error(cat("[cuda] ", op, " through ops/ is not implemented on CUDA: ", why));
}

// An on/off switch from the environment, for measuring what a mechanism saves: unset gives
// `unset`, "0" off, "1" on; anything else throws naming the variable.
bool env_switch(const char* name, bool unset) {
  const char* v = std::getenv(name);
  if (v == nullptr) return unset;
  const std::string s(v);
  TS_CHECK(s == "0" || s == "1", "[cuda] ", name, "=", s, " must be 0 (off) or 1 (on)");
  return s == "1";
}

class CudaOpsBackend final : public ops::Backend {
 public:
  std::string_view name() const override { return "cuda"; }
  void require_device(std::string_view user) const override {
    cuda::require_device(0, std::string(user).c_str());
  }

  // ---- memory ----
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error state of a failed allocation
      throw Error(cat("[cuda] cannot allocate ", bytes,
                      " bytes of device memory: ", cudaGetErrorString(e)));
    }
    return p;
  }
  void release(void* p) noexcept override { cudaFree(p); }
  void copy(const ops::Context& ctx, void* dst, const void* src, size_t bytes,
            ops::CopyKind kind) override {
    cudaStream_t s = stream(ctx);
    switch (kind) {
      case ops::CopyKind::host_to_device:
        copy_to_device_async(dst, src, bytes, s);
        // The host buffer may change as soon as this returns (the forward pass restages it).
        TS_CUDA_CHECK(cudaStreamSynchronize(s));
        return;
      case ops::CopyKind::device_to_host:
        copy_to_host_async(dst, src, bytes, s);
        TS_CUDA_CHECK(cudaStreamSynchronize(s));
        return;
      case ops::CopyKind::device_to_device:
        copy_device_to_device_async(dst, src, bytes, s);
        return;
    }
  }
  void synchronize(const ops::Context& ctx) override {
    TS_CUDA_CHECK(cudaStreamSynchronize(stream(ctx)));
  }
  void zero(const ops::Context& ctx, void* p, size_t bytes) override {
    TS_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream(ctx)));
  }

  // ---- products ----
  void gemm(const ops::Context& ctx, const ops::GemmArgs& g) override {
    cudaStream_t s = stream(ctx);
    // Both operands of a cuBLASLt product share a type: bf16 when either is bf16 or the product
    // is asked in bf16 (an f32 operand is then rounded into scratch), else f32.
    const bool bf16 = g.round_bf16 || g.a_type == DType::bf16 || g.b_type == DType::bf16;
    const int64_t a_elems = (g.trans_a == ops::Trans::N ? g.m : g.k) * g.lda;
    const int64_t b_elems = (g.trans_b == ops::Trans::N ? g.k : g.n) * g.ldb;
    const void* a = g.a;
    const void* b = g.b;
    if (bf16) {
      auto* sa = static_cast<__nv_bfloat16*>(
          scratch((g.a_type == DType::f32 ? a_elems : 0) + (g.b_type == DType::f32 ? b_elems : 0),
                  sizeof(uint16_t)));
      if (g.a_type == DType::f32) {
        cuda::convert_f32_to_bf16(sa, static_cast<const float*>(g.a), a_elems, s);
        a = sa;
        sa += a_elems;
      }
      if (g.b_type == DType::f32) {
        cuda::convert_f32_to_bf16(sa, static_cast<const float*>(g.b), b_elems, s);
        b = sa;
      }
    }
    LtGemmArgs l;
    l.trans_a = g.trans_a == ops::Trans::T;
    l.trans_b = g.trans_b == ops::Trans::T;
    l.m = g.m, l.n = g.n, l.k = g.k;
    l.a = a, l.lda = g.lda, l.b = b, l.ldb = g.ldb;
    l.a_type = l.b_type = bf16 ? LtType::bf16 : LtType::f32;
    l.c = g.c, l.c_type = LtType::f32, l.ldc = g.ldc;
    l.accumulate = g.accumulate;
    if (g.bias) l.epilogue = LtEpilogue::bias, l.bias = const_cast<float*>(g.bias);
    gemm_lt(l, s);
  }

  void matmul_wt(const ops::Context& ctx, float* y, int64_t ldy, const float* x, int64_t M,
                 int64_t K, const void* w, DType w_type, int64_t N, const float* bias) override {
    cudaStream_t s = stream(ctx);
    void* b = const_cast<float*>(bias);
    if (w_type == DType::f32) {
      LtGemmArgs l = lt_linear(y, LtType::f32, x, w, LtType::f32, M, N, K, b);
      l.ldc = ldy;
      gemm_lt(l, s);
      return;
    }
    if (M >= kGemmMinRows && w_type == DType::bf16) {
      // bf16 weights: x rounded to bf16 (ops::matmul_wt's rule) and one bf16 tensor-core GEMM
      // against W as stored (widening it to f16 would also lose bf16's exponent range).
      auto* x16 = static_cast<__nv_bfloat16*>(scratch(M * K, sizeof(uint16_t)));
      cuda::convert_f32_to_bf16(x16, x, M * K, s);
      LtGemmArgs l = lt_linear(y, LtType::f32, x16, w, LtType::bf16, M, N, K, b);
      l.ldc = ldy;
      gemm_lt(l, s);
      return;
    }
    if (M >= kGemmMinRows) {
      // Widen W and x to f16 and run one tensor-core GEMM, f32 accumulation and output.
      auto* w16 = static_cast<uint16_t*>(scratch(N * K + M * K, sizeof(uint16_t)));
      uint16_t* x16 = w16 + N * K;
      const void* wp = w;
      if (w_type != DType::f16) {
        dequantize_to_f16(w16, w, w_type, N, K, s);
        wp = w16;
      }
      convert_f32_to_f16(x16, x, M * K, s);
      LtGemmArgs l = lt_linear(y, LtType::f32, x16, wp, LtType::f16, M, N, K, b);
      l.ldc = ldy;
      gemm_lt(l, s);
      return;
    }
    // The activations' quantization scratch is this backend's (graphs keep its address).
    const size_t ws = matmul_wt_workspace_bytes(std::min(kMatvecMaxRows, M), K, w_type);
    void* work = ws ? scratch(static_cast<int64_t>(ws), 1) : nullptr;
    for (int64_t r0 = 0; r0 < M; r0 += kMatvecMaxRows) {
      const int64_t m = std::min(kMatvecMaxRows, M - r0);
      cuda::matmul_wt(y + r0 * ldy, ldy, x + r0 * K, m, K, w, w_type, N, bias, work, ws, s);
    }
  }
  void matmul_w(const ops::Context& ctx, float* dx, int64_t ldx, const float* dy, int64_t M,
                int64_t N, const void* w, DType w_type, int64_t K, bool accumulate) override {
    cudaStream_t s = stream(ctx);
    // dx (M,K) = dy (M,N) W (N,K): W widened to f32 (through f16 for the block types) in scratch,
    // then one f32 product; the scratch holds N*K floats for the call only.
    const void* wf = w;
    if (w_type != DType::f32) {
      auto* w32 = static_cast<float*>(scratch(N * K + (N * K + 1) / 2, sizeof(float)));
      auto* w16 = reinterpret_cast<uint16_t*>(w32 + N * K);
      dequantize_to_f16(w16, w, w_type, N, K, s);
      convert_f16_to_f32(w32, w16, N * K, s);
      wf = w32;
    }
    LtGemmArgs l;
    l.m = M, l.n = K, l.k = N;
    l.a = dy, l.lda = N, l.b = wf, l.ldb = K;
    l.a_type = l.b_type = LtType::f32;
    l.c = dx, l.c_type = LtType::f32, l.ldc = ldx;
    l.accumulate = accumulate;
    gemm_lt(l, s);
  }
  // Matvec-sized groups whose weights take the same activation blocks quantize x once (the first
  // product's launch) and run the others on it: 1 + P launches instead of 2 P.
  // Quantized rows: the activation blocks matmul_wt's workspace holds, for block-typed weights
  // at the matvec's rows.
  int64_t quantized_rows_bytes(int64_t rows, int64_t cols, DType t) const override {
    if (rows < 1 || rows > kMatvecMaxRows || act_block_elems(t) == 0) return 0;
    for (DType k : {DType::q8_0, DType::q4_0, DType::q4_1, DType::q5_0, DType::q5_1, DType::q4_k,
                    DType::q5_k, DType::q6_k})
      if (t == k) return static_cast<int64_t>(matmul_wt_workspace_bytes(rows, cols, t));
    return 0;  // a block type without a matvec kernel here
  }
  static QuantizedActs acts(const ops::QuantizedRows& q) {
    return quantized_acts_view(q.data, matmul_wt_workspace_bytes(q.rows, q.cols, q.for_type),
                               q.rows, q.cols, q.for_type);
  }
  void matmul_wt_group(const ops::Context& ctx, const float* x, int64_t M, int64_t K,
                       std::span<const ops::WtProduct> products,
                       const ops::QuantizedRows* xq) override {
    if (xq) {  // each product whose weights take xq's blocks reads it; any other reads x
      const QuantizedActs q = acts(*xq);
      for (const ops::WtProduct& p : products)
        if (act_block_elems(p.w_type) == q.block)
          matmul_wt_quantized(p.y, p.ldy, q, p.w, p.w_type, p.N, p.bias, stream(ctx));
        else
          matmul_wt(ctx, p.y, p.ldy, x, M, K, p.w, p.w_type, p.N, p.bias);
      return;
    }
    const int64_t block = products.empty() ? 0 : act_block_elems(products[0].w_type);
    bool shared = M >= 1 && M <= kMatvecMaxRows && block > 0;
    for (const ops::WtProduct& p : products) shared = shared && act_block_elems(p.w_type) == block;
    if (!shared) {
      for (const ops::WtProduct& p : products)
        matmul_wt(ctx, p.y, p.ldy, x, M, K, p.w, p.w_type, p.N, p.bias);
      return;
    }
    cudaStream_t s = stream(ctx);
    const ops::WtProduct& first = products[0];
    const size_t ws = matmul_wt_workspace_bytes(M, K, first.w_type);
    void* work = scratch(static_cast<int64_t>(ws), 1);
    cuda::matmul_wt(first.y, first.ldy, x, M, K, first.w, first.w_type, first.N, first.bias, work,
                    ws, s);
    // Any type with this activation block gives the same workspace layout.
    const QuantizedActs q = quantized_acts_view(work, ws, M, K, first.w_type);
    for (size_t i = 1; i < products.size(); ++i) {
      const ops::WtProduct& p = products[i];
      matmul_wt_quantized(p.y, p.ldy, q, p.w, p.w_type, p.N, p.bias, s);
    }
  }

  // ---- norms and element-wise ops ----
  void layernorm_forward(const ops::Context& ctx, float* out, float* mean, float* rstd,
                         const float* inp, const float* w, const float* b, int64_t N,
                         int64_t C) override {
    cuda::layernorm_forward<float>(out, mean, rstd, inp, w, b, N, C, stream(ctx));
  }
  void layernorm_backward(const ops::Context& ctx, const ops::NormBackwardArgs& a) override {
    auto* ws = static_cast<float*>(scratch(norm_backward_workspace_floats(a.N, a.C), 4));
    cuda::layernorm_backward<float>(a.dinp, a.dw, a.db, a.dout, a.inp, a.w, a.mean, a.rstd, a.N,
                                    a.C, ws, stream(ctx));
  }
  void residual_norm(const ops::Context& ctx, const ops::ResidualNormArgs& a) override {
    if (a.q_out) {  // one launch: the join, the norm and its quantized rows
      cuda::norm_quantize_f32(a.kind == ops::NormKind::layer, a.x_out, a.out, a.mean, a.rstd, a.a,
                              a.r, a.w, a.b, a.N, a.C, a.eps, acts(*a.q_out), stream(ctx));
      return;
    }
    if (a.kind == ops::NormKind::layer)
      cuda::layernorm_residual_forward<float>(a.x_out, a.out, a.mean, a.rstd, a.a, a.r, a.w, a.b,
                                              a.N, a.C, stream(ctx));
    else
      cuda::rmsnorm_residual_forward<float>(a.x_out, a.out, a.rstd, a.a, a.r, a.w, a.N, a.C, a.eps,
                                            stream(ctx));
  }
  void rmsnorm_forward(const ops::Context& ctx, float* out, float* rstd, const float* inp,
                       const float* w, int64_t N, int64_t C, float eps) override {
    cuda::rmsnorm_forward<float>(out, rstd, inp, w, N, C, eps, stream(ctx));
  }
  void head_rmsnorm(const ops::Context& ctx, float* x, int64_t ld, int64_t n, int64_t heads,
                    int64_t D, const float* w, float eps) override {
    cuda::head_rmsnorm(x, ld, n, heads, D, w, eps, stream(ctx));
  }
  void head_rmsnorm_backward(const ops::Context& ctx, const ops::HeadNormBackwardArgs& a) override {
    auto* ws =
        static_cast<float*>(scratch(cuda::head_rmsnorm_backward_workspace(a.n, a.heads, a.D), 4));
    cuda::head_rmsnorm_backward(a.dx, a.dw, a.dy, a.x, a.ld, a.ld_x, a.n, a.heads, a.D, a.w, a.eps,
                                ws, stream(ctx));
  }
  void rmsnorm_backward(const ops::Context& ctx, const ops::NormBackwardArgs& a) override {
    auto* ws = static_cast<float*>(scratch(norm_backward_workspace_floats(a.N, a.C), 4));
    cuda::rmsnorm_backward<float>(a.dinp, a.dw, a.dout, a.inp, a.w, a.rstd, a.N, a.C, ws,
                                  stream(ctx));
  }
  void gelu_forward(const ops::Context& ctx, float* out, const float* inp, int64_t n) override {
    cuda::gelu_forward<float>(out, inp, n, stream(ctx));
  }
  void gelu_backward(const ops::Context& ctx, float* dinp, const float* inp, const float* dout,
                     int64_t n) override {
    cuda::gelu_backward<float>(dinp, inp, dout, n, stream(ctx));
  }
  void add(const ops::Context& ctx, float* out, const float* a, const float* b,
           int64_t n) override {
    cuda::add<float>(out, a, b, n, stream(ctx));
  }
  void glu_forward(const ops::Context& ctx, float* out, const float* gate, const float* up,
                   int64_t N, int64_t F, ops::GluAct act, const ops::QuantizedRows* q) override {
    if (q && act == ops::GluAct::silu) {  // one launch: SwiGLU and its quantized rows
      cuda::swiglu_quantize_f32(out, gate, up, N, F, acts(*q), stream(ctx));
      return;
    }
    if (act == ops::GluAct::silu)
      cuda::swiglu_forward<float>(out, gate, up, N, F, stream(ctx));
    else
      cuda::geglu_forward<float>(out, gate, up, N, F, stream(ctx));
    if (q) quantize_acts(out, acts(*q), stream(ctx));
  }
  void glu_backward(const ops::Context& ctx, float* dgate, float* dup, const float* dout,
                    const float* gate, const float* up, int64_t N, int64_t F,
                    ops::GluAct act) override {
    if (act == ops::GluAct::silu)
      cuda::swiglu_backward<float>(dgate, dup, dout, gate, up, N, F, stream(ctx));
    else
      cuda::geglu_backward<float>(dgate, dup, dout, gate, up, N, F, stream(ctx));
  }
  void rope_forward(const ops::Context& ctx, float* out, const float* inp,
                    const ops::RopeTable& table, const int32_t* positions, int64_t pos0, int64_t B,
                    int64_t T, int64_t H, int64_t D, ops::RopeLayout layout) override {
    cuda::rope_forward<float>(out, inp, view(table), positions, pos0, B, T, H, D, rope(layout),
                              stream(ctx));
  }
  void rope_backward(const ops::Context& ctx, float* dinp, const float* dout,
                     const ops::RopeTable& table, const int32_t* positions, int64_t pos0, int64_t B,
                     int64_t T, int64_t H, int64_t D, ops::RopeLayout layout) override {
    cuda::rope_backward<float>(dinp, dout, view(table), positions, pos0, B, T, H, D, rope(layout),
                               stream(ctx));
  }

  // ---- loss, optimizer, reductions ----
  void softmax_xent(const ops::Context& ctx, float* losses, float* logits, const int32_t* targets,
                    int64_t N, int64_t V, int64_t Vp, float dlogits_scale) override {
    cuda::softmax_xent<float>(losses, logits, targets, N, V, Vp, dlogits_scale, stream(ctx));
  }
  void adamw(const ops::Context& ctx, float* params, const float* grads, float* m, float* v,
             int64_t n, const ops::AdamWArgs& a) override {
    cuda::adamw<float>(params, nullptr, grads, m, v, n, a, stream(ctx));
  }
  double sum_squares(const ops::Context& ctx, const float* x, int64_t n) override {
    cudaStream_t s = stream(ctx);
    const int64_t ws = global_sum_squares_workspace(&n, 1);
    auto* d = static_cast<double*>(scratch(ws + 1, sizeof(double)));
    const float* ptrs[1] = {x};
    global_sum_squares<float>(d + ws, ptrs, &n, 1, d, s);
    double out = 0;
    copy_to_host_async(&out, d + ws, sizeof(double), s);
    TS_CUDA_CHECK(cudaStreamSynchronize(s));
    return out;
  }
  void scale(const ops::Context& ctx, float* x, int64_t n, float s) override {
    cuda::scale<float>(x, n, s, stream(ctx));
  }
  void convert_f32_to_bf16(const ops::Context& ctx, uint16_t* dst, const float* src,
                           int64_t n) override {
    cuda::convert_f32_to_bf16(reinterpret_cast<__nv_bfloat16*>(dst), src, n, stream(ctx));
  }
  void convert_bf16_to_f32(const ops::Context& ctx, float* dst, const uint16_t* src,
                           int64_t n) override {
    cuda::convert_bf16_to_f32(dst, reinterpret_cast<const __nv_bfloat16*>(src), n, stream(ctx));
  }
  void round_to_bf16(const ops::Context& ctx, float* x, uint16_t* keep, int64_t n) override {
    cuda::round_to_bf16(x, reinterpret_cast<__nv_bfloat16*>(keep), n, stream(ctx));
  }

  // ---- embeddings, training attention, bias gradients ----
  void embedding_forward(const ops::Context& ctx, float* out, const int32_t* tokens,
                         const float* wte, const float* wpe, int64_t B, int64_t T, int64_t C,
                         int64_t V) override {
    cuda::embedding_forward<float>(out, tokens, wte, wpe, B, T, C, V, stream(ctx));
  }
  void embedding_backward(const ops::Context& ctx, float* dwte, float* dwpe, const float* dout,
                          const int32_t* tokens, int64_t B, int64_t T, int64_t C,
                          int64_t V) override {
    cuda::embedding_backward<float>(dwte, dwpe, dout, tokens, B, T, C, V, stream(ctx));
  }
  // The flash kernels read and write bf16: q, k, v (and out, dout for the backward) are rounded
  // into scratch, as the CPU's round_bf16 attention rounds its operands, and the results widened
  // back. The log-sum-exp stays f32 either way.
  void attention_forward(const ops::Context& ctx, float* out, float* lse, const float* qkv,
                         const ops::AttentionArgs& a) override {
    const int64_t B = a.B, T = a.T, C = a.C, H = a.H, Hkv = a.Hkv;
    if (!a.round_bf16)
      not_here("attention_forward in f32", "the flash kernels compute in bf16 (precision bf16)");
    cudaStream_t s = stream(ctx);
    const int64_t N = B * T, D = C / H, ld = C + 2 * Hkv * D;
    auto* qkv16 = static_cast<__nv_bfloat16*>(scratch(N * (ld + C), sizeof(uint16_t)));
    __nv_bfloat16* out16 = qkv16 + N * ld;
    cuda::convert_f32_to_bf16(qkv16, qkv, N * ld, s);
    const AttnLayout rows{T * ld, ld, D};  // q, k and v inside each row of qkv
    FlashForwardArgs f;
    f.shape = flash_shape(a);
    f.q = {qkv16, rows};
    f.k = {qkv16 + C, rows};
    f.v = {qkv16 + C + Hkv * D, rows};
    f.out = {out16, contiguous_layout(T, H, D)};
    f.lse = lse;
    flash_attention_forward(f, s);
    cuda::convert_bf16_to_f32(out, out16, N * C, s);
  }
  void attention_backward(const ops::Context& ctx, float* dqkv, const float* dout, const float* qkv,
                          const float* out, const float* lse,
                          const ops::AttentionArgs& a) override {
    const int64_t B = a.B, T = a.T, C = a.C, H = a.H, Hkv = a.Hkv;
    if (!a.round_bf16)
      not_here("attention_backward in f32", "the flash kernels compute in bf16 (precision bf16)");
    cudaStream_t s = stream(ctx);
    const int64_t N = B * T, D = C / H, ld = C + 2 * Hkv * D;
    const FlashAttentionShape shape = flash_shape(a);
    // Scratch: the kernel's workspace, then qkv, dqkv, out and dout in bf16.
    const int64_t ws =
        (static_cast<int64_t>(flash_attention_backward_workspace_bytes(shape)) + 255) / 256 * 256;
    auto* base = static_cast<char*>(scratch(ws + (2 * N * ld + 2 * N * C) * 2, 1));
    auto* qkv16 = reinterpret_cast<__nv_bfloat16*>(base + ws);
    __nv_bfloat16* dqkv16 = qkv16 + N * ld;
    __nv_bfloat16* out16 = dqkv16 + N * ld;
    __nv_bfloat16* dout16 = out16 + N * C;
    cuda::convert_f32_to_bf16(qkv16, qkv, N * ld, s);
    cuda::convert_f32_to_bf16(out16, out, N * C, s);
    cuda::convert_f32_to_bf16(dout16, dout, N * C, s);
    const AttnLayout rows{T * ld, ld, D};
    const AttnLayout plain = contiguous_layout(T, H, D);
    FlashBackwardArgs f;
    f.shape = shape;
    f.q = {qkv16, rows};
    f.k = {qkv16 + C, rows};
    f.v = {qkv16 + C + Hkv * D, rows};
    f.out = {out16, plain};
    f.dout = {dout16, plain};
    f.lse = lse;
    f.dq = {dqkv16, rows};
    f.dk = {dqkv16 + C, rows};
    f.dv = {dqkv16 + C + Hkv * D, rows};
    f.workspace = base;
    flash_attention_backward(f, s);
    cuda::convert_bf16_to_f32(dqkv, dqkv16, N * ld, s);
  }
  void bias_grad(const ops::Context& ctx, float* db, const float* dy, int64_t m,
                 int64_t n) override {
    auto* ws = static_cast<float*>(scratch(bias_grad_workspace_floats(m, n), sizeof(float)));
    bias_grad_accumulate<float>(db, dy, m, n, ws, stream(ctx));
  }

  // ---- the paged cache ----
  // TESSERA_CUDA_PAGED_PREFILL=0 keeps prompts on the decode kernel (to measure the tiles, or to
  // rule them out); read at each plan.
  int64_t paged_attention_plan_bytes(int64_t rows) const override {
    return static_cast<int64_t>(plan_decode_rows_at(rows)) + (rows * 4 + 15) / 16 * 16;
  }
  int64_t plan_paged_attention(const ops::PagedAttentionArgs& a, void* plan) const override {
    if (a.kv_type != DType::f16 || !env_switch("TESSERA_CUDA_PAGED_PREFILL", true)) return 0;
    const PagedPrefillPlan p = plan_paged_prefill(a.rows, a.n_keys, a.first_key, a.block_tables,
                                                  a.table_stride, kPrefillMinRows);
    if (p.tiles.empty()) return 0;
    auto* at = static_cast<uint8_t*>(plan);
    std::memcpy(at, p.tiles.data(), p.tiles.size() * sizeof(PagedPrefillTile));
    std::memcpy(at + plan_decode_rows_at(a.rows), p.decode_rows.data(),
                p.decode_rows.size() * sizeof(int32_t));
    return static_cast<int64_t>(p.tiles.size()) << 32 | static_cast<int64_t>(p.decode_rows.size());
  }
  void paged_attention(const ops::Context& ctx, const ops::PagedAttentionArgs& a) override {
    TS_CHECK(!a.k_transposed, "[cuda] paged attention reads keys as rows (k_transposed false)");
    cudaStream_t s = stream(ctx);
    PagedDecodeArgs d;
    d.out = a.out;
    d.q = a.q;
    d.rows = a.rows, d.H = a.H, d.Hkv = a.Hkv, d.D = a.D;
    d.kv = a.kv;
    d.kv_dtype = a.kv_type;
    d.block_tokens = a.block_tokens, d.block_stride = a.block_stride, d.v_offset = a.v_offset;
    d.block_tables = a.block_tables;
    d.table_stride = a.table_stride;
    d.n_keys = a.n_keys;
    d.max_keys = a.max_keys;
    d.first_key = a.first_key;
    d.scale = a.scale;
    const int64_t floats = paged_decode_workspace_floats(a.rows, a.H, a.D, kAttnSplits);
    d.workspace = static_cast<float*>(scratch(floats, sizeof(float)));
    d.workspace_floats = floats;
    if (a.plan && a.plan_key != 0) {
      const auto* at = static_cast<const uint8_t*>(a.plan);
      d.prefill_tiles = reinterpret_cast<const PagedPrefillTile*>(at);
      d.n_prefill_tiles = a.plan_key >> 32;
      d.decode_rows = reinterpret_cast<const int32_t*>(at + plan_decode_rows_at(a.rows));
      d.n_decode_rows = a.plan_key & 0xffffffff;
    }
    // The decode kernel quantizes its own output in blocks of 32 where no tile runs; otherwise
    // a quantization after it.
    QuantizedActs q;
    if (a.q_out) q = acts(*a.q_out);
    const bool fused = a.q_out && d.n_prefill_tiles == 0 && q.block == 32;
    if (fused) d.quantize_out = &q;
    paged_decode_attention(d, s);
    if (a.q_out && !fused) quantize_acts(a.out, q, s);
  }
  void kv_append(const ops::Context& ctx, const ops::KvAppendArgs& a) override {
    TS_CHECK(!a.k_transposed, "[cuda] the paged cache keeps keys as rows (k_transposed false)");
    cudaStream_t s = stream(ctx);
    const int64_t KV = a.Hkv * a.D;
    // The append kernel reads packed (rows, Hkv*D) keys and values.
    const float* k = a.k;
    const float* v = a.v;
    if (a.ldk != KV || a.ldv != KV) {
      auto* packed = static_cast<float*>(scratch(2 * a.rows * KV, sizeof(float)));
      if (a.ldk != KV) {
        copy_rows(ctx, packed, KV, a.k, a.ldk, a.rows, KV);
        k = packed;
      }
      if (a.ldv != KV) {
        copy_rows(ctx, packed + a.rows * KV, KV, a.v, a.ldv, a.rows, KV);
        v = packed + a.rows * KV;
      }
    }
    kv_cache_append(a.kv, a.kv_type, k, v, a.slot, a.rows, a.Hkv, a.D, a.block_tokens,
                    a.block_stride, a.v_offset, s);
  }
  // One launch: the kernel reads q, k and v at their strides and writes q_out and the cache.
  void rope_kv_append(const ops::Context& ctx, const ops::RopeKvAppendArgs& a) override {
    TS_CHECK(!a.k_transposed, "[cuda] the paged cache keeps keys as rows (k_transposed false)");
    RopeAppendArgs r;
    r.q = a.q, r.q_out = a.q_out, r.k = a.k, r.v = a.v;
    r.ldq = a.ldq, r.ldk = a.ldk, r.ldv = a.ldv;
    r.rows = a.rows, r.H = a.H, r.Hkv = a.Hkv, r.D = a.D;
    if (a.rope) {
      r.table = view(*a.rope);
      r.layout = rope(a.layout);
      r.positions = a.positions;
    }
    r.layer_kv = a.kv, r.kv_type = a.kv_type, r.slot = a.slot;
    r.block_tokens = a.block_tokens, r.block_stride = a.block_stride, r.v_offset = a.v_offset;
    cuda::rope_kv_append(r, stream(ctx));
  }
  void copy_rows(const ops::Context& ctx, float* dst, int64_t ld_dst, const float* src,
                 int64_t ld_src, int64_t rows, int64_t cols) override {
    TS_CUDA_CHECK(cudaMemcpy2DAsync(
        dst, static_cast<size_t>(ld_dst) * sizeof(float), src,
        static_cast<size_t>(ld_src) * sizeof(float), static_cast<size_t>(cols) * sizeof(float),
        static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, stream(ctx)));
  }
  void gather_rows(const ops::Context& ctx, float* dst, const float* src, const int32_t* index,
                   int64_t n, int64_t C) override {
    cuda::gather_rows(dst, src, index, n, C, stream(ctx));
  }
  void scatter_add_rows(const ops::Context& ctx, float* dst, const float* src, const int32_t* index,
                        const float* weight, int64_t n, int64_t C) override {
    cuda::scatter_add_rows(dst, src, index, weight, n, C, stream(ctx));
  }
  void scatter_add_rows_backward(const ops::Context& ctx, float* dsrc, float* dweight,
                                 const float* dy, const float* src, const int32_t* index,
                                 const float* weight, int64_t n, int64_t C) override {
    cuda::scatter_add_rows_backward(dsrc, dweight, dy, src, index, weight, n, C, stream(ctx));
  }
  void moe_route(const ops::Context& ctx, int32_t* ids, float* weights, const float* logits,
                 int64_t n, int64_t E, int64_t k, bool normalize) override {
    cuda::moe_route(ids, weights, logits, n, E, k, normalize, stream(ctx));
  }
  void moe_route_backward(const ops::Context& ctx, float* dlogits, const float* dweights,
                          const int32_t* ids, const float* logits, int64_t n, int64_t E, int64_t k,
                          bool normalize) override {
    cuda::moe_route_backward(dlogits, dweights, ids, logits, n, E, k, normalize, stream(ctx));
  }

  // ---- graphs: a stream capture, instantiated ----
  // TESSERA_CUDA_GRAPHS=0 runs every step eagerly (to measure what the graphs save).
  bool records_graphs() const override {
    static const bool on = env_switch("TESSERA_CUDA_GRAPHS", true);
    return on;
  }
  void begin_graph(const ops::Context& ctx) override {
    TS_CUDA_CHECK(cudaStreamBeginCapture(stream(ctx), cudaStreamCaptureModeThreadLocal));
  }
  void* end_graph(const ops::Context& ctx) override {
    cudaGraph_t graph = nullptr;
    TS_CUDA_CHECK(cudaStreamEndCapture(stream(ctx), &graph));
    if (graph == nullptr) return nullptr;
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    TS_CUDA_CHECK(e);
    return exec;
  }
  void replay_graph(const ops::Context& ctx, void* g) override {
    TS_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(g), stream(ctx)));
  }
  void destroy_graph(void* g) noexcept override {
    if (g) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(g));
  }

  // ---- layout questions ----
  int64_t matmul_wt_saturating_rows(DType) const override { return 512; }
  DType preferred_layout(DType t, int64_t) const override { return t; }
  bool paged_keys_transposed() const override { return false; }

 private:
  cudaStream_t stream(const ops::Context& ctx) {
    if (ctx.stream) return static_cast<cudaStream_t>(ctx.stream);
    std::call_once(stream_once_, [&] { own_stream_ = std::make_unique<Stream>(); });
    return own_stream_->get();
  }
  // At least n elements of `elem` bytes of device scratch, used in stream order by one op at a
  // time (one stream at a time uses this backend). A larger request takes a new buffer of twice
  // the size; the old ones stay allocated until the backend goes, because a recorded graph keeps
  // the address it saw (a graph's first run is eager, so it never grows the scratch itself).
  void* scratch(int64_t n, size_t elem) {
    const size_t bytes = static_cast<size_t>(std::max<int64_t>(n, 1)) * elem;
    std::lock_guard<std::mutex> lock(scratch_mutex_);
    if (bytes > scratch_bytes_) {
      if (scratch_) retired_.push_back(scratch_);
      scratch_bytes_ = std::max(bytes, 2 * scratch_bytes_);
      scratch_ = allocate(scratch_bytes_);
    }
    return scratch_;
  }
  // Causal self-attention over (B,T) rows: H query heads of C/H, Hkv key/value heads.
  static FlashAttentionShape flash_shape(const ops::AttentionArgs& a) {
    FlashAttentionShape f;
    f.B = a.B, f.T = a.T, f.Hq = a.H, f.Hkv = a.Hkv, f.D = a.C / a.H;
    f.scale = 1.0f / std::sqrt(static_cast<float>(f.D));
    f.causal = true;
    f.dtype = DType::bf16;
    f.window = a.window;
    return f;
  }
  static RopeTableView view(const ops::RopeTable& t) {
    TS_CHECK(t.device != nullptr,
             "[cuda] the RoPE table has no device copy (ops::RopeTable::device)");
    RopeTableView v;
    v.cos = t.device;
    v.sin = t.device + t.max_pos * (t.rotary_dim / 2);
    v.max_pos = t.max_pos;
    v.rotary_dim = t.rotary_dim;
    return v;
  }
  static RopeLayout rope(ops::RopeLayout l) {
    return l == ops::RopeLayout::interleaved ? RopeLayout::interleaved : RopeLayout::half;
  }

  std::once_flag stream_once_;
  std::unique_ptr<Stream> own_stream_;
  std::mutex scratch_mutex_;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  std::vector<void*> retired_;
};

}  // namespace

void register_ops_backend() {
  static CudaOpsBackend instance;
  ops::register_backend(ops::Device::cuda, &instance);
}

}  // namespace tessera::cuda
