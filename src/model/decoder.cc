// Decoder model description: configuration checks, RoPE frequencies with scaling, weight byte
// counts, and the loader that picks GGUF or a Hugging Face folder.
#include "model/decoder.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <numbers>

#include "core/error.h"
#include "core/interleave.h"
#include "ops/quant.h"

namespace tessera::model {

void DecoderConfig::validate(const std::string& source) const {
  auto positive = [&](int64_t v, const char* field) {
    TS_CHECK(v > 0, "[model] ", source, ": ", field, " must be positive (got ", v, ")");
  };
  positive(n_layers, "layer count");
  positive(d_model, "embedding width");
  positive(n_heads, "head count");
  positive(n_kv_heads, "key/value head count");
  positive(head_dim, "head dimension");
  positive(d_ff, "feed-forward width");
  positive(vocab, "vocabulary size");
  positive(max_ctx, "context length");
  TS_CHECK(sliding_window >= 0 && sliding_window <= (int64_t{1} << 31), "[model] ", source,
           ": sliding window ", sliding_window, " out of range");
  // Bounds that no real model reaches but that keep every product below int64 overflow.
  TS_CHECK(n_layers <= 4096 && d_model <= (1 << 20) && d_ff <= (1 << 22) && vocab <= (1 << 24) &&
               n_heads <= 4096 && head_dim <= 4096 && max_ctx <= (int64_t{1} << 24),
           "[model] ", source, ": absurd dimensions (layers ", n_layers, ", width ", d_model,
           ", ffn ", d_ff, ", vocab ", vocab, ", heads ", n_heads, ", head dim ", head_dim,
           ", context ", max_ctx, ")");
  TS_CHECK(n_heads % n_kv_heads == 0, "[model] ", source, ": head count ", n_heads,
           " is not a multiple of the key/value head count ", n_kv_heads);
  TS_CHECK(std::isfinite(norm_eps) && norm_eps > 0, "[model] ", source,
           ": norm epsilon must be positive (got ", norm_eps, ")");
  if (arch == DecoderArch::llama) {
    TS_CHECK(rope_dim > 0 && rope_dim % 2 == 0 && rope_dim <= head_dim, "[model] ", source,
             ": rope dimension ", rope_dim, " must be even and in (0, head dim ", head_dim, "]");
    TS_CHECK(std::isfinite(rope_theta) && rope_theta > 1, "[model] ", source,
             ": rope theta must be > 1 (got ", rope_theta, ")");
    TS_CHECK(std::isfinite(rope_factor) && rope_factor > 0, "[model] ", source,
             ": rope scaling factor must be positive (got ", rope_factor, ")");
    TS_CHECK(rope_freq_divisors.empty() ||
                 static_cast<int64_t>(rope_freq_divisors.size()) == rope_dim / 2,
             "[model] ", source, ": rope_freqs has ", rope_freq_divisors.size(),
             " values, expected ", rope_dim / 2);
    TS_CHECK(rope_scaling != RopeScaling::longrope ||
                 (static_cast<int64_t>(rope_freq_divisors.size()) == rope_dim / 2 &&
                  static_cast<int64_t>(rope_long_divisors.size()) == rope_dim / 2),
             "[model] ", source, ": LongRoPE needs ", rope_dim / 2, " short and long factors (has ",
             rope_freq_divisors.size(), " and ", rope_long_divisors.size(), ")");
    TS_CHECK(rope_scaling != RopeScaling::yarn ||
                 (rope_original_max_ctx > 1 && std::isfinite(yarn_beta_fast) &&
                  std::isfinite(yarn_beta_slow) && yarn_beta_slow > 0 &&
                  yarn_beta_fast > yarn_beta_slow),
             "[model] ", source, ": YaRN needs a pretrained length > 1 (got ",
             rope_original_max_ctx, ") and beta_fast > beta_slow > 0 (got ", yarn_beta_fast, ", ",
             yarn_beta_slow, ")");
    TS_CHECK(std::isfinite(rope_attn_factor) && rope_attn_factor > 0, "[model] ", source,
             ": rope attention factor must be positive (got ", rope_attn_factor, ")");
    TS_CHECK(!qk_norm || rope_layout == ops::RopeLayout::half, "[model] ", source,
             ": q/k norms need the rotate-half row order (as Qwen3's files have it)");
    TS_CHECK(local_layers.empty() || static_cast<int64_t>(local_layers.size()) == n_layers,
             "[model] ", source, ": ", local_layers.size(), " layer kinds for ", n_layers,
             " layers");
    TS_CHECK(local_layers.empty() || sliding_window > 0, "[model] ", source,
             ": local layers without a sliding window");
    TS_CHECK(std::isfinite(rope_theta_local) && rope_theta_local > 1, "[model] ", source,
             ": local rope theta must be > 1 (got ", rope_theta_local, ")");
    TS_CHECK(std::isfinite(embed_scale) && embed_scale > 0, "[model] ", source,
             ": embedding scale must be positive (got ", embed_scale, ")");
    TS_CHECK(std::isfinite(attn_scale) && attn_scale >= 0, "[model] ", source,
             ": attention scale must be positive (got ", attn_scale, ")");
    TS_CHECK(nope_layers.empty() || static_cast<int64_t>(nope_layers.size()) == n_layers,
             "[model] ", source, ": ", nope_layers.size(), " no-RoPE layer marks for ", n_layers,
             " layers");
    TS_CHECK(!qk_norm_whole || qk_norm, "[model] ", source,
             ": whole-vector q/k norms without q/k norms");
    TS_CHECK(n_experts >= 0 && n_experts <= 4096, "[model] ", source, ": expert count ", n_experts,
             " out of range [0, 4096]");
    TS_CHECK(!moe() || (n_experts_used >= 1 && n_experts_used <= n_experts), "[model] ", source,
             ": experts used per token ", n_experts_used, " must be in [1, ", n_experts, "]");
    TS_CHECK(!moe() || mlp_act == ops::GluAct::silu, "[model] ", source,
             ": mixture-of-experts layers are SwiGLU here");
  } else {
    TS_CHECK(n_kv_heads == n_heads && head_dim * n_heads == d_model, "[model] ", source,
             ": gpt2 needs head count * head dim == width and no grouped heads");
    TS_CHECK(!qk_norm && !post_norms && local_layers.empty() && mlp_act == ops::GluAct::silu &&
                 embed_scale == 1.0f && attn_scale == 0.0 && !moe() && nope_layers.empty(),
             "[model] ", source, ": gpt2 has none of the Llama-family layer options");
  }
}

std::vector<double> rope_inv_freqs(const DecoderConfig& cfg, bool local, int64_t ctx) {
  const bool long_rope =
      cfg.rope_scaling == RopeScaling::longrope && ctx > cfg.rope_original_max_ctx;
  const std::vector<float>& divisors = long_rope ? cfg.rope_long_divisors : cfg.rope_freq_divisors;
  const int64_t pairs = cfg.rope_dim / 2;
  std::vector<double> inv(static_cast<size_t>(pairs));
  // YaRN (Peng et al. 2023): the pair indices at which a frequency turns beta_fast and beta_slow
  // times over the pretrained length, floor and ceil; the pairs between them ramp.
  double yarn_low = 0, yarn_high = 0;
  if (cfg.rope_scaling == RopeScaling::yarn) {
    const double d = static_cast<double>(cfg.rope_dim);
    auto pair_turning = [&](double rotations) {
      return d *
             std::log(static_cast<double>(cfg.rope_original_max_ctx) /
                      (rotations * 2 * std::numbers::pi)) /
             (2 * std::log(cfg.rope_theta));
    };
    yarn_low = std::max(0.0, std::floor(pair_turning(cfg.yarn_beta_fast)));
    yarn_high = std::min(d - 1, std::ceil(pair_turning(cfg.yarn_beta_slow)));
  }
  for (int64_t i = 0; i < pairs; ++i) {
    const double theta = local ? cfg.rope_theta_local : cfg.rope_theta;
    double f = std::pow(theta, -2.0 * static_cast<double>(i) / cfg.rope_dim);
    if (local) {
      inv[static_cast<size_t>(i)] = f;
      continue;
    }
    if (cfg.rope_scaling == RopeScaling::linear) f /= cfg.rope_factor;
    if (cfg.rope_scaling == RopeScaling::llama3) {
      // Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, and the band in
      // between interpolated smoothly (published with the model's reference code).
      const double wavelen = 2 * std::numbers::pi / f;
      const double low_wavelen = cfg.rope_original_max_ctx / cfg.rope_low_freq_factor;
      const double high_wavelen = cfg.rope_original_max_ctx / cfg.rope_high_freq_factor;
      if (wavelen > low_wavelen) {
        f /= cfg.rope_factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (cfg.rope_original_max_ctx / wavelen - cfg.rope_low_freq_factor) /
                              (cfg.rope_high_freq_factor - cfg.rope_low_freq_factor);
        f = (1 - smooth) * f / cfg.rope_factor + smooth * f;
      }
    }
    if (cfg.rope_scaling == RopeScaling::yarn) {
      const double ramp = std::clamp(
          (static_cast<double>(i) - yarn_low) / std::max(0.001, yarn_high - yarn_low), 0.0, 1.0);
      f = ramp * f / cfg.rope_factor + (1 - ramp) * f;  // kept below low, slowed past high
    }
    if (!divisors.empty()) f /= divisors[static_cast<size_t>(i)];
    inv[static_cast<size_t>(i)] = f;
  }
  return inv;
}

WeightRef row_slice(const WeightRef& w, int64_t row0, int64_t rows) {
  const int64_t row_bytes = dtype_bytes(w.type, w.cols());
  const auto* base = static_cast<const uint8_t*>(w.data);
  if (w.shape.rank() == 1)
    return WeightRef{base + dtype_bytes(w.type, row0), w.type, Shape({rows})};
  return WeightRef{base + row0 * row_bytes, w.type, Shape({rows, w.cols()})};
}

void split_qkv(const WeightRef& fused, int64_t q_rows, int64_t kv_rows, WeightRef* q, WeightRef* k,
               WeightRef* v) {
  *q = row_slice(fused, 0, q_rows);
  *k = row_slice(fused, q_rows, kv_rows);
  *v = row_slice(fused, q_rows + kv_rows, kv_rows);
}

WeightRef expert_rows(const WeightRef& stacked, int64_t e, int64_t n_experts) {
  const int64_t rows = stacked.rows() / n_experts;
  return row_slice(stacked, e * rows, rows);
}

namespace {

template <typename Fn>
void for_each_weight(const DecoderWeights& w, Fn&& fn) {
  fn(w.tok_embd, true);
  fn(w.pos_embd, true);
  for (const DecoderLayer& l : w.layers) {
    for (const WeightRef* r : l.matrices()) fn(*r, false);
    for (const WeightRef* r : l.vectors()) fn(*r, false);
  }
  fn(w.out_norm, false);
  fn(w.out_norm_b, false);
  if (w.output.data != w.tok_embd.data) fn(w.output, false);
}

}  // namespace

int64_t DecoderModel::weight_bytes_per_token() const {
  int64_t total = 0;
  for_each_weight(weights, [&](const WeightRef& r, bool lookup_table) {
    if (!r.present()) return;
    total += lookup_table ? dtype_bytes(r.type, r.cols()) : r.bytes();
  });
  // A token reads n_experts_used of each MoE layer's experts, not all of them.
  if (config.moe())
    for (const DecoderLayer& l : weights.layers)
      for (const WeightRef* r : {&l.w_gate, &l.w_up, &l.w_down})
        total -= r->bytes() / config.n_experts * (config.n_experts - config.n_experts_used);
  // A tied head reads the whole embedding matrix once per token, besides the one looked-up row.
  if (weights.output.present() && weights.output.data == weights.tok_embd.data)
    total += weights.output.bytes();
  return total;
}

int64_t DecoderModel::total_weight_bytes() const {
  int64_t total = 0;
  for_each_weight(weights, [&](const WeightRef& r, bool) {
    if (r.present()) total += r.bytes();
  });
  return total;
}

DecoderModel load_decoder(const std::string& path, const DecoderLoadOptions& opts) {
  TS_CHECK(std::filesystem::exists(path), "[model] ", path, ": no such file or folder");
  return std::filesystem::is_directory(path) ? load_decoder_hf(path)
                                             : load_decoder_gguf(path, opts);
}

int64_t use_cpu_layout(DecoderModel& m) {
  DecoderWeights& w = m.weights;
  int64_t bytes = 0;
  // Matrices already rearranged, by their first byte: a second view of the same bytes (a file
  // may name one tensor twice) takes the new type instead of rearranging them again.
  std::map<const void*, WeightRef> done;
  auto rearrange = [&](WeightRef& r) {
    if (!r.present() || r.shape.rank() != 2) return;
    if (const auto it = done.find(r.data); it != done.end()) {
      TS_CHECK(it->second.shape == r.shape && plain_type(it->second.type) == r.type, "[model] ",
               m.source, ": two weight matrices of different shapes or types share their bytes");
      r.type = it->second.type;
      return;
    }
    const DType t = ops::cpu_preferred_layout(r.type, r.rows());
    if (t == r.type) return;
    // The loaders' buffers are writable; WeightRef views them as const for everyone else.
    interleave_rows(r.type, const_cast<void*>(r.data), r.rows(), r.cols());
    r.type = t;
    bytes += r.bytes();
    done.emplace(r.data, r);
  };
  // The token embedding too: the engine looks its rows up through ops::dequantize_row, which
  // reads every layout, and a tied head is the same bytes.
  rearrange(w.tok_embd);
  // A MoE layer's experts are read as row slices of the stacked matrices: every expert must
  // start on a row group of the layout (8 rows, 16 for f16x16).
  const DecoderConfig& c = m.config;
  const bool slices_whole = !c.moe() || (c.d_ff % 16 == 0 && c.d_model % 16 == 0);
  for (DecoderLayer& l : w.layers)
    for (WeightRef* r : l.matrices())
      if (slices_whole || (r != &l.w_gate && r != &l.w_up && r != &l.w_down)) rearrange(*r);
  rearrange(w.output);
  return bytes;
}

}  // namespace tessera::model
