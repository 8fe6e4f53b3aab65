// The decoder forward pass over a chunk of token rows and a paged KV cache, against ops/.
#include "model/decoder_forward.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "ops/quant.h"

namespace tessera::model {

namespace {

// The activation buffers (DecoderForward::acts_), each max_rows rows of the width beside it.
// kRouter .. kMoeY: a mixture-of-experts layer's (BlockTensors), empty for dense models.
enum Act {
  kX,
  kTmp,
  kXn,
  kQkv,
  kQ,
  kAtt,
  kFf,
  kStatA,
  kStatB,
  kLora,
  kRouter,
  kMoeIds,
  kMoeWeights,
  kMoeX,
  kMoeY,
  kNumActs
};

// The largest rank of m's adapters (LoraRef), 0 without any.
int64_t max_lora_rank(const DecoderModel& m) {
  int64_t r = 0;
  for (const DecoderLayer& l : m.weights.layers)
    for (const LoraRef& a : l.lora)
      if (a.present()) r = std::max(r, a.rank());
  return r;
}

// Each activation buffer's floats (or int32s) per row, in Act's order (kLora: x A^T of an
// adapter; kFf: the gate's and the up product's outputs). A MoE layer's MLP runs k rows per
// token.
std::array<int64_t, kNumActs> act_widths(const DecoderConfig& c, int64_t lora_rank) {
  const int64_t k = c.moe() ? c.n_experts_used : 0, ff = c.d_ff * std::max<int64_t>(k, 1);
  return {c.d_model,
          c.d_model,
          c.d_model,
          c.q_dim() + 2 * c.kv_dim(),
          c.q_dim(),
          c.q_dim(),
          2 * ff,
          1,
          1,
          std::max<int64_t>(lora_rank, 1),
          c.n_experts,
          2 * k,
          2 * k,
          k * c.d_model,
          k * c.d_model};
}
// Logit rows per head call on a device (bounds the device's logits buffer at large vocabularies).
constexpr int64_t kHeadRows = 64;
// Graphs: chunks of up to kGraphMaxRows rows, key bounds rounded to kGraphKeysRound (the paged
// decode kernel's split size on CUDA), at most kMaxGraphs shapes kept.
constexpr int64_t kGraphMaxRows = 64, kGraphKeysRound = 256;
constexpr size_t kMaxGraphs = 256;

}  // namespace

// Attention over the paged cache: this chunk's keys and values (rotated first, for Llama) are
// appended to the cache, then each row's query attends to its sequence's keys up to its own.
class DecoderForward::PagedAttention final : public BlockAttention {
 public:
  PagedAttention(DecoderForward& f, const PagedKv& kv, int64_t max_keys)
      : f_(f), kv_(kv), max_keys_(max_keys) {}

  void attend(int64_t l, float* qkv, float* att, int64_t n,
              const ops::QuantizedRows* att_q) override {
    const DecoderConfig& c = f_.model_.config;
    const ops::Context& ctx = f_.ctx_;
    const int64_t H = c.n_heads;
    const int64_t QD = c.q_dim(), KV = c.kv_dim(), ld = QD + 2 * KV;
    // The layer's pool: the windowed layers' own where the cache keeps them apart.
    const bool apart = kv_.windowed != nullptr && c.window(l) > 0;
    const PagedKv& pool = apart ? *kv_.windowed : kv_;
    const int64_t layer = kv_.windowed ? f_.pool_layer_[static_cast<size_t>(l)] : l;
    const int64_t eb = dtype_bytes(pool.layout.kv_type, 1);
    uint8_t* base = pool.base + layer * pool.layer_stride * eb;
    // One op: q rotated into its own (n, H, D) rows for the attention kernel, k rotated and v
    // read in place from qkv into the cache.
    float* q = f_.buf(kQ);
    ops::RopeKvAppendArgs ap;
    static_cast<ops::PagedKvLayout&>(ap) = pool.layout;
    ap.kv = base;
    ap.q = qkv;
    ap.ldq = ld;
    ap.H = H;
    ap.q_out = q;
    ap.k = qkv + QD;
    ap.v = qkv + QD + KV;
    ap.ldk = ap.ldv = ld;
    ap.rows = n;
    ap.slot = f_.ints(apart ? kWindowSlot : kSlot);
    ap.n_blocks = pool.n_blocks;
    if (c.arch == DecoderArch::llama && c.rotary(l)) {
      ap.rope = c.local(l) ? &f_.rope_local_ : &f_.rope_;
      ap.layout = c.rope_layout;
      ap.positions = f_.ints(kPos);
    }
    ops::rope_kv_append(ctx, ap);

    ops::PagedAttentionArgs a;
    static_cast<ops::PagedKvLayout&>(a) = pool.layout;
    a.out = att;
    a.q = q;
    a.rows = n;
    a.H = H;
    a.kv = base;
    a.block_tables = apart ? f_.window_tables() : f_.ints(kTables);
    a.table_stride = f_.table_stride_;
    a.n_keys = f_.ints(kNKeys);
    if (c.window(l) > 0) a.first_key = f_.ints(kFirstKey);
    a.max_keys = max_keys_;
    a.scale = c.score_scale();
    a.q_out = att_q;
    if (f_.plan_bytes_ > 0) {
      const int kind = f_.plan_kind(l, apart);
      a.plan = f_.plans_device_.as<uint8_t>() + kind * f_.plan_bytes_;
      a.plan_key = f_.plan_keys_[static_cast<size_t>(kind)];
    }
    ops::paged_attention(ctx, a);
  }

 private:
  DecoderForward& f_;
  const PagedKv& kv_;
  int64_t max_keys_;
};

void make_rope_tables(const ops::Context& ctx, const DecoderConfig& c, int64_t max_pos,
                      ops::RopeTable* global, ops::RopeTable* local, ops::Buffer* device) {
  // LongRoPE picks its factors by the context the tables are sized for.
  *global = ops::make_rope_table(max_pos, rope_inv_freqs(c, false, max_pos), c.rope_attn_factor);
  *local = c.local_layers.empty() ? ops::RopeTable{}
                                  : ops::make_rope_table(max_pos, rope_inv_freqs(c, true));
  *device = ops::Buffer();
  if (ctx.device == ops::Device::cpu) return;
  const size_t half = global->cos.size() * sizeof(float);
  const size_t tables = c.local_layers.empty() ? 1 : 2;
  *device = ops::Buffer(ctx.device, 2 * half * tables);
  for (size_t i = 0; i < tables; ++i) {
    ops::RopeTable& t = i == 0 ? *global : *local;
    uint8_t* at = device->as<uint8_t>() + 2 * half * i;
    ops::copy(ctx, at, t.cos.data(), half, ops::CopyKind::host_to_device);
    ops::copy(ctx, at + half, t.sin.data(), half, ops::CopyKind::host_to_device);
    t.device = reinterpret_cast<const float*>(at);
  }
}

DecoderForward::DecoderForward(const DecoderModel& model, const ops::Context& ctx, int64_t max_rows,
                               int64_t max_ctx)
    : model_(model),
      ctx_(ctx),
      on_host_(ctx.device == ops::Device::cpu),
      max_rows_(max_rows),
      max_ctx_(max_ctx) {
  const DecoderConfig& c = model_.config;
  TS_CHECK(max_rows > 0, "[model] max_rows must be positive, got ", max_rows);
  TS_CHECK(max_ctx > 0, "[model] max_ctx must be positive, got ", max_ctx);
  if (c.arch == DecoderArch::gpt2) {
    TS_CHECK(std::fabs(c.norm_eps - 1e-5f) < 1e-9f, "[model] gpt2 layer norm epsilon ", c.norm_eps,
             " is not supported (1e-5)");
  } else {
    make_rope_tables(ctx, c, max_ctx, &rope_, &rope_local_, &rope_device_);
  }
  x_host_.resize(static_cast<size_t>(max_rows * c.d_model));
  if (model_.weights.pos_embd.present()) pos_row_.resize(static_cast<size_t>(c.d_model));
}

void DecoderForward::embed(const DecoderRows& rows) {
  TS_CHECK(rows.n >= 0 && rows.n <= max_rows_, "[model] chunk of ", rows.n, " rows, more than the ",
           max_rows_, " the forward pass was sized for");
  const DecoderWeights& w = model_.weights;
  const int64_t C = model_.config.d_model;
  for (int64_t r = 0; r < rows.n; ++r) {
    float* xr = x_host_.data() + r * C;
    ops::dequantize_row(w.tok_embd.data, w.tok_embd.type, C, rows.tokens[r], xr);
    if (model_.config.embed_scale != 1.0f)
      for (int64_t i = 0; i < C; ++i) xr[i] *= model_.config.embed_scale;
    if (w.pos_embd.present()) {
      ops::dequantize_row(w.pos_embd.data, w.pos_embd.type, C, rows.pos[r], pos_row_.data());
      for (int64_t i = 0; i < C; ++i) xr[i] += pos_row_[static_cast<size_t>(i)];
    }
  }
}

int64_t DecoderForward::forward(const DecoderRows& rows, const PagedKv& kv, float* out,
                                Output what) {
  const DecoderConfig& c = model_.config;
  const DecoderWeights& w = model_.weights;
  const int64_t C = c.d_model, V = c.vocab, n = rows.n, BT = kv.layout.block_tokens;
  const auto R = static_cast<size_t>(max_rows_);
  if (acts_.empty()) {
    for (int64_t width : act_widths(c, max_lora_rank(model_)))
      acts_.emplace_back(ctx_.device,
                         R * static_cast<size_t>(std::max<int64_t>(width, 1)) * sizeof(float));
    table_stride_ = (max_ctx_ + BT - 1) / BT;
    ints_.resize(R * static_cast<size_t>(kTables + 2 * table_stride_));
    if (!on_host_) {
      ints_device_ = ops::Buffer(ctx_.device, ints_.size() * sizeof(int32_t));
      logits_device_ =
          ops::Buffer(ctx_.device, static_cast<size_t>(std::min(max_rows_, kHeadRows) * V) * 4);
      size_quantized_rows();
      plan_bytes_ = ops::paged_attention_plan_bytes(ctx_, max_rows_);
      if (plan_bytes_ > 0) {
        plans_host_.resize(static_cast<size_t>(kPlanKinds * plan_bytes_));
        plans_device_ = ops::Buffer(ctx_.device, plans_host_.size());
      }
    }
  }
  TS_CHECK(table_stride_ * BT >= max_ctx_, "[model] cache blocks of ", BT,
           " tokens differ from the first forward's");
  TS_CHECK(!kv.windowed || (rows.window_tables && kv.windowed->layout.block_tokens == BT),
           "[model] a windowed pool needs the rows' window tables and blocks of ", BT, " tokens");
  if (kv.windowed && pool_layer_.empty()) {
    int64_t counts[2] = {0, 0};  // layers so far in the full pool, in the windowed one
    for (int64_t l = 0; l < c.n_layers; ++l) pool_layer_.push_back(counts[c.window(l) > 0]++);
  }
  embed(rows);

  // The host's bookkeeping, as the ops read it.
  const int64_t W = c.sliding_window;
  int64_t max_keys = 1, m = 0;
  int32_t *pos = host_ints(kPos), *slot = host_ints(kSlot), *n_keys = host_ints(kNKeys),
          *first_key = host_ints(kFirstKey), *logit_rows = host_ints(kLogitRows),
          *tables = host_ints(kTables);
  for (int64_t r = 0; r < n; ++r) {
    const int32_t p = rows.pos[r];
    TS_CHECK(p >= 0 && p < max_ctx_, "[model] row ", r, " position ", p, " outside [0, ", max_ctx_,
             ")");
    pos[r] = p;
    slot[r] = static_cast<int32_t>(rows.tables[r][p / BT] * BT + p % BT);
    n_keys[r] = p + 1;
    first_key[r] = static_cast<int32_t>(W > 0 ? std::max<int64_t>(0, p + 1 - W) : 0);
    max_keys = std::max<int64_t>(max_keys, p + 1);
    std::copy(rows.tables[r], rows.tables[r] + p / BT + 1, tables + r * table_stride_);
    if (kv.windowed) {
      // Blocks before the window are freed (-1): block 0 stands in, never read.
      const int32_t* from = rows.window_tables[r];
      int32_t* to = tables + (max_rows_ + r) * table_stride_;
      for (int64_t b = 0; b <= p / BT; ++b) to[b] = std::max(from[b], 0);
      TS_CHECK(from[first_key[r] / BT] >= 0 && from[p / BT] >= 0, "[model] row ", r,
               ": the windowed pool lacks a block of positions ", first_key[r], " .. ", p);
      host_ints(kWindowSlot)[r] = static_cast<int32_t>(from[p / BT] * BT + p % BT);
    }
    if (rows.want_logits[r]) logit_rows[m++] = static_cast<int32_t>(r);
  }
  if (plan_bytes_ > 0) stage_plans(rows, kv, n);
  if (!on_host_) set_quantized_rows(n);
  // On a device: the row arrays and the tables' rows in use in one copy, then the embeddings.
  if (!on_host_) {
    const size_t used = R * kTables + static_cast<size_t>(n * table_stride_);
    ops::copy(ctx_, ints_device_.data(), ints_.data(), used * sizeof(int32_t),
              ops::CopyKind::host_to_device);
    const size_t window = R * (kTables + table_stride_);
    if (kv.windowed)
      ops::copy(ctx_, ints_device_.as<int32_t>() + window, ints_.data() + window,
                static_cast<size_t>(n * table_stride_) * sizeof(int32_t),
                ops::CopyKind::host_to_device);
  }
  ops::copy(ctx_, buf(kX), x_host_.data(), static_cast<size_t>(n * C) * sizeof(float),
            ops::CopyKind::host_to_device);

  // The device's part. Where the device records graphs, a step of a shape seen before replays
  // as one launch; the attention's key bound is rounded up so that a growing sequence keeps its
  // graph for kGraphKeysRound positions (the kernels read each row's own count).
  const int64_t bound = std::min(
      table_stride_ * BT, (max_keys + kGraphKeysRound - 1) / kGraphKeysRound * kGraphKeysRound);
  if (what == Output::hidden) {
    // Embedding requests are rare next to decode steps: run eagerly, no graph.
    run_layers(n, m, bound, 0, kv, nullptr);
    ops::copy(ctx_, out, buf(kXn), static_cast<size_t>(m * C) * sizeof(float),
              ops::CopyKind::device_to_host);
    return m;
  }
  float* logits = out;
  float* head_out = on_host_ ? logits : logits_device_.as<float>();
  const int64_t first_piece = on_host_ ? m : std::min(m, kHeadRows);
  auto run = [&] { run_layers(n, m, bound, first_piece, kv, head_out); };
  // A MoE layer groups its rows by expert on the host (moe_mlp): no graph can record it.
  if (n <= kGraphMaxRows && m <= kHeadRows && !c.moe() && ops::records_graphs(ctx_)) {
    const GraphKey key{n, m, bound, kv.base, plan_keys_};
    auto it = graphs_.find(key);
    if (it == graphs_.end()) {
      // First sighting: eager, which also lets the backend size its scratch (nothing may be
      // allocated while recording).
      if (graphs_.size() < kMaxGraphs) graphs_.emplace(key, ops::Graph());
      run();
    } else {
      if (it->second.empty()) it->second = ops::record(ctx_, run);
      it->second.replay(ctx_);
    }
  } else {
    run();
  }
  if (m == 0 || on_host_) return m;
  // The logits to the host, piece by piece (the device holds kHeadRows rows of them).
  for (int64_t r0 = 0; r0 < m; r0 += kHeadRows) {
    const int64_t rows_here = std::min(kHeadRows, m - r0);
    if (r0 > 0)
      linear_forward(ctx_, Stage::head, logits_device_.as<float>(), buf(kXn) + r0 * C, rows_here,
                     w.output, {});
    ops::copy(ctx_, logits + r0 * V, logits_device_.data(),
              static_cast<size_t>(rows_here * V) * sizeof(float), ops::CopyKind::device_to_host);
  }
  return m;
}

void DecoderForward::run_layers(int64_t n, int64_t m, int64_t max_keys, int64_t head_rows,
                                const PagedKv& kv, float* head_out) {
  const DecoderConfig& c = model_.config;
  const DecoderWeights& w = model_.weights;
  // Every layer runs in place on x: one scratch set serves them all.
  BlockTensors t;
  t.in = t.mid = t.out = buf(kX);
  t.branch = buf(kTmp);
  t.xn1 = t.xn2 = buf(kXn);
  t.mean1 = t.mean2 = buf(kStatA);
  t.rstd1 = t.rstd2 = buf(kStatB);
  t.qkv = buf(kQkv);
  t.att = buf(kAtt);
  // up's n rows right after gate's: at one row they sit side by side as the grouped product's
  // outputs, so gate and up joined at upload run as one product.
  t.ff_in = t.ff_act = buf(kFf);
  t.ff_up = t.ff_in + n * act_widths(c, 0)[kFf] / 2;
  t.lora_u = buf(kLora);
  t.post_rstd = buf(kStatA);  // the layer norm's mean, which RMSNorm models leave unused
  if (c.moe()) {
    t.router = buf(kRouter);
    t.moe_ids = acts_[kMoeIds].as<int32_t>();
    t.moe_weights = buf(kMoeWeights);
    t.moe_x = buf(kMoeX);
    t.moe_y = buf(kMoeY);
    t.routing = &routing_;
  }
  PagedAttention attention(*this, kv, max_keys);
  const bool q = !on_host_;
  // Each layer's last residual add also computes the next layer's attention norm (NormChain);
  // the last layer's output is normalized below, for the logit rows only.
  for (int64_t l = 0; l < c.n_layers; ++l) {
    NormChain chain;
    chain.in_normed = l > 0;
    if (l + 1 < c.n_layers) {
      const DecoderLayer& next = w.layers[static_cast<size_t>(l + 1)];
      chain.next = {t.xn1,           t.mean1,           t.rstd1,
                    &next.attn_norm, &next.attn_norm_b, q ? quantized(l + 1, kQAttnIn) : nullptr};
    }
    // Layer 0's attention norm is a plain norm, which writes no quantized rows.
    t.xn1_q = q && l > 0 ? quantized(l, kQAttnIn) : nullptr;
    t.xn2_q = q ? quantized(l, kQMlpIn) : nullptr;
    t.att_q = q ? quantized(l, kQAtt) : nullptr;
    t.act_q = q ? quantized(l, kQAct) : nullptr;
    block_forward(ctx_, c, w.layers[static_cast<size_t>(l)], l, n, t, attention, false, chain);
  }
  if (m == 0) return;
  // Final norm and the output head, only for the rows whose logits were asked for.
  ops::gather_rows(ctx_, buf(kTmp), buf(kX), ints(kLogitRows), m, c.d_model, n);
  norm_forward(ctx_, c, buf(kXn), buf(kStatA), buf(kStatB), buf(kTmp), m, w.out_norm, w.out_norm_b);
  if (head_rows > 0) linear_forward(ctx_, Stage::head, head_out, buf(kXn), head_rows, w.output, {});
}

std::pair<int64_t, DType> DecoderForward::quantized_role(int64_t layer, int role) const {
  const DecoderConfig& c = model_.config;
  const DecoderLayer& w = model_.weights.layers[static_cast<size_t>(layer)];
  const bool gated = c.arch == DecoderArch::llama && !c.moe();
  switch (role) {
    case kQAttnIn:
      return {c.d_model, w.wq.type};
    case kQMlpIn:  // a mixture's router and experts read the f32 rows
      return {c.d_model, c.moe() ? DType::f32 : gated ? w.w_gate.type : w.w_up.type};
    case kQAtt:
      return {c.q_dim(), w.wo.type};
    default:  // GPT-2's GELU writes no quantized rows
      return {c.d_ff, gated ? w.w_down.type : DType::f32};
  }
}

void DecoderForward::size_quantized_rows() {
  q_rows_.assign(static_cast<size_t>(model_.config.n_layers), {});
  for (int role = 0; role < kQRoles; ++role) {
    int64_t bytes = 0;
    for (int64_t l = 0; l < model_.config.n_layers; ++l) {
      const auto [cols, type] = quantized_role(l, role);
      if (type == DType::f32) continue;
      for (int64_t r = 1; r <= max_rows_; ++r) {
        const int64_t b = ops::quantized_rows_bytes(ctx_, r, cols, type);
        if (b == 0) break;  // the device takes up to some number of rows
        bytes = std::max(bytes, b);
      }
    }
    if (bytes > 0) q_buffers_[static_cast<size_t>(role)] = ops::Buffer(ctx_.device, bytes);
  }
}

void DecoderForward::set_quantized_rows(int64_t n) {
  if (n == q_rows_n_) return;
  q_rows_n_ = n;
  for (int64_t l = 0; l < model_.config.n_layers; ++l)
    for (int role = 0; role < kQRoles; ++role) {
      const ops::Buffer& buffer = q_buffers_[static_cast<size_t>(role)];
      const auto [cols, type] = quantized_role(l, role);
      const int64_t bytes = type == DType::f32 ? 0 : ops::quantized_rows_bytes(ctx_, n, cols, type);
      const bool fits = bytes > 0 && static_cast<size_t>(bytes) <= buffer.size();
      q_rows_[static_cast<size_t>(l)][static_cast<size_t>(role)] =
          fits ? ops::QuantizedRows{buffer.data(), type, n, cols} : ops::QuantizedRows{};
    }
}

int DecoderForward::plan_kind(int64_t layer, bool apart) const {
  return apart ? 2 : model_.config.window(layer) > 0 ? 1 : 0;
}

void DecoderForward::stage_plans(const DecoderRows& rows, const PagedKv& kv, int64_t n) {
  const int64_t BT = kv.layout.block_tokens, S = table_stride_;
  int32_t* tables = host_ints(kTables);
  // Rows of one sequence (adjacent, reading one table) get its table up to the run's last
  // position: a device's tiles read their first row's table for every row's keys.
  for (int64_t r0 = 0; r0 < n;) {
    int64_t r1 = r0 + 1, last = rows.pos[r0];
    while (r1 < n && rows.tables[r1] == rows.tables[r0] &&
           (!kv.windowed || rows.window_tables[r1] == rows.window_tables[r0]))
      last = std::max<int64_t>(last, rows.pos[r1++]);
    const int64_t used = last / BT + 1;
    for (int64_t r = r0; r < r1; ++r) {
      int32_t* row = tables + r * S;
      std::copy(rows.tables[r0], rows.tables[r0] + used, row);
      std::fill(row + used, row + S, 0);
      if (kv.windowed) {
        int32_t* to = tables + (max_rows_ + r) * S;
        for (int64_t b = 0; b < used; ++b) to[b] = std::max(rows.window_tables[r0][b], 0);
        std::fill(to + used, to + S, 0);
      }
    }
    r0 = r1;
  }
  bool kinds[kPlanKinds] = {};
  for (int64_t l = 0; l < model_.config.n_layers; ++l)
    kinds[plan_kind(l, kv.windowed && model_.config.window(l) > 0)] = true;
  for (int k = 0; k < kPlanKinds; ++k) {
    plan_keys_[static_cast<size_t>(k)] = 0;
    if (!kinds[k]) continue;
    ops::PagedAttentionArgs a;
    static_cast<ops::PagedKvLayout&>(a) = k == 2 ? kv.windowed->layout : kv.layout;
    a.rows = n;
    a.block_tables = k == 2 ? tables + max_rows_ * S : tables;
    a.table_stride = S;
    a.n_keys = host_ints(kNKeys);
    if (k > 0) a.first_key = host_ints(kFirstKey);
    const size_t at = static_cast<size_t>(k * plan_bytes_);
    plan_keys_[static_cast<size_t>(k)] = ops::plan_paged_attention(ctx_, a, &plans_host_[at]);
    ops::copy(ctx_, plans_device_.as<uint8_t>() + at, &plans_host_[at],
              static_cast<size_t>(plan_bytes_), ops::CopyKind::host_to_device);
  }
}

DeviceModel to_device(const DecoderModel& host, const ops::Context& ctx) {
  DeviceModel d;
  d.view = host;
  if (ctx.device == ops::Device::cpu) return d;
  // One copy per distinct tensor (a tied head shares the embedding's bytes, but those stay on
  // the host for the lookups: the head gets its own copy). Several tensors go into one buffer,
  // side by side, where they share a type and a width: a layer's q, k and v (and their biases),
  // and its gate and up. linear_group then runs each group as one product
  // (WeightRef::continued_by): one launch on a device. A tensor joined this way is skipped by
  // the loops below.
  std::vector<const WeightRef*> joined;
  auto upload = [&](std::initializer_list<WeightRef*> parts) {
    const WeightRef& first = **parts.begin();
    int64_t bytes = 0;
    for (WeightRef* r : parts) {
      if (!r->present() || std::ranges::find(joined, r) != joined.end()) return;
      if (r != &first && (r->type != first.type || r->shape.rank() != first.shape.rank() ||
                          (r->shape.rank() == 2 && r->cols() != first.cols())))
        return;
      bytes += r->bytes();
    }
    ops::Buffer b(ctx.device, static_cast<size_t>(bytes));
    auto* at = static_cast<uint8_t*>(b.data());
    for (WeightRef* r : parts) {
      ops::copy(ctx, at, r->data, static_cast<size_t>(r->bytes()), ops::CopyKind::host_to_device);
      r->data = at;
      at += r->bytes();
      if (parts.size() > 1) joined.push_back(r);
    }
    d.buffers.push_back(std::move(b));
  };
  for (DecoderLayer& l : d.view.weights.layers) {
    upload({&l.wq, &l.wk, &l.wv});
    upload({&l.bq, &l.bk, &l.bv});
    upload({&l.w_gate, &l.w_up});
    for (WeightRef* r : l.matrices()) upload({r});
    for (WeightRef* r : l.vectors()) upload({r});
    for (LoraRef& a : l.lora) {
      upload({&a.a});
      upload({&a.b});
    }
  }
  upload({&d.view.weights.out_norm});
  upload({&d.view.weights.out_norm_b});
  upload({&d.view.weights.output});
  return d;
}

int64_t DecoderForward::activation_bytes(const DecoderConfig& c, int64_t max_rows) {
  int64_t floats = 0;
  for (int64_t width : act_widths(c, 0)) floats += width;
  return floats * max_rows * static_cast<int64_t>(sizeof(float));
}

}  // namespace tessera::model
