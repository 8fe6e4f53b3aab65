// The interface a device's kernels implement for ops/, and the registry a program fills with the
// backends it links (apps/cli's main, the test main): ops/ entry points check their arguments,
// then call the backend registered for ctx.device. ops/ never names a backend.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "ops/context.h"
#include "ops/graph.h"
#include "ops/memory.h"
#include "ops/ops.h"
#include "ops/paged_attention.h"
#include "ops/quant.h"

namespace tessera::ops {

// Each method has the contract of the ops/ entry point of the same name (ops.h, quant.h,
// paged_attention.h), with its arguments already checked; pointers are in the device's memory.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  // Throws one line naming `user` when the device cannot run ops here (CUDA: no GPU present),
  // so that a model says so before it allocates.
  virtual void require_device(std::string_view /*user*/) const {}

  virtual void gemm(const Context& ctx, const GemmArgs& g) = 0;
  virtual void embedding_forward(const Context& ctx, float* out, const int32_t* tokens,
                                 const float* wte, const float* wpe, int64_t B, int64_t T,
                                 int64_t C, int64_t V) = 0;
  virtual void embedding_backward(const Context& ctx, float* dwte, float* dwpe, const float* dout,
                                  const int32_t* tokens, int64_t B, int64_t T, int64_t C,
                                  int64_t V) = 0;
  virtual void layernorm_forward(const Context& ctx, float* out, float* mean, float* rstd,
                                 const float* inp, const float* w, const float* b, int64_t N,
                                 int64_t C) = 0;
  virtual void layernorm_backward(const Context& ctx, const NormBackwardArgs& a) = 0;
  virtual void gelu_forward(const Context& ctx, float* out, const float* inp, int64_t n) = 0;
  virtual void gelu_backward(const Context& ctx, float* dinp, const float* inp, const float* dout,
                             int64_t n) = 0;
  virtual void add(const Context& ctx, float* out, const float* a, const float* b, int64_t n) = 0;
  virtual void attention_forward(const Context& ctx, float* out, float* lse, const float* qkv,
                                 const AttentionArgs& a) = 0;
  virtual void attention_backward(const Context& ctx, float* dqkv, const float* dout,
                                  const float* qkv, const float* out, const float* lse,
                                  const AttentionArgs& a) = 0;
  virtual void softmax_xent(const Context& ctx, float* losses, float* logits,
                            const int32_t* targets, int64_t N, int64_t V, int64_t Vp,
                            float dlogits_scale) = 0;
  virtual void adamw(const Context& ctx, float* params, const float* grads, float* m, float* v,
                     int64_t n, const AdamWArgs& a) = 0;
  virtual double sum_squares(const Context& ctx, const float* x, int64_t n) = 0;
  virtual void scale(const Context& ctx, float* x, int64_t n, float s) = 0;
  virtual void convert_f32_to_bf16(const Context& ctx, uint16_t* dst, const float* src,
                                   int64_t n) = 0;
  virtual void convert_bf16_to_f32(const Context& ctx, float* dst, const uint16_t* src,
                                   int64_t n) = 0;
  virtual void round_to_bf16(const Context& ctx, float* x, uint16_t* keep, int64_t n) = 0;

  virtual void residual_norm(const Context& ctx, const ResidualNormArgs& a) = 0;
  virtual void rmsnorm_forward(const Context& ctx, float* out, float* rstd, const float* inp,
                               const float* w, int64_t N, int64_t C, float eps) = 0;
  virtual void rmsnorm_backward(const Context& ctx, const NormBackwardArgs& a) = 0;
  virtual void head_rmsnorm(const Context& ctx, float* x, int64_t ld, int64_t n, int64_t heads,
                            int64_t D, const float* w, float eps) = 0;
  virtual void head_rmsnorm_backward(const Context& ctx, const HeadNormBackwardArgs& a) = 0;
  virtual void rope_forward(const Context& ctx, float* out, const float* inp,
                            const RopeTable& table, const int32_t* positions, int64_t pos0,
                            int64_t B, int64_t T, int64_t H, int64_t D, RopeLayout layout) = 0;
  virtual void rope_backward(const Context& ctx, float* dinp, const float* dout,
                             const RopeTable& table, const int32_t* positions, int64_t pos0,
                             int64_t B, int64_t T, int64_t H, int64_t D, RopeLayout layout) = 0;
  virtual void glu_forward(const Context& ctx, float* out, const float* gate, const float* up,
                           int64_t N, int64_t F, GluAct act, const QuantizedRows* q_out) = 0;
  virtual void glu_backward(const Context& ctx, float* dgate, float* dup, const float* dout,
                            const float* gate, const float* up, int64_t N, int64_t F,
                            GluAct act) = 0;

  virtual void matmul_wt(const Context& ctx, float* y, int64_t ldy, const float* x, int64_t M,
                         int64_t K, const void* w, DType w_type, int64_t N, const float* bias) = 0;
  virtual void matmul_w(const Context& ctx, float* dx, int64_t ldx, const float* dy, int64_t M,
                        int64_t N, const void* w, DType w_type, int64_t K, bool accumulate) = 0;
  virtual void matmul_wt_group(const Context& ctx, const float* x, int64_t M, int64_t K,
                               std::span<const WtProduct> products, const QuantizedRows* xq) = 0;
  virtual void paged_attention(const Context& ctx, const PagedAttentionArgs& a) = 0;
  // A backend that plans nothing keeps these defaults.
  virtual int64_t paged_attention_plan_bytes(int64_t /*rows*/) const { return 0; }
  virtual int64_t plan_paged_attention(const PagedAttentionArgs& /*a*/, void* /*plan*/) const {
    return 0;
  }
  // A backend without a quantized activation format keeps this default (and is never given a
  // QuantizedRows).
  virtual int64_t quantized_rows_bytes(int64_t /*rows*/, int64_t /*cols*/,
                                       DType /*for_type*/) const {
    return 0;
  }
  virtual void kv_append(const Context& ctx, const KvAppendArgs& a) = 0;
  virtual void rope_kv_append(const Context& ctx, const RopeKvAppendArgs& a) = 0;
  virtual void copy_rows(const Context& ctx, float* dst, int64_t ld_dst, const float* src,
                         int64_t ld_src, int64_t rows, int64_t cols) = 0;
  virtual void gather_rows(const Context& ctx, float* dst, const float* src, const int32_t* index,
                           int64_t n, int64_t C) = 0;
  virtual void scatter_add_rows(const Context& ctx, float* dst, const float* src,
                                const int32_t* index, const float* weight, int64_t n,
                                int64_t C) = 0;
  virtual void scatter_add_rows_backward(const Context& ctx, float* dsrc, float* dweight,
                                         const float* dy, const float* src, const int32_t* index,
                                         const float* weight, int64_t n, int64_t C) = 0;
  virtual void moe_route(const Context& ctx, int32_t* ids, float* weights, const float* logits,
                         int64_t n, int64_t E, int64_t k, bool normalize) = 0;
  virtual void moe_route_backward(const Context& ctx, float* dlogits, const float* dweights,
                                  const int32_t* ids, const float* logits, int64_t n, int64_t E,
                                  int64_t k, bool normalize) = 0;

  // Memory (ops/memory.h): allocate throws naming the size when it cannot; release takes what
  // allocate returned.
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* p) noexcept = 0;
  virtual void copy(const Context& ctx, void* dst, const void* src, size_t bytes,
                    CopyKind kind) = 0;
  virtual void synchronize(const Context& ctx) = 0;
  virtual void zero(const Context& ctx, void* p, size_t bytes) = 0;
  virtual void bias_grad(const Context& ctx, float* db, const float* dy, int64_t m, int64_t n) = 0;

  // Graphs (ops/graph.h). A backend that records none keeps these defaults.
  virtual bool records_graphs() const { return false; }
  virtual void begin_graph(const Context&) {}
  // Ends the recording begun on ctx and returns its handle (null when nothing was recorded).
  virtual void* end_graph(const Context&) { return nullptr; }
  virtual void replay_graph(const Context&, void*) {}
  virtual void destroy_graph(void*) noexcept {}

  // Layout questions a loader or planner asks before any op runs (see ops/quant.h).
  virtual int64_t matmul_wt_saturating_rows(DType w_type) const = 0;
  virtual DType preferred_layout(DType t, int64_t n_rows) const = 0;
  virtual bool paged_keys_transposed() const = 0;
};

// Makes b the backend of device d (b must outlive every op call on d); a program registers its
// backends before its first op. Registering null removes d's backend.
void register_backend(Device d, Backend* b);
// The backend of device d; throws naming the device when the program registered none.
Backend& backend(Device d);
// Throws one line naming `user` unless ctx.device has a backend that can run ops here now (the
// CPU always can).
void require_device(const Context& ctx, std::string_view user);
std::string_view device_name(Device d);

}  // namespace tessera::ops
