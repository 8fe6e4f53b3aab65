// The decoder forward pass over a chunk of token rows and a paged KV cache, against ops/.
#include "model/decoder_forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "ops/paged_attention.h"
#include "ops/quant.h"

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

}  // namespace

// Attention over the paged cache: this chunk's keys and values (rotated first, for Llama) are
// appended to the cache, then each row's query attends to its sequence's keys up to its own.
class DecoderForward::PagedAttention final : public BlockAttention {
 public:
  PagedAttention(DecoderForward& f, const DecoderRows& rows, const PagedKv& kv)
      : f_(f), rows_(rows), kv_(kv) {}

  void attend(int64_t l, float* qkv, float* att, int64_t n) override {
    const DecoderConfig& c = f_.model_.config;
    const int64_t D = c.head_dim, H = c.n_heads, Hkv = c.n_kv_heads;
    const int64_t QD = c.q_dim(), KV = c.kv_dim(), ld = QD + 2 * KV, BT = kv_.block_tokens;
    // q and k as contiguous (n, H, D) rows for RoPE and the attention kernel; v is read in place.
    float* q = f_.q_.data();
    float* k = f_.k_.data();
    for (int64_t r = 0; r < n; ++r) {
      std::memcpy(q + r * QD, qkv + r * ld, static_cast<size_t>(QD) * sizeof(float));
      std::memcpy(k + r * KV, qkv + r * ld + QD, static_cast<size_t>(KV) * sizeof(float));
    }
    if (c.arch == DecoderArch::llama) {
      ops::rope_forward(f_.ctx_, q, q, f_.rope_, rows_.pos, 0, 1, n, H, D, c.rope_layout);
      ops::rope_forward(f_.ctx_, k, k, f_.rope_, rows_.pos, 0, 1, n, Hkv, D, c.rope_layout);
    }
    const int64_t eb = dtype_bytes(kv_.type, 1);
    uint8_t* base = kv_.base + l * kv_.layer_stride * eb;
    for (int64_t r = 0; r < n; ++r) {
      const int64_t pos = rows_.pos[r];
      uint8_t* blk = base + rows_.tables[r][pos / BT] * kv_.block_stride * eb;
      const int64_t t = pos % BT;
      const float* v = qkv + r * ld + QD + KV;
      for (int64_t g = 0; g < Hkv; ++g) {
        // Keys go in transposed, (D, block_tokens) per head (PagedAttentionArgs::k_transposed);
        // values as rows.
        write_key_column(kv_.type, k + r * KV + g * D, blk + (g * BT * D + t) * eb, D, BT);
        from_f32(kv_.type, v + g * D, blk + (kv_.v_offset + g * BT * D + t * D) * eb, D);
      }
    }
    ops::PagedAttentionArgs a;
    a.out = att;
    a.q = q;
    a.rows = n;
    a.H = H;
    a.Hkv = Hkv;
    a.D = D;
    a.kv = base;
    a.kv_type = kv_.type;
    a.k_transposed = true;
    a.block_tokens = BT;
    a.block_stride = kv_.block_stride;
    a.v_offset = kv_.v_offset;
    a.block_tables = rows_.tables;
    a.n_keys = f_.n_keys_.data();
    if (c.sliding_window > 0) a.first_key = f_.first_key_.data();
    a.scale = 1.0f / std::sqrt(static_cast<float>(D));
    ops::paged_attention(f_.ctx_, a);
  }

 private:
  DecoderForward& f_;
  const DecoderRows& rows_;
  const PagedKv& kv_;
};

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
    qkv_.resize(q_.size() + 2 * k_.size());
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
  // Every layer runs in place on x: one scratch set serves them all.
  BlockTensors t;
  t.in = t.mid = t.out = x_.data();
  t.branch = tmp_.data();
  t.xn1 = t.xn2 = xn_.data();
  t.mean1 = t.mean2 = stat_a_.data();
  t.rstd1 = t.rstd2 = stat_b_.data();
  t.qkv = qkv_.data();
  t.att = att_.data();
  t.ff_in = t.ff_act = ff_a_.data();
  t.ff_up = ff_b_.data();
  PagedAttention attention(*this, rows, kv);
  for (int64_t l = 0; l < c.n_layers; ++l)
    block_forward(ctx_, c, w.layers[static_cast<size_t>(l)], l, n, t, attention, stages);

  // Final norm and the output head, only for the rows whose logits were asked for.
  int64_t m = 0;
  for (int64_t r = 0; r < n; ++r)
    if (rows.want_logits[r]) {
      std::memcpy(tmp_.data() + m * C, x_.data() + r * C, static_cast<size_t>(C) * sizeof(float));
      ++m;
    }
  if (m == 0) return 0;
  norm_forward(ctx_, c, xn_.data(), stat_a_.data(), stat_b_.data(), tmp_.data(), m, w.out_norm,
               w.out_norm_b);
  linear_forward(ctx_, stages, Stage::head, logits, xn_.data(), m, w.output, {});
  return m;
}

}  // namespace tessera::model
