// Decoder model writer for GGUF with llama.cpp's names and metadata (q/k rows permuted for
// interleaved RoPE, GPT-2 q/k/v fused), and the helpers both writers share.
#include "model/decoder_save.h"

#include <cmath>
#include <cstring>
#include <list>
#include <vector>

#include "core/error.h"
#include "model/decoder_save_impl.h"
#include "model/layer_tensors.h"

namespace tessera::model {
namespace save_detail {

std::vector<int64_t> rope_row_source(int64_t heads, int64_t head_dim, int64_t rope_dim,
                                     bool to_interleaved) {
  std::vector<int64_t> src(static_cast<size_t>(heads * head_dim));
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t base = h * head_dim;
    for (int64_t r = 0; r < head_dim; ++r) src[static_cast<size_t>(base + r)] = base + r;
    for (int64_t i = 0; i < rope_dim / 2; ++i) {
      const int64_t half_a = base + i, half_b = base + rope_dim / 2 + i;
      const int64_t inter_a = base + 2 * i, inter_b = base + 2 * i + 1;
      if (to_interleaved) {
        src[static_cast<size_t>(inter_a)] = half_a;
        src[static_cast<size_t>(inter_b)] = half_b;
      } else {
        src[static_cast<size_t>(half_a)] = inter_a;
        src[static_cast<size_t>(half_b)] = inter_b;
      }
    }
  }
  return src;
}

namespace {
// Bytes of one row (a matrix row, or one element of a vector).
int64_t row_bytes(const WeightRef& w) {
  return w.shape.rank() == 2 ? dtype_bytes(w.type, w.cols()) : dtype_bytes(w.type, 1);
}
}  // namespace

std::vector<uint8_t> gather_rows(const WeightRef& w, const std::vector<int64_t>& src) {
  const int64_t rb = row_bytes(w);
  TS_CHECK(static_cast<int64_t>(src.size()) == w.shape[0], "[save] row permutation of ", src.size(),
           " rows for a tensor of shape ", w.shape.str());
  std::vector<uint8_t> out(static_cast<size_t>(rb) * src.size());
  const auto* base = static_cast<const uint8_t*>(w.data);
  for (size_t r = 0; r < src.size(); ++r)
    std::memcpy(out.data() + r * rb, base + src[r] * rb, static_cast<size_t>(rb));
  return out;
}

std::vector<float> as_f32(const WeightRef& w) {
  std::vector<float> out(static_cast<size_t>(w.shape.numel()));
  to_f32(w.type, w.data, out.data(), w.shape.numel());
  return out;
}

std::vector<float> transpose(const std::vector<float>& src, int64_t rows, int64_t cols) {
  std::vector<float> dst(src.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      dst[static_cast<size_t>(c * rows + r)] = src[static_cast<size_t>(r * cols + c)];
  return dst;
}

void require(const WeightRef& w, const std::string& what, const std::string& path) {
  TS_CHECK(w.present(), "[save] ", path, ": the model has no ", what, " weight");
}

}  // namespace save_detail

namespace {

using namespace save_detail;

// llama.cpp's general.file_type for the type most matrices use.
uint32_t gguf_file_type(DType t) {
  const std::string_view n = dtype_name(t);
  if (n == "f16") return 1;
  if (n == "q4_0") return 2;
  if (n == "q4_1") return 3;
  if (n == "q8_0") return 7;
  if (n == "q5_0") return 8;
  if (n == "q5_1") return 9;
  if (n == "q2_k") return 10;
  if (n == "q3_k") return 12;  // Q3_K_M
  if (n == "q4_k") return 15;  // Q4_K_M
  if (n == "q5_k") return 17;  // Q5_K_M
  if (n == "q6_k") return 18;
  if (n == "bf16") return 32;
  return 0;  // all f32
}

// Adds tensors to a GgufWriter, holding converted copies until write().
class GgufTensorSink {
 public:
  explicit GgufTensorSink(formats::GgufWriter& w) : w_(w) {}
  void raw(const std::string& name, const WeightRef& r) {
    w_.add_tensor(name, r.type, r.shape, r.data);
  }
  void bytes(const std::string& name, DType t, const Shape& s, std::vector<uint8_t> b) {
    keep_.push_back(std::move(b));
    w_.add_tensor(name, t, s, keep_.back().data());
  }
  // Norms and biases are f32 in GGUF files (the loader requires it).
  void f32(const std::string& name, const WeightRef& r) {
    if (r.type == DType::f32) return raw(name, r);
    std::vector<float> v = as_f32(r);
    std::vector<uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    bytes(name, DType::f32, r.shape, std::move(b));
  }
  void f32_values(const std::string& name, const std::vector<float>& v) {
    std::vector<uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    bytes(name, DType::f32, Shape({static_cast<int64_t>(v.size())}), std::move(b));
  }

 private:
  formats::GgufWriter& w_;
  std::list<std::vector<uint8_t>> keep_;
};

using L = DecoderLayer;

// One layer's tensors under their GGUF names (layer_tensors.h): vectors (norms, biases, the
// router) as f32, matrices as stored.
struct GgufLayerSink {
  GgufTensorSink& s;
  const DecoderLayer& l;
  std::string p;  // "blk.{i}."
  const std::string& path;

  std::string name(WeightRef L::*m) const { return p + layer_tensor(m).gguf; }
  void need(WeightRef L::*m) const { require(l.*m, p + tensor_module(layer_tensor(m).gguf), path); }
  void put(WeightRef L::*m) const {
    if (layer_tensor(m).kind == LayerTensorKind::matrix) return s.raw(name(m), l.*m);
    s.f32(name(m), l.*m);
  }
};

void set_u32(formats::GgufWriter& w, const std::string& key, int64_t v) {
  w.set(key, static_cast<uint32_t>(v));  // validate() bounds every dimension far below 2^32
}

// The layer options a GGUF architecture implies (read_config sets them from the name alone):
// a model whose options differ from its family's cannot be written without changing it.
void check_gguf_family(const DecoderConfig& c, const std::string& arch, const std::string& path) {
  if (arch == "gpt2") return;
  const bool gemma3 = arch == "gemma3";
  const bool fits = gemma3 ? c.qk_norm && c.mlp_act == ops::GluAct::gelu_tanh &&
                                 !c.local_layers.empty() && !c.moe() &&
                                 c.embed_scale == std::sqrt(static_cast<float>(c.d_model))
                           : c.mlp_act == ops::GluAct::silu && c.local_layers.empty() &&
                                 c.embed_scale == 1.0f && c.attn_scale == 0.0;
  // SmolLM3's files carry no pattern: llama.cpp takes every fourth layer as the one without RoPE.
  bool nope_fits = arch == "smollm3" || c.nope_layers.empty();
  if (arch == "smollm3")
    for (int64_t l = 0; l < c.n_layers; ++l)
      nope_fits = nope_fits && (c.nope_layers[static_cast<size_t>(l)] != 0) == ((l + 1) % 4 == 0);
  TS_CHECK(nope_fits, "[save] ", path,
           ": the model's layers without RoPE are not every fourth layer, the only pattern a GGUF "
           "'smollm3' file can hold");
  TS_CHECK(fits, "[save] ", path, ": the model's layer options (q/k norms ", c.qk_norm,
           ", post-norms ", c.post_norms, ", activation ", ops::glu_act_name(c.mlp_act),
           ", embedding scale ", c.embed_scale, ", local layers ", !c.local_layers.empty(),
           ") are not those of a GGUF '", arch, "' file");
}

void write_gguf_metadata(const DecoderModel& m, formats::GgufWriter& w, const std::string& arch) {
  const DecoderConfig& c = m.config;
  w.set("general.architecture", arch);
  w.set("general.name", c.name.empty() ? std::string("tessera") : c.name);
  const std::string a = arch + ".";
  set_u32(w, a + "block_count", c.n_layers);
  set_u32(w, a + "context_length", c.max_ctx);
  set_u32(w, a + "embedding_length", c.d_model);
  set_u32(w, a + "feed_forward_length", c.d_ff);
  set_u32(w, a + "attention.head_count", c.n_heads);
  set_u32(w, a + "attention.head_count_kv", c.n_kv_heads);
  set_u32(w, a + "attention.key_length", c.head_dim);
  set_u32(w, a + "attention.value_length", c.head_dim);
  set_u32(w, a + "vocab_size", c.vocab);
  if (c.arch == DecoderArch::gpt2) {
    w.set(a + "attention.layer_norm_epsilon", c.norm_eps);
    return;
  }
  w.set(a + "attention.layer_norm_rms_epsilon", c.norm_eps);
  if (c.sliding_window > 0) set_u32(w, a + "attention.sliding_window", c.sliding_window);
  if (arch == "gemma3") {
    // What llama.cpp fixes for gemma3 (local RoPE base, the pattern of local layers, the
    // attention scale) is written out, so that another model's values are not lost.
    w.set(a + "rope.freq_base_swa", static_cast<float>(c.rope_theta_local));
    w.set(a + "attention.scale", c.score_scale());
    std::vector<bool> local(c.local_layers.begin(), c.local_layers.end());
    w.set(a + "attention.sliding_window_pattern",
          formats::gguf_array(formats::GgufType::boolean, local));
  }
  if (c.moe()) {
    set_u32(w, a + "expert_count", c.n_experts);
    set_u32(w, a + "expert_used_count", c.n_experts_used);
    set_u32(w, a + "expert_feed_forward_length", c.d_ff);
    w.set(a + "expert_weights_norm", c.expert_norm);
  }
  w.set(a + "rope.freq_base", static_cast<float>(c.rope_theta));
  set_u32(w, a + "rope.dimension_count", c.rope_dim);
  if (c.rope_scaling == RopeScaling::linear) {
    w.set(a + "rope.scaling.type", "linear");
    w.set(a + "rope.scaling.factor", static_cast<float>(c.rope_factor));
  } else if (c.rope_scaling == RopeScaling::llama3) {
    // llama.cpp reads Llama 3 scaling from rope_freqs.weight only, and takes rope.scaling.factor
    // as a linear factor, so the parameters go under names it ignores.
    w.set(a + "rope.scaling.llama3_factor", static_cast<float>(c.rope_factor));
    w.set(a + "rope.scaling.low_freq_factor", static_cast<float>(c.rope_low_freq_factor));
    w.set(a + "rope.scaling.high_freq_factor", static_cast<float>(c.rope_high_freq_factor));
    set_u32(w, a + "rope.scaling.original_context_length", c.rope_original_max_ctx);
  } else if (c.rope_scaling == RopeScaling::yarn) {
    // llama.cpp scales cos and sin by 0.1 ln(factor) + 1 itself: attn_factor is the rest.
    w.set(a + "rope.scaling.type", "yarn");
    w.set(a + "rope.scaling.factor", static_cast<float>(c.rope_factor));
    set_u32(w, a + "rope.scaling.original_context_length", c.rope_original_max_ctx);
    const double mscale = c.rope_factor > 1 ? 0.1 * std::log(c.rope_factor) + 1 : 1.0;
    w.set(a + "rope.scaling.attn_factor", static_cast<float>(c.rope_attn_factor / mscale));
    w.set(a + "rope.scaling.yarn_beta_fast", static_cast<float>(c.yarn_beta_fast));
    w.set(a + "rope.scaling.yarn_beta_slow", static_cast<float>(c.yarn_beta_slow));
  } else if (c.rope_scaling == RopeScaling::longrope) {
    set_u32(w, a + "rope.scaling.original_context_length", c.rope_original_max_ctx);
    w.set(a + "rope.scaling.attn_factor", static_cast<float>(c.rope_attn_factor));
  }
}

// rope_freqs.weight: per-pair divisors of the base frequencies, as llama.cpp applies them.
// Llama 3 scaling is turned into divisors (times any the model already has); otherwise the
// model's own divisors, if any, are written unchanged. Linear scaling is metadata instead.
std::vector<float> rope_divisors(const DecoderConfig& c) {
  if (c.rope_scaling != RopeScaling::llama3) return c.rope_freq_divisors;
  const std::vector<double> inv = rope_inv_freqs(c);
  std::vector<float> div(inv.size());
  for (size_t i = 0; i < inv.size(); ++i) {
    const double unscaled = std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / c.rope_dim);
    div[i] = static_cast<float>(unscaled / inv[i]);
  }
  return div;
}

void write_gguf_llama(const DecoderModel& m, GgufTensorSink& s, const std::string& path,
                      const std::string& arch) {
  const DecoderConfig& c = m.config;
  const DecoderWeights& w = m.weights;
  // phi3 files keep the rotate-half order, and hold gate and up as one ffn_up of 2F rows.
  const bool phi3 = arch == "phi3";
  const bool permute = c.rope_layout == ops::RopeLayout::half && !c.qk_norm && !phi3;
  const auto q_order = rope_row_source(c.n_heads, c.head_dim, c.rope_dim, true);
  const auto k_order = rope_row_source(c.n_kv_heads, c.head_dim, c.rope_dim, true);
  auto qk = [&](const std::string& name, const WeightRef& r, const std::vector<int64_t>& order,
                bool vector) {
    if (!permute) return vector ? s.f32(name, r) : s.raw(name, r);
    if (!vector) return s.bytes(name, r.type, r.shape, gather_rows(r, order));
    std::vector<float> v = as_f32(r);
    const WeightRef f{v.data(), DType::f32, r.shape};
    s.bytes(name, DType::f32, r.shape, gather_rows(f, order));
  };
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const DecoderLayer& l = w.layers[i];
    const GgufLayerSink ls{s, l, gguf_layer_prefix(static_cast<int64_t>(i)), path};
    // q and k rows (and biases) in the file's RoPE order.
    auto put = [&](WeightRef L::*m) {
      const LayerTensor& t = layer_tensor(m);
      if (t.rope == RopeRows::none) return ls.put(m);
      qk(ls.name(m), l.*m, t.rope == RopeRows::q ? q_order : k_order,
         t.kind != LayerTensorKind::matrix);
    };
    for (WeightRef L::*m : {&L::attn_norm, &L::ffn_norm, &L::wq, &L::wk, &L::wv, &L::wo, &L::w_gate,
                            &L::w_up, &L::w_down})
      ls.need(m);
    // The order llama.cpp's converter writes, which keeps our files byte for byte as they were.
    for (WeightRef L::*m : {&L::attn_norm, &L::wq, &L::wk, &L::wv, &L::wo}) put(m);
    for (WeightRef L::*m : {&L::bq, &L::bk, &L::bv, &L::bo})
      if ((l.*m).present()) put(m);
    std::vector<WeightRef L::*> norms;
    if (c.qk_norm) norms = {&L::q_norm, &L::k_norm};
    if (c.post_norms) norms.insert(norms.end(), {&L::post_attn_norm, &L::post_ffn_norm});
    for (WeightRef L::*m : norms) ls.need(m);
    for (WeightRef L::*m : norms) put(m);
    put(&L::ffn_norm);
    if (c.moe()) {  // the stacked experts as llama.cpp's 3-D tensors (E, rows, cols)
      const int64_t E = c.n_experts;
      ls.need(&L::ffn_router);
      put(&L::ffn_router);
      for (WeightRef L::*m : {&L::w_gate, &L::w_up, &L::w_down}) {
        WeightRef e = l.*m;
        e.shape = Shape({E, e.rows() / E, e.cols()});
        s.raw(ls.p + layer_tensor(m).gguf_experts, e);
      }
      continue;
    }
    if (phi3) {
      TS_CHECK(l.w_gate.type == l.w_up.type, "[save] ", path, ": ", ls.name(&L::w_gate), " and ",
               ls.name(&L::w_up), " differ in type; a phi3 file holds them as one tensor");
      std::vector<uint8_t> gate_up;
      for (const WeightRef* r : {&l.w_gate, &l.w_up}) {
        const auto* b = static_cast<const uint8_t*>(r->data);
        gate_up.insert(gate_up.end(), b, b + r->bytes());
      }
      s.bytes(ls.name(&L::w_up), l.w_up.type, Shape({2 * c.d_ff, c.d_model}), std::move(gate_up));
    } else {
      put(&L::w_gate);
      put(&L::w_up);
    }
    put(&L::w_down);
  }
  if (c.rope_scaling == RopeScaling::longrope) {
    s.f32_values("rope_factors_short.weight", c.rope_freq_divisors);
    s.f32_values("rope_factors_long.weight", c.rope_long_divisors);
    return;
  }
  const std::vector<float> div = rope_divisors(c);
  if (!div.empty()) s.f32_values("rope_freqs.weight", div);
}

void write_gguf_gpt2(const DecoderModel& m, GgufTensorSink& s, const std::string& path) {
  const DecoderWeights& w = m.weights;
  require(w.pos_embd, "position embedding", path);
  s.raw("position_embd.weight", w.pos_embd);
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const DecoderLayer& l = w.layers[i];
    const GgufLayerSink ls{s, l, gguf_layer_prefix(static_cast<int64_t>(i)), path};
    for (WeightRef L::*m :
         {&L::attn_norm, &L::attn_norm_b, &L::wq, &L::wk, &L::wv, &L::bq, &L::bk, &L::bv, &L::wo,
          &L::bo, &L::ffn_norm, &L::ffn_norm_b, &L::w_up, &L::b_up, &L::w_down, &L::b_down})
      ls.need(m);
    ls.put(&L::attn_norm);
    ls.put(&L::attn_norm_b);
    // attn_qkv (3C, C) holds the q, k and v rows in that order; mixed types fuse as f32.
    const int64_t C = m.config.d_model;
    const bool same = l.wq.type == l.wk.type && l.wq.type == l.wv.type;
    const DType t = same ? l.wq.type : DType::f32;
    std::vector<uint8_t> qkv;
    for (const WeightRef* r : {&l.wq, &l.wk, &l.wv}) {
      if (same) {
        const auto* b = static_cast<const uint8_t*>(r->data);
        qkv.insert(qkv.end(), b, b + r->bytes());
      } else {
        const std::vector<float> v = as_f32(*r);
        const auto* b = reinterpret_cast<const uint8_t*>(v.data());
        qkv.insert(qkv.end(), b, b + v.size() * 4);
      }
    }
    s.bytes(ls.p + kFusedQkv.gguf, t, Shape({3 * C, C}), std::move(qkv));
    std::vector<float> bias;
    for (const WeightRef* r : {&l.bq, &l.bk, &l.bv}) {
      const std::vector<float> v = as_f32(*r);
      bias.insert(bias.end(), v.begin(), v.end());
    }
    s.f32_values(ls.p + kFusedQkvBias.gguf, bias);
    for (WeightRef L::*m :
         {&L::wo, &L::bo, &L::ffn_norm, &L::ffn_norm_b, &L::w_up, &L::b_up, &L::w_down, &L::b_down})
      ls.put(m);
  }
  require(w.out_norm_b, "output_norm.bias", path);
  s.f32("output_norm.bias", w.out_norm_b);
}

}  // namespace

void save_decoder_gguf(const DecoderModel& m, const std::string& path,
                       const std::function<void(formats::GgufWriter&)>& extra) {
  const DecoderConfig& c = m.config;
  c.validate(path);
  const DecoderWeights& w = m.weights;
  TS_CHECK(static_cast<int64_t>(w.layers.size()) == c.n_layers, "[save] ", path, ": model has ",
           w.layers.size(), " layers, config says ", c.n_layers);
  const bool gpt2 = c.arch == DecoderArch::gpt2;
  formats::GgufWriter writer;
  // Qwen3 and Gemma 3 files keep q/k in the rotate-half order (llama.cpp rotates them
  // NeoX-style); Gemma 3 is the family with post-norms. Mixtures of experts: OLMoE normalizes q
  // and k as whole vectors, Qwen3-MoE per head, Mixtral (llama) not at all.
  const std::string arch = gpt2                                      ? "gpt2"
                           : c.post_norms                            ? "gemma3"
                           : c.qk_norm_whole                         ? "olmoe"
                           : c.qk_norm && c.moe()                    ? "qwen3moe"
                           : c.qk_norm                               ? "qwen3"
                           : !c.nope_layers.empty()                  ? "smollm3"
                           : c.rope_scaling == RopeScaling::longrope ? "phi3"
                                                                     : "llama";
  check_gguf_family(c, arch, path);
  write_gguf_metadata(m, writer, arch);
  if (!w.layers.empty() && w.layers[0].wq.present()) {
    const DType t = w.layers[0].wq.type;
    writer.set("general.file_type", gguf_file_type(t));
    if (traits(t).block_elems > 1) writer.set("general.quantization_version", uint32_t{2});
  }
  GgufTensorSink sink(writer);
  require(w.tok_embd, "token embedding", path);
  sink.raw("token_embd.weight", w.tok_embd);
  if (gpt2)
    write_gguf_gpt2(m, sink, path);
  else
    write_gguf_llama(m, sink, path, arch);
  require(w.out_norm, "output_norm", path);
  sink.f32("output_norm.weight", w.out_norm);
  // A tied head is written once, as the embedding; the loader ties when output is absent.
  if (!c.tied_embeddings) {
    require(w.output, "output", path);
    sink.raw("output.weight", w.output);
  }
  if (extra) extra(writer);
  writer.write(path);
}

}  // namespace tessera::model
