// The decoder forward pass over a chunk of token rows and a paged KV cache, against ops/.
#include "model/decoder_forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "ops/paged_attention.h"
#include "ops/quant.h"
#include "profile/timer.h"

namespace tessera::model {

namespace {

// Writes one key (D values) as column `dst`'s first element onward, one every `stride` elements.
void write_key_column(DType type, const float* key, uint8_t* dst, int64_t D, int64_t stride) {
  if (type == DType::f16) {
    auto* h = reinterpret_cast<uint16_t*>(dst);
    for (int64_t d = 0; d < D; ++d) h[d * stride] = f32_to_f16(key[d]);
  } else {
    auto* f = reinterpret_cast<float*>(dst);
    for (int64_t d = 0; d < D; ++d) f[d * stride] = key[d];
  }
}

void count(StageStats* stages, Stage stage, double seconds, int64_t weight_bytes) {
  StageStats& s = stages[static_cast<int>(stage)];
  s.seconds += seconds;
  s.weight_bytes += weight_bytes;
}

}  // namespace

const char* stage_name(Stage s) {
  static constexpr const char* kNames[kNumStages] = {"qkv",      "attn_out", "mlp_in",
                                                     "mlp_down", "head",     "attention"};
  return kNames[static_cast<int>(s)];
}

DecoderForward::DecoderForward(const DecoderModel& model, const ops::Context& ctx, int64_t max_rows,
                               int64_t max_ctx)
    : model_(model), ctx_(ctx), max_rows_(max_rows) {
  const DecoderConfig& c = model_.config;
  TS_CHECK(max_rows > 0, "[model] max_rows must be positive, got ", max_rows);
  if (c.arch == DecoderArch::gpt2)
    TS_CHECK(std::fabs(c.norm_eps - 1e-5f) < 1e-9f, "[model] gpt2 layer norm epsilon ", c.norm_eps,
             " is not supported (1e-5)");
  else
    rope_ = ops::make_rope_table(max_ctx, rope_inv_freqs(c));
  const auto rows = static_cast<size_t>(max_rows), C = static_cast<size_t>(c.d_model);
  x_.resize(rows * C);
  tmp_.resize(rows * C);
}

void DecoderForward::embed(const DecoderRows& rows) {
  TS_CHECK(rows.n >= 0 && rows.n <= max_rows_, "[model] chunk of ", rows.n, " rows, more than the ",
           max_rows_, " the forward pass was sized for");
  const DecoderWeights& w = model_.weights;
  const int64_t C = model_.config.d_model;
  for (int64_t r = 0; r < rows.n; ++r) {
    float* xr = x_.data() + r * C;
    ops::dequantize_row(w.tok_embd.data, w.tok_embd.type, C, rows.tokens[r], xr);
    if (w.pos_embd.present()) {
      float* pr = tmp_.data() + r * C;
      ops::dequantize_row(w.pos_embd.data, w.pos_embd.type, C, rows.pos[r], pr);
      for (int64_t i = 0; i < C; ++i) xr[i] += pr[i];
    }
  }
}

int64_t DecoderForward::forward(const DecoderRows& rows, const PagedKv& kv, float* logits,
                                StageStats* stages) {
  const DecoderConfig& c = model_.config;
  const DecoderWeights& w = model_.weights;
  const int64_t C = c.d_model, n = rows.n;
  if (xn_.empty()) {
    const auto R = static_cast<size_t>(max_rows_), F = static_cast<size_t>(c.d_ff);
    xn_.resize(R * static_cast<size_t>(C));
    q_.resize(R * static_cast<size_t>(c.q_dim()));
    att_.resize(q_.size());
    k_.resize(R * static_cast<size_t>(c.kv_dim()));
    v_.resize(k_.size());
    ff_a_.resize(R * F);
    ff_b_.resize(R * F);
    stat_a_.resize(R);
    stat_b_.resize(R);
    n_keys_.resize(R);
    first_key_.resize(R);
  }
  embed(rows);
  const int64_t W = c.sliding_window;
  for (int64_t r = 0; r < n; ++r) {
    n_keys_[r] = rows.pos[r] + 1;
    first_key_[r] = static_cast<int32_t>(W > 0 ? std::max<int64_t>(0, rows.pos[r] + 1 - W) : 0);
  }
  for (int64_t l = 0; l < c.n_layers; ++l) layer(l, rows, kv, stages);

  // Final norm and the output head, only for the rows whose logits were asked for.
  int64_t m = 0;
  for (int64_t r = 0; r < n; ++r)
    if (rows.want_logits[r]) {
      std::memcpy(tmp_.data() + m * C, x_.data() + r * C, static_cast<size_t>(C) * sizeof(float));
      ++m;
    }
  if (m == 0) return 0;
  norm(xn_.data(), tmp_.data(), m, w.out_norm, w.out_norm_b);
  linear(stages, Stage::head, logits, xn_.data(), m, w.output, {});
  return m;
}

void DecoderForward::linear(StageStats* stages, Stage stage, float* y, const float* x, int64_t n,
                            const WeightRef& w, const WeightRef& b) {
  const profile::Timer t;
  ops::matmul_wt(ctx_, y, w.rows(), x, n, w.cols(), w.data, w.type, w.rows(),
                 b.present() ? static_cast<const float*>(b.data) : nullptr);
  count(stages, stage, t.seconds(), w.bytes());
}

void DecoderForward::linear_group(StageStats* stages, Stage stage, const float* x, int64_t n,
                                  std::initializer_list<LinearOut> outs) {
  const profile::Timer t;
  int64_t bytes = 0;
  ops::WtProduct products[4];
  int64_t count_products = 0;
  int64_t K = 0;
  for (const LinearOut& o : outs) {
    ops::WtProduct& p = products[count_products++];
    p.y = o.y;
    p.ldy = o.w->rows();
    p.w = o.w->data;
    p.w_type = o.w->type;
    p.N = o.w->rows();
    p.bias = o.b && o.b->present() ? static_cast<const float*>(o.b->data) : nullptr;
    K = o.w->cols();
    bytes += o.w->bytes();
  }
  ops::matmul_wt_group(ctx_, x, n, K, {products, static_cast<size_t>(count_products)});
  count(stages, stage, t.seconds(), bytes);
}

void DecoderForward::norm(float* out, const float* inp, int64_t n, const WeightRef& w,
                          const WeightRef& b) {
  const DecoderConfig& c = model_.config;
  const auto* wf = static_cast<const float*>(w.data);
  if (c.arch == DecoderArch::gpt2)
    ops::layernorm_forward(ctx_, out, stat_a_.data(), stat_b_.data(), inp, wf,
                           static_cast<const float*>(b.data), n, c.d_model);
  else
    ops::rmsnorm_forward(ctx_, out, stat_a_.data(), inp, wf, n, c.d_model, c.norm_eps);
}

void DecoderForward::layer(int64_t l, const DecoderRows& rows, const PagedKv& kv,
                           StageStats* stages) {
  const DecoderConfig& c = model_.config;
  const DecoderLayer& w = model_.weights.layers[static_cast<size_t>(l)];
  const int64_t n = rows.n;
  const int64_t C = c.d_model, D = c.head_dim, H = c.n_heads, Hkv = c.n_kv_heads;
  const int64_t KV = c.kv_dim(), BT = kv.block_tokens;

  norm(xn_.data(), x_.data(), n, w.attn_norm, w.attn_norm_b);
  // q, k and v read the same input: one grouped product (one hand-off, x quantized once).
  linear_group(stages, Stage::qkv, xn_.data(), n,
               {{q_.data(), &w.wq, &w.bq}, {k_.data(), &w.wk, &w.bk}, {v_.data(), &w.wv, &w.bv}});
  if (c.arch == DecoderArch::llama) {
    ops::rope_forward(ctx_, q_.data(), q_.data(), rope_, rows.pos, 0, 1, n, H, D, c.rope_layout);
    ops::rope_forward(ctx_, k_.data(), k_.data(), rope_, rows.pos, 0, 1, n, Hkv, D, c.rope_layout);
  }
  // Append this chunk's keys and values to the cache, then attend.
  const int64_t eb = dtype_bytes(kv.type, 1);
  uint8_t* base = kv.base + l * kv.layer_stride * eb;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t pos = rows.pos[r];
    uint8_t* blk = base + rows.tables[r][pos / BT] * kv.block_stride * eb;
    const int64_t t = pos % BT;
    for (int64_t g = 0; g < Hkv; ++g) {
      // Keys go in transposed, (D, block_tokens) per head (see PagedAttentionArgs::k_transposed);
      // values as rows.
      write_key_column(kv.type, k_.data() + r * KV + g * D, blk + (g * BT * D + t) * eb, D, BT);
      from_f32(kv.type, v_.data() + r * KV + g * D, blk + (kv.v_offset + g * BT * D + t * D) * eb,
               D);
    }
  }
  const profile::Timer attn_timer;
  ops::PagedAttentionArgs a;
  a.out = att_.data();
  a.q = q_.data();
  a.rows = n;
  a.H = H;
  a.Hkv = Hkv;
  a.D = D;
  a.kv = base;
  a.kv_type = kv.type;
  a.k_transposed = true;
  a.block_tokens = BT;
  a.block_stride = kv.block_stride;
  a.v_offset = kv.v_offset;
  a.block_tables = rows.tables;
  a.n_keys = n_keys_.data();
  if (c.sliding_window > 0) a.first_key = first_key_.data();
  a.scale = 1.0f / std::sqrt(static_cast<float>(D));
  ops::paged_attention(ctx_, a);
  count(stages, Stage::attention, attn_timer.seconds(), 0);

  linear(stages, Stage::attn_out, tmp_.data(), att_.data(), n, w.wo, w.bo);
  ops::add(ctx_, x_.data(), x_.data(), tmp_.data(), n * C);
  norm(xn_.data(), x_.data(), n, w.ffn_norm, w.ffn_norm_b);
  if (c.arch == DecoderArch::llama) {
    linear_group(stages, Stage::mlp_in, xn_.data(), n,
                 {{ff_a_.data(), &w.w_gate, nullptr}, {ff_b_.data(), &w.w_up, nullptr}});
    ops::swiglu_forward(ctx_, ff_a_.data(), ff_a_.data(), ff_b_.data(), n, c.d_ff);
  } else {
    linear(stages, Stage::mlp_in, ff_a_.data(), xn_.data(), n, w.w_up, w.b_up);
    ops::gelu_forward(ctx_, ff_a_.data(), ff_a_.data(), n * c.d_ff);
  }
  linear(stages, Stage::mlp_down, tmp_.data(), ff_a_.data(), n, w.w_down, w.b_down);
  ops::add(ctx_, x_.data(), x_.data(), tmp_.data(), n * C);
}

}  // namespace tessera::model
