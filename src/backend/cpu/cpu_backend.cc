// ops::Backend for the CPU: each op goes to the reference kernel or to the SIMD kernel on the
// context's thread pool.
#include "backend/cpu/cpu_backend.h"

#include <cstring>
#include <vector>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/paged_attention.h"
#include "backend/cpu/quant_matmul_avx2.h"
#include "backend/cpu/ref/ref_kernels.h"
#include "backend/cpu/rows.h"
#include "core/dtype.h"
#include "core/interleave.h"
#include "core/large_alloc.h"
#include "ops/backend.h"

namespace tessera::cpu {

namespace {

// `name(args...)`: the reference kernel (no pool) or the SIMD kernel (the pool first).
#define TS_CPU_OP(name, ...)                          \
  do {                                                \
    if (ctx.reference) return ref::name(__VA_ARGS__); \
    return cpu::name(ctx.threads(), __VA_ARGS__);     \
  } while (0)

class CpuBackend final : public ops::Backend {
 public:
  std::string_view name() const override { return "cpu"; }

  void gemm(const ops::Context& ctx, const ops::GemmArgs& g) override { TS_CPU_OP(gemm, g); }
  void embedding_forward(const ops::Context& ctx, float* out, const int32_t* tokens,
                         const float* wte, const float* wpe, int64_t B, int64_t T, int64_t C,
                         int64_t V) override {
    TS_CPU_OP(embedding_forward, out, tokens, wte, wpe, B, T, C, V);
  }
  void embedding_backward(const ops::Context& ctx, float* dwte, float* dwpe, const float* dout,
                          const int32_t* tokens, int64_t B, int64_t T, int64_t C,
                          int64_t V) override {
    TS_CPU_OP(embedding_backward, dwte, dwpe, dout, tokens, B, T, C, V);
  }
  void layernorm_forward(const ops::Context& ctx, float* out, float* mean, float* rstd,
                         const float* inp, const float* w, const float* b, int64_t N,
                         int64_t C) override {
    TS_CPU_OP(layernorm_forward, out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_backward(const ops::Context& ctx, const ops::NormBackwardArgs& a) override {
    TS_CPU_OP(layernorm_backward, a.dinp, a.dw, a.db, a.dout, a.inp, a.w, a.mean, a.rstd, a.N, a.C);
  }
  void gelu_forward(const ops::Context& ctx, float* out, const float* inp, int64_t n) override {
    TS_CPU_OP(gelu_forward, out, inp, n);
  }
  void gelu_backward(const ops::Context& ctx, float* dinp, const float* inp, const float* dout,
                     int64_t n) override {
    TS_CPU_OP(gelu_backward, dinp, inp, dout, n);
  }
  void add(const ops::Context& ctx, float* out, const float* a, const float* b,
           int64_t n) override {
    TS_CPU_OP(add, out, a, b, n);
  }
  // The reference kernels compute in f32 whatever round_bf16 says (ops.h).
  void attention_forward(const ops::Context& ctx, float* out, float* lse, const float* qkv,
                         const ops::AttentionArgs& a) override {
    if (ctx.reference) return ref::attention_forward(out, lse, qkv, a);
    cpu::attention_forward(ctx.threads(), out, lse, qkv, a);
  }
  void attention_backward(const ops::Context& ctx, float* dqkv, const float* dout, const float* qkv,
                          const float* out, const float* lse,
                          const ops::AttentionArgs& a) override {
    if (ctx.reference) return ref::attention_backward(dqkv, dout, qkv, out, lse, a);
    cpu::attention_backward(ctx.threads(), dqkv, dout, qkv, out, lse, a);
  }
  void softmax_xent(const ops::Context& ctx, float* losses, float* logits, const int32_t* targets,
                    int64_t N, int64_t V, int64_t Vp, float dlogits_scale) override {
    TS_CPU_OP(softmax_xent, losses, logits, targets, N, V, Vp, dlogits_scale);
  }
  void adamw(const ops::Context& ctx, float* params, const float* grads, float* m, float* v,
             int64_t n, const ops::AdamWArgs& a) override {
    TS_CPU_OP(adamw, params, grads, m, v, n, a);
  }
  double sum_squares(const ops::Context& ctx, const float* x, int64_t n) override {
    TS_CPU_OP(sum_squares, x, n);
  }
  void scale(const ops::Context& ctx, float* x, int64_t n, float s) override {
    TS_CPU_OP(scale, x, n, s);
  }
  void convert_f32_to_bf16(const ops::Context& ctx, uint16_t* dst, const float* src,
                           int64_t n) override {
    if (ctx.reference) {
      for (int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
      return;
    }
    cpu::convert_f32_to_bf16(ctx.threads(), dst, src, n);
  }
  void convert_bf16_to_f32(const ops::Context& ctx, float* dst, const uint16_t* src,
                           int64_t n) override {
    if (ctx.reference) {
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
      return;
    }
    cpu::convert_bf16_to_f32(ctx.threads(), dst, src, n);
  }
  void round_to_bf16(const ops::Context& ctx, float* x, uint16_t* keep, int64_t n) override {
    if (ctx.reference) {
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_bf16(x[i]);
        if (keep != nullptr) keep[i] = h;
        x[i] = bf16_to_f32(h);
      }
      return;
    }
    cpu::round_to_bf16(ctx.threads(), x, keep, n);
  }

  // The parts in sequence: on the CPU a row of the stream (a few KB) is still in cache when its
  // norm reads it, so a kernel of its own would save only the dispatch.
  void residual_norm(const ops::Context& ctx, const ops::ResidualNormArgs& a) override {
    add(ctx, a.x_out, a.a, a.r, a.N * a.C);
    if (a.kind == ops::NormKind::layer)
      layernorm_forward(ctx, a.out, a.mean, a.rstd, a.x_out, a.w, a.b, a.N, a.C);
    else
      rmsnorm_forward(ctx, a.out, a.rstd, a.x_out, a.w, a.N, a.C, a.eps);
  }
  void rmsnorm_forward(const ops::Context& ctx, float* out, float* rstd, const float* inp,
                       const float* w, int64_t N, int64_t C, float eps) override {
    TS_CPU_OP(rmsnorm_forward, out, rstd, inp, w, N, C, eps);
  }
  void head_rmsnorm(const ops::Context& ctx, float* x, int64_t ld, int64_t n, int64_t heads,
                    int64_t D, const float* w, float eps) override {
    TS_CPU_OP(head_rmsnorm, x, ld, n, heads, D, w, eps);
  }
  void head_rmsnorm_backward(const ops::Context&, const ops::HeadNormBackwardArgs& a) override {
    // A few hundred thousand values a layer: the reference loops (dw summed in one order).
    ref::head_rmsnorm_backward(a.dx, a.dw, a.dy, a.x, a.ld, a.ld_x, a.n, a.heads, a.D, a.w, a.eps);
  }
  void rmsnorm_backward(const ops::Context& ctx, const ops::NormBackwardArgs& a) override {
    TS_CPU_OP(rmsnorm_backward, a.dinp, a.dw, a.dout, a.inp, a.w, a.rstd, a.N, a.C);
  }
  void rope_forward(const ops::Context& ctx, float* out, const float* inp,
                    const ops::RopeTable& table, const int32_t* positions, int64_t pos0, int64_t B,
                    int64_t T, int64_t H, int64_t D, ops::RopeLayout layout) override {
    TS_CPU_OP(rope_forward, out, inp, table, positions, pos0, B, T, H, D, layout);
  }
  void rope_backward(const ops::Context& ctx, float* dinp, const float* dout,
                     const ops::RopeTable& table, const int32_t* positions, int64_t pos0, int64_t B,
                     int64_t T, int64_t H, int64_t D, ops::RopeLayout layout) override {
    TS_CPU_OP(rope_backward, dinp, dout, table, positions, pos0, B, T, H, D, layout);
  }
  // No quantized activation format here (quantized_rows_bytes is 0), so no op is given one.
  void glu_forward(const ops::Context& ctx, float* out, const float* gate, const float* up,
                   int64_t N, int64_t F, ops::GluAct act, const ops::QuantizedRows*) override {
    TS_CPU_OP(glu_forward, out, gate, up, N, F, act);
  }
  void glu_backward(const ops::Context& ctx, float* dgate, float* dup, const float* dout,
                    const float* gate, const float* up, int64_t N, int64_t F,
                    ops::GluAct act) override {
    TS_CPU_OP(glu_backward, dgate, dup, dout, gate, up, N, F, act);
  }

  void matmul_wt(const ops::Context& ctx, float* y, int64_t ldy, const float* x, int64_t M,
                 int64_t K, const void* w, DType w_type, int64_t N, const float* bias) override {
    TS_CPU_OP(matmul_wt, y, ldy, x, M, K, w, w_type, N, bias);
  }
  void matmul_w(const ops::Context& ctx, float* dx, int64_t ldx, const float* dy, int64_t M,
                int64_t N, const void* w, DType w_type, int64_t K, bool accumulate) override {
    TS_CPU_OP(matmul_w, dx, ldx, dy, M, N, w, w_type, K, accumulate);
  }
  void matmul_wt_group(const ops::Context& ctx, const float* x, int64_t M, int64_t K,
                       std::span<const ops::WtProduct> products,
                       const ops::QuantizedRows*) override {
    if (ctx.reference) {
      for (const ops::WtProduct& p : products)
        ref::matmul_wt(p.y, p.ldy, x, M, K, p.w, p.w_type, p.N, p.bias);
      return;
    }
    cpu::matmul_wt_group(ctx.threads(), x, M, K, products.data(),
                         static_cast<int64_t>(products.size()));
  }
  void paged_attention(const ops::Context& ctx, const ops::PagedAttentionArgs& a) override {
    if (ctx.reference) return ref::paged_attention(a);
    cpu::paged_attention(ctx.threads(), a);
  }
  void kv_append(const ops::Context&, const ops::KvAppendArgs& a) override { cpu::kv_append(a); }
  // The parts in sequence (the reference's or the SIMD rotation): on the CPU the op saves no pass
  // over memory worth a kernel of its own (a chunk's q and k are a few KB per row, in cache).
  void rope_kv_append(const ops::Context& ctx, const ops::RopeKvAppendArgs& a) override {
    const int64_t QD = a.H * a.D, KV = a.Hkv * a.D;
    thread_local std::vector<float> keys;  // grows once to the largest chunk, then is reused
    if (keys.size() < static_cast<size_t>(a.rows * KV))
      keys.resize(static_cast<size_t>(a.rows * KV));
    cpu::copy_rows(a.q_out, QD, a.q, a.ldq, a.rows, QD);
    cpu::copy_rows(keys.data(), KV, a.k, a.ldk, a.rows, KV);
    if (a.rope) {
      rope_forward(ctx, a.q_out, a.q_out, *a.rope, a.positions, 0, 1, a.rows, a.H, a.D, a.layout);
      rope_forward(ctx, keys.data(), keys.data(), *a.rope, a.positions, 0, 1, a.rows, a.Hkv, a.D,
                   a.layout);
    }
    ops::KvAppendArgs ap = a;
    ap.k = keys.data();
    ap.ldk = KV;
    cpu::kv_append(ap);
  }
  void copy_rows(const ops::Context&, float* dst, int64_t ld_dst, const float* src, int64_t ld_src,
                 int64_t rows, int64_t cols) override {
    cpu::copy_rows(dst, ld_dst, src, ld_src, rows, cols);
  }
  void gather_rows(const ops::Context&, float* dst, const float* src, const int32_t* index,
                   int64_t n, int64_t C) override {
    cpu::gather_rows(dst, src, index, n, C);
  }
  void scatter_add_rows(const ops::Context&, float* dst, const float* src, const int32_t* index,
                        const float* weight, int64_t n, int64_t C) override {
    cpu::scatter_add_rows(dst, src, index, weight, n, C);
  }
  void scatter_add_rows_backward(const ops::Context&, float* dsrc, float* dweight, const float* dy,
                                 const float* src, const int32_t* index, const float* weight,
                                 int64_t n, int64_t C) override {
    cpu::scatter_add_rows_backward(dsrc, dweight, dy, src, index, weight, n, C);
  }
  void moe_route(const ops::Context& ctx, int32_t* ids, float* weights, const float* logits,
                 int64_t n, int64_t E, int64_t k, bool normalize) override {
    TS_CPU_OP(moe_route, ids, weights, logits, n, E, k, normalize);
  }
  void moe_route_backward(const ops::Context& ctx, float* dlogits, const float* dweights,
                          const int32_t* ids, const float* logits, int64_t n, int64_t E, int64_t k,
                          bool normalize) override {
    TS_CPU_OP(moe_route_backward, dlogits, dweights, ids, logits, n, E, k, normalize);
  }

  // Host memory is the CPU's memory: copies in any direction are memcpy, and ops are done when
  // they return.
  void* allocate(size_t bytes) override { return alloc_large(bytes, 64, "ops::Buffer"); }
  void release(void* p) noexcept override { free_large(p); }
  void copy(const ops::Context&, void* dst, const void* src, size_t bytes, ops::CopyKind) override {
    std::memcpy(dst, src, bytes);
  }
  void synchronize(const ops::Context&) override {}
  // Large buffers in 1 MiB pieces over the threads: one thread's stores reach about a quarter of
  // the memory's write bandwidth here (the gradients of SmolLM2, 538 MB zeroed every training
  // step, took 96 ms on one thread of two).
  void zero(const ops::Context& ctx, void* p, size_t bytes) override {
    constexpr size_t kPiece = size_t{1} << 20;
    if (bytes < 4 * kPiece) {
      std::memset(p, 0, bytes);
      return;
    }
    auto* b = static_cast<uint8_t*>(p);
    const auto pieces = static_cast<int64_t>((bytes + kPiece - 1) / kPiece);
    ctx.threads().parallel_for(pieces, 1, [&](int64_t s, int64_t e) {
      const size_t lo = static_cast<size_t>(s) * kPiece;
      std::memset(b + lo, 0, std::min(bytes, static_cast<size_t>(e) * kPiece) - lo);
    });
  }
  void bias_grad(const ops::Context& ctx, float* db, const float* dy, int64_t m,
                 int64_t n) override {
    cpu::bias_grad(ctx.threads(), db, dy, m, n);
  }

  // 512 rows where the packed GEMM takes large products (it widens each weight panel once per
  // call and shares it over the rows), 128 where the integer kernels run at every M.
  int64_t matmul_wt_saturating_rows(DType w_type) const override {
    constexpr int64_t kPackedRows = 512, kKernelRows = 128;
    return matmul_wt_takes_packed_gemm(w_type, kPackedRows) ? kPackedRows : kKernelRows;
  }
  DType preferred_layout(DType t, int64_t n_rows) const override {
    if (!has_interleaved_layout(t) || n_rows % traits(interleaved_type(t)).interleave_rows != 0)
      return t;
    // The k-quant layouts have AVX512-VNNI kernels only (elsewhere their groups would be read
    // back into plain rows first: slower than the plain types' own AVX2 tiles).
    if (t == DType::q4_k || t == DType::q5_k || t == DType::q6_k)
      return quant_avx512_vnni_active() ? interleaved_type(t) : t;
    return quant_avx2_supported() ? interleaved_type(t) : t;
  }
  // The tiled kernel's scores for a block are vertical multiply-adds over transposed keys.
  bool paged_keys_transposed() const override { return true; }
};

#undef TS_CPU_OP

}  // namespace

void register_backend() {
  static CpuBackend instance;
  ops::register_backend(ops::Device::cpu, &instance);
}

}  // namespace tessera::cpu
