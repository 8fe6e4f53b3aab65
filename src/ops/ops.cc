// Op entry points: argument checks, then the backend registered for ctx.device (ops/backend.h).
#include "ops/ops.h"

#include <cmath>

#include "core/error.h"
#include "ops/backend.h"
#include "ops/gemm_check.h"
#include "ops/observed.h"

namespace tessera::ops {

// Calls `name(ctx, args...)` on ctx.device's backend, reported to ctx.observer with `shape`
// (an OpShape, in parentheses: its braces hold commas) and `cost`.
#define TS_DISPATCH(name, shape, cost, ...)                    \
  return detail::observed(                                     \
      ctx, #name, [&] { return shape; }, [&] { return cost; }, \
      [&]() -> decltype(auto) { return backend(ctx.device).name(ctx, __VA_ARGS__); })

namespace {

// An op over n elements that does `flops` operations on each and moves `f32_passes` f32 arrays
// of n elements (reads plus writes; per-row vectors such as norm statistics are ignored).
OpCost elementwise_cost(int64_t n, double flops, double f32_passes) {
  return OpCost{flops * static_cast<double>(n), 4.0 * f32_passes * static_cast<double>(n)};
}

// All of c's bytes are long-lived state (OpCost::state_bytes).
OpCost state_cost(OpCost c) {
  c.state_bytes = c.bytes;
  return c;
}

}  // namespace

void gemm(const Context& ctx, const GemmArgs& g) {
  if (!validate_gemm_args(g)) return;
  TS_DISPATCH(gemm, (OpShape{"m n k", {g.m, g.n, g.k}, dtype_name(g.b_type)}), gemm_cost(g), g);
}

void embedding_forward(const Context& ctx, float* out, const int32_t* tokens, const float* wte,
                       const float* wpe, int64_t B, int64_t T, int64_t C, int64_t V) {
  TS_CHECK(V > 0, "[embedding_forward] vocabulary size V=", V, " must be positive");
  TS_DISPATCH(embedding_forward, (OpShape{"rows c", {B * T, C}}), elementwise_cost(B * T * C, 1, 3),
              out, tokens, wte, wpe, B, T, C, V);
}

void embedding_backward(const Context& ctx, float* dwte, float* dwpe, const float* dout,
                        const int32_t* tokens, int64_t B, int64_t T, int64_t C, int64_t V) {
  TS_CHECK(V > 0, "[embedding_backward] vocabulary size V=", V, " must be positive");
  TS_DISPATCH(embedding_backward, (OpShape{"rows c", {B * T, C}}),
              elementwise_cost(B * T * C, 2, 5), dwte, dwpe, dout, tokens, B, T, C, V);
}

void layernorm_forward(const Context& ctx, float* out, float* mean, float* rstd, const float* inp,
                       const float* w, const float* b, int64_t N, int64_t C) {
  TS_DISPATCH(layernorm_forward, (OpShape{"n c", {N, C}}), elementwise_cost(N * C, 7, 2), out, mean,
              rstd, inp, w, b, N, C);
}

void layernorm_backward(const Context& ctx, const NormBackwardArgs& a) {
  TS_DISPATCH(layernorm_backward, (OpShape{"n c", {a.N, a.C}}), elementwise_cost(a.N * a.C, 12, 4),
              a);
}

void gelu_forward(const Context& ctx, float* out, const float* inp, int64_t n) {
  TS_DISPATCH(gelu_forward, (OpShape{"n", {n}}), elementwise_cost(n, 8, 2), out, inp, n);
}

void gelu_backward(const Context& ctx, float* dinp, const float* inp, const float* dout,
                   int64_t n) {
  TS_DISPATCH(gelu_backward, (OpShape{"n", {n}}), elementwise_cost(n, 15, 3), dinp, inp, dout, n);
}

void add(const Context& ctx, float* out, const float* a, const float* b, int64_t n) {
  TS_DISPATCH(add, (OpShape{"n", {n}}), elementwise_cost(n, 1, 3), out, a, b, n);
}

void check_attention_args(const char* op, const AttentionArgs& a) {
  TS_CHECK(a.B >= 0 && a.T >= 0, "[", op, "] negative size B=", a.B, " T=", a.T);
  TS_CHECK(a.H > 0 && a.C > 0 && a.C % a.H == 0, "[", op, "] width C=", a.C,
           " must be a positive multiple of heads H=", a.H);
  TS_CHECK(a.Hkv > 0 && a.H % a.Hkv == 0, "[", op, "] key/value heads Hkv=", a.Hkv,
           " must divide the query heads H=", a.H);
  TS_CHECK(a.window >= 0, "[", op, "] window=", a.window, " must be >= 0 (0: none)");
}

void attention_forward(const Context& ctx, float* out, float* lse, const float* qkv,
                       const AttentionArgs& a) {
  check_attention_args("attention_forward", a);
  TS_DISPATCH(attention_forward, (OpShape{"b t c h hkv", {a.B, a.T, a.C, a.H, a.Hkv}}),
              attention_forward_cost(a), out, lse, qkv, a);
}

void attention_backward(const Context& ctx, float* dqkv, const float* dout, const float* qkv,
                        const float* out, const float* lse, const AttentionArgs& a) {
  check_attention_args("attention_backward", a);
  TS_DISPATCH(attention_backward, (OpShape{"b t c h hkv", {a.B, a.T, a.C, a.H, a.Hkv}}),
              attention_backward_cost(a), dqkv, dout, qkv, out, lse, a);
}

void softmax_xent(const Context& ctx, float* losses, float* logits, const int32_t* targets,
                  int64_t N, int64_t V, int64_t Vp, float dlogits_scale) {
  TS_CHECK(V > 0 && Vp >= V, "[softmax_xent] vocab V=", V,
           " must be positive and <= padded Vp=", Vp);
  TS_DISPATCH(softmax_xent, (OpShape{"n v", {N, Vp}}),
              elementwise_cost(N * Vp, 4, dlogits_scale != 0.0f ? 2 : 1), losses, logits, targets,
              N, V, Vp, dlogits_scale);
}

void adamw(const Context& ctx, float* params, const float* grads, float* m, float* v, int64_t n,
           const AdamWArgs& a) {
  TS_CHECK(a.t >= 1, "[adamw] step must count from 1, got ", a.t);
  // Parameters and both moments are state (the gradients too: written by the backward long
  // before).
  TS_DISPATCH(adamw, (OpShape{"n", {n}}), state_cost(elementwise_cost(n, 12, 7)), params, grads, m,
              v, n, a);
}

AdamWBias adamw_bias(const AdamWArgs& a) {
  const double t = static_cast<double>(a.t);
  const double bc1 = 1.0 - std::pow(static_cast<double>(a.beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(a.beta2), t);
  return {static_cast<float>(1.0 / bc1), static_cast<float>(1.0 / std::sqrt(bc2))};
}

double sum_squares(const Context& ctx, const float* x, int64_t n) {
  TS_DISPATCH(sum_squares, (OpShape{"n", {n}}), elementwise_cost(n, 2, 1), x, n);
}

void scale(const Context& ctx, float* x, int64_t n, float s) {
  TS_DISPATCH(scale, (OpShape{"n", {n}}), elementwise_cost(n, 1, 2), x, n, s);
}

void convert_f32_to_bf16(const Context& ctx, uint16_t* dst, const float* src, int64_t n) {
  // 4 bytes read and 2 written per element.
  TS_DISPATCH(convert_f32_to_bf16, (OpShape{"n", {n}, "bf16"}),
              (OpCost{static_cast<double>(n), 6.0 * static_cast<double>(n)}), dst, src, n);
}

void convert_bf16_to_f32(const Context& ctx, float* dst, const uint16_t* src, int64_t n) {
  TS_CHECK(n >= 0, "[ops] convert_bf16_to_f32: n=", n, " must be >= 0");
  // 2 bytes read and 4 written per element.
  TS_DISPATCH(convert_bf16_to_f32, (OpShape{"n", {n}, "bf16"}),
              (OpCost{0.0, 6.0 * static_cast<double>(n)}), dst, src, n);
}

void round_to_bf16(const Context& ctx, float* x, uint16_t* keep, int64_t n) {
  TS_CHECK(n >= 0, "[ops] round_to_bf16: n=", n, " must be >= 0");
  // 4 bytes read and 4 written per element, and 2 more where the bits are kept.
  TS_DISPATCH(round_to_bf16, (OpShape{"n", {n}, "bf16"}),
              (OpCost{static_cast<double>(n), (keep ? 10.0 : 8.0) * static_cast<double>(n)}), x,
              keep, n);
}

void bias_grad(const Context& ctx, float* db, const float* dy, int64_t m, int64_t n) {
  TS_CHECK(m >= 0 && n >= 0, "[ops] bias_grad: bad shape (", m, " x ", n, ")");
  if (m == 0 || n == 0) return;
  TS_DISPATCH(bias_grad, (OpShape{"m n", {m, n}}), elementwise_cost(m * n, 1, 1), db, dy, m, n);
}

void copy_rows(const Context& ctx, float* dst, int64_t ld_dst, const float* src, int64_t ld_src,
               int64_t rows, int64_t cols) {
  TS_CHECK(rows >= 0 && cols >= 0 && ld_dst >= cols && ld_src >= cols,
           "[ops] copy_rows: bad shape (", rows, " x ", cols, ", ld_dst ", ld_dst, ", ld_src ",
           ld_src, ")");
  if (rows == 0 || cols == 0) return;
  TS_DISPATCH(copy_rows, (OpShape{"rows cols", {rows, cols}}), elementwise_cost(rows * cols, 0, 2),
              dst, ld_dst, src, ld_src, rows, cols);
}

void gather_rows(const Context& ctx, float* dst, const float* src, const int32_t* index, int64_t n,
                 int64_t C, int64_t src_rows) {
  TS_CHECK(n >= 0 && C > 0, "[ops] gather_rows: bad shape (", n, " x ", C, ")");
  if (n == 0) return;
  if (ctx.device == Device::cpu && !ctx.dry_run)  // a dry run's arrays hold nothing
    for (int64_t r = 0; r < n; ++r)
      TS_CHECK(index[r] >= 0 && index[r] < src_rows, "[ops] gather_rows: index[", r,
               "] = ", index[r], " outside [0, ", src_rows, ")");
  TS_DISPATCH(gather_rows, (OpShape{"n c", {n, C}}), elementwise_cost(n * C, 0, 2), dst, src, index,
              n, C);
}

void scatter_add_rows(const Context& ctx, float* dst, const float* src, const int32_t* index,
                      const float* weight, int64_t n, int64_t C, int64_t dst_rows) {
  TS_CHECK(n >= 0 && C > 0, "[ops] scatter_add_rows: bad shape (", n, " x ", C, ")");
  if (n == 0) return;
  TS_CHECK(dst && src && index && weight, "[ops] scatter_add_rows: null pointer");
  if (ctx.device == Device::cpu && !ctx.dry_run)
    for (int64_t r = 0; r < n; ++r)
      TS_CHECK(index[r] >= 0 && index[r] < dst_rows, "[ops] scatter_add_rows: index[", r,
               "] = ", index[r], " outside [0, ", dst_rows, ")");
  TS_DISPATCH(scatter_add_rows, (OpShape{"n c", {n, C}}), elementwise_cost(n * C, 2, 3), dst, src,
              index, weight, n, C);
}

void moe_route(const Context& ctx, int32_t* ids, float* weights, const float* logits, int64_t n,
               int64_t E, int64_t k, bool normalize) {
  TS_CHECK(n >= 0 && E > 0 && k >= 1 && k <= E, "[ops] moe_route: bad sizes n=", n, " E=", E,
           " k=", k, " (need 1 <= k <= E)");
  if (n == 0) return;
  TS_CHECK(ids && weights && logits, "[ops] moe_route: null pointer");
  TS_DISPATCH(moe_route, (OpShape{"n e k", {n, E, k}}), elementwise_cost(n * E, 4, 1), ids, weights,
              logits, n, E, k, normalize);
}

void scatter_add_rows_backward(const Context& ctx, float* dsrc, float* dweight, const float* dy,
                               const float* src, const int32_t* index, const float* weight,
                               int64_t n, int64_t C, int64_t dy_rows) {
  TS_CHECK(n >= 0 && C > 0, "[ops] scatter_add_rows_backward: bad shape (", n, " x ", C, ")");
  if (n == 0) return;
  TS_CHECK(dsrc && dweight && dy && src && index && weight,
           "[ops] scatter_add_rows_backward: null pointer");
  if (ctx.device == Device::cpu && !ctx.dry_run)
    for (int64_t r = 0; r < n; ++r)
      TS_CHECK(index[r] >= 0 && index[r] < dy_rows, "[ops] scatter_add_rows_backward: index[", r,
               "] = ", index[r], " outside [0, ", dy_rows, ")");
  TS_DISPATCH(scatter_add_rows_backward, (OpShape{"n c", {n, C}}), elementwise_cost(n * C, 3, 3),
              dsrc, dweight, dy, src, index, weight, n, C);
}

void moe_route_backward(const Context& ctx, float* dlogits, const float* dweights,
                        const int32_t* ids, const float* logits, int64_t n, int64_t E, int64_t k,
                        bool normalize) {
  TS_CHECK(n >= 0 && E > 0 && k >= 1 && k <= E, "[ops] moe_route_backward: bad sizes n=", n,
           " E=", E, " k=", k, " (need 1 <= k <= E)");
  if (n == 0) return;
  TS_CHECK(dlogits && dweights && ids && logits, "[ops] moe_route_backward: null pointer");
  if (ctx.device == Device::cpu && !ctx.dry_run)
    for (int64_t i = 0; i < n * k; ++i)
      TS_CHECK(ids[i] >= 0 && ids[i] < E, "[ops] moe_route_backward: ids[", i, "] = ", ids[i],
               " outside [0, ", E, ")");
  TS_DISPATCH(moe_route_backward, (OpShape{"n e k", {n, E, k}}), elementwise_cost(n * E, 6, 2),
              dlogits, dweights, ids, logits, n, E, k, normalize);
}

OpCost gemm_cost(const GemmArgs& g) {
  const double ea = traits(g.a_type).block_bytes, eb = traits(g.b_type).block_bytes;
  OpCost c;
  c.flops = 2.0 * g.m * g.n * g.k;
  c.bytes = ea * g.m * g.k + eb * g.k * g.n + 4.0 * g.m * g.n * (g.accumulate ? 2 : 1);
  return c;
}

double attention_pairs(int64_t T, int64_t window) {
  const double t = static_cast<double>(T);
  if (window <= 0 || window >= T) return t * (t + 1) / 2;
  // Rows 0 .. W-1 see 1 .. W keys, the other T - W rows W each.
  const double w = static_cast<double>(window);
  return w * (w + 1) / 2 + (t - w) * w;
}

OpCost attention_forward_cost(const AttentionArgs& a) {
  // QK^T and PV are 2*D flops per scored (query, key) pair each, for every query head: 4 C per
  // pair of a sequence. A window scores fewer pairs; the bytes stay those of reading q, k, v (k
  // and v of Hkv heads) and writing out once.
  OpCost c;
  c.flops = 2.0 * 2.0 * a.B * attention_pairs(a.T, a.window) * a.C;
  c.bytes = 4.0 * a.B * a.T * (2 * a.C + 2 * a.Hkv * (a.C / a.H));
  return c;
}

OpCost attention_backward_cost(const AttentionArgs& a) {
  // Recompute QK^T, then dV, dP, dQ, dK: five score-sized matmuls against two forward ones.
  OpCost c = attention_forward_cost(a);
  c.flops *= 2.5;
  c.bytes *= 2.0;
  return c;
}

// ---- Llama family ----

void rmsnorm_forward(const Context& ctx, float* out, float* rstd, const float* inp, const float* w,
                     int64_t N, int64_t C, float eps) {
  TS_DISPATCH(rmsnorm_forward, (OpShape{"n c", {N, C}}), rmsnorm_forward_cost(N, C), out, rstd, inp,
              w, N, C, eps);
}

void residual_norm(const Context& ctx, const ResidualNormArgs& a) {
  const bool layer = a.kind == NormKind::layer;
  TS_CHECK(a.N >= 0 && a.C > 0, "[residual_norm] bad sizes N=", a.N, " C=", a.C);
  TS_CHECK(a.N == 0 || (a.x_out && a.out && a.rstd && a.a && a.r && a.w && (!layer || a.mean)),
           "[residual_norm] x_out, out, rstd, a, r, w (and mean for a layer norm) must be set");
  TS_CHECK(a.out != a.x_out && a.out != a.a && a.out != a.r && a.x_out != a.r,
           "[residual_norm] out must not alias x_out, a or r, nor x_out r");
  TS_CHECK(layer || a.eps >= 0.0f, "[residual_norm] eps=", a.eps, " must be >= 0");
  check_quantized_rows(ctx, a.q_out, a.N, a.C, "residual_norm");
  // The add's three passes and the norm's two, less the norm's read of x_out: it is written once.
  OpCost cost = layer ? elementwise_cost(a.N * a.C, 7, 2) : rmsnorm_forward_cost(a.N, a.C);
  cost.flops += static_cast<double>(a.N * a.C);
  cost.bytes += 8.0 * static_cast<double>(a.N * a.C);
  TS_DISPATCH(residual_norm, (OpShape{"n c", {a.N, a.C}}), cost, a);
}

void head_rmsnorm(const Context& ctx, float* x, int64_t ld, int64_t n, int64_t heads, int64_t D,
                  const float* w, float eps) {
  TS_CHECK(n >= 0 && heads > 0 && D > 0, "[head_rmsnorm] bad sizes n=", n, " heads=", heads,
           " D=", D);
  TS_CHECK(ld >= heads * D, "[head_rmsnorm] row stride ld=", ld,
           " is less than heads x D = ", heads * D);
  TS_CHECK(eps >= 0.0f, "[head_rmsnorm] eps=", eps, " must be >= 0");
  TS_CHECK(n == 0 || (x && w), "[head_rmsnorm] null x or w");
  TS_DISPATCH(head_rmsnorm, (OpShape{"n heads d", {n, heads, D}}),
              elementwise_cost(n * heads * D, 4, 2), x, ld, n, heads, D, w, eps);
}

void head_rmsnorm_backward(const Context& ctx, const HeadNormBackwardArgs& a) {
  TS_CHECK(a.n >= 0 && a.heads > 0 && a.D > 0, "[head_rmsnorm_backward] bad sizes n=", a.n,
           " heads=", a.heads, " D=", a.D);
  TS_CHECK(a.ld >= a.heads * a.D && a.ld_x >= a.heads * a.D,
           "[head_rmsnorm_backward] row strides ld=", a.ld, " ld_x=", a.ld_x,
           " are less than heads x D = ", a.heads * a.D);
  TS_CHECK(a.n == 0 || (a.dx && a.dw && a.dy && a.x && a.w),
           "[head_rmsnorm_backward] null pointer");
  TS_DISPATCH(head_rmsnorm_backward, (OpShape{"n heads d", {a.n, a.heads, a.D}}),
              elementwise_cost(a.n * a.heads * a.D, 8, 4), a);
}

void rmsnorm_backward(const Context& ctx, const NormBackwardArgs& a) {
  TS_DISPATCH(rmsnorm_backward, (OpShape{"n c", {a.N, a.C}}), elementwise_cost(a.N * a.C, 8, 4), a);
}

void rope_forward(const Context& ctx, float* out, const float* inp, const RopeTable& table,
                  const int32_t* positions, int64_t pos0, int64_t B, int64_t T, int64_t H,
                  int64_t D, RopeLayout layout) {
  TS_DISPATCH(rope_forward, (OpShape{"rows h d", {B * T, H, D}}),
              rope_cost(B, T, H, D, table.rotary_dim), out, inp, table, positions, pos0, B, T, H, D,
              layout);
}

void rope_backward(const Context& ctx, float* dinp, const float* dout, const RopeTable& table,
                   const int32_t* positions, int64_t pos0, int64_t B, int64_t T, int64_t H,
                   int64_t D, RopeLayout layout) {
  TS_DISPATCH(rope_backward, (OpShape{"rows h d", {B * T, H, D}}),
              rope_cost(B, T, H, D, table.rotary_dim), dinp, dout, table, positions, pos0, B, T, H,
              D, layout);
}

const char* glu_act_name(GluAct a) {
  return a == GluAct::silu ? "silu" : "gelu_tanh";
}

void glu_forward(const Context& ctx, float* out, const float* gate, const float* up, int64_t N,
                 int64_t F, GluAct act, const QuantizedRows* q_out) {
  check_quantized_rows(ctx, q_out, N, F, "glu_forward");
  TS_DISPATCH(glu_forward, (OpShape{"n f", {N, F}}), glu_forward_cost(N, F), out, gate, up, N, F,
              act, q_out);
}

void glu_backward(const Context& ctx, float* dgate, float* dup, const float* dout,
                  const float* gate, const float* up, int64_t N, int64_t F, GluAct act) {
  TS_DISPATCH(glu_backward, (OpShape{"n f", {N, F}}), elementwise_cost(N * F, 10, 5), dgate, dup,
              dout, gate, up, N, F, act);
}

// Per element: square-accumulate, two multiplies; reads inp and w, writes out (rstd negligible).
OpCost rmsnorm_forward_cost(int64_t N, int64_t C) {
  OpCost c;
  c.flops = 4.0 * N * C;
  c.bytes = 4.0 * (2.0 * N * C + C + N);
  return c;
}

// Per rotated pair: 4 multiplies and 2 adds; reads and writes every element once, plus one
// cos/sin table row (R/2 + R/2 floats) per token.
OpCost rope_cost(int64_t B, int64_t T, int64_t H, int64_t D, int64_t rotary_dim) {
  OpCost c;
  c.flops = 3.0 * B * T * H * rotary_dim;
  c.bytes = 4.0 * (2.0 * B * T * H * D + B * T * rotary_dim);
  return c;
}

// Per element: exp (counted as 1), add, divide, two multiplies (SiLU; the tanh GELU's few more
// are not counted apart); reads gate and up, writes out.
OpCost glu_forward_cost(int64_t N, int64_t F) {
  OpCost c;
  c.flops = 5.0 * N * F;
  c.bytes = 4.0 * 3.0 * N * F;
  return c;
}

}  // namespace tessera::ops
