// Tiny random decoder models built in memory for engine tests, and a plain float64 forward pass
// over a whole sequence (no cache, no paging, no quantization) to check the engine against.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "core/rng.h"
#include "model/decoder.h"

namespace tessera::test {

// n token ids drawn uniformly from [0, vocab), deterministic for a seed.
inline std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
  return t;
}

struct TinyOptions {
  model::DecoderArch arch = model::DecoderArch::llama;
  int64_t layers = 2, width = 32, heads = 4, kv_heads = 2, ffn = 48, vocab = 64, ctx = 128;
  bool tied = false, qkv_bias = false;
  bool qk_norm = false;  // Qwen3's per-head q/k norms
  int64_t head_dim = 0;  // 0: width / heads (Qwen3 sets it apart)
  // Gemma 3's layer: q/k norms, post-norms, GeGLU, scaled embeddings, an attention scale apart
  // from 1/sqrt(head_dim), and local layers (every layer but each third) over a window of 5
  // positions with their own RoPE base, the global ones with linear scaling.
  bool gemma3 = false;
  ops::RopeLayout rope_layout = ops::RopeLayout::half;
  // Mixture of experts: `experts` SwiGLU experts of width ffn, `experts_used` per token, their
  // weights renormalized with expert_norm (Mixtral, Qwen3-MoE) or not (OLMoE, which also
  // normalizes q and k as whole vectors: qk_norm_whole).
  int64_t experts = 0, experts_used = 2;
  int64_t nope_every = 0;  // SmolLM3: layers l with (l + 1) % nope_every == 0 have no RoPE
  // LongRoPE (Phi-3.5): short and long per-pair factors drawn in [1, 4), the pretrained length
  // 32 positions, cos and sin scaled by 1.3.
  bool longrope = false;
  bool expert_norm = true, qk_norm_whole = false;
  uint64_t seed = 1;
};

// Owns f32 weights drawn from N(0, 0.3^2) (norm weights around 1).
inline model::DecoderModel make_tiny_model(const TinyOptions& o) {
  using model::WeightRef;
  model::DecoderModel m;
  model::DecoderConfig& c = m.config;
  c.arch = o.arch;
  c.name = "tiny";
  c.n_layers = o.layers;
  c.d_model = o.width;
  c.n_heads = o.heads;
  c.n_kv_heads = o.arch == model::DecoderArch::gpt2 ? o.heads : o.kv_heads;
  c.head_dim = o.head_dim > 0 ? o.head_dim : o.width / o.heads;
  c.qk_norm = o.qk_norm;
  c.d_ff = o.ffn;
  c.vocab = o.vocab;
  c.max_ctx = o.ctx;
  c.norm_eps = 1e-5f;
  c.rope_theta = 10000;
  c.rope_dim = c.head_dim;
  c.rope_layout = o.rope_layout;
  c.tied_embeddings = o.tied;
  c.qkv_bias = o.qkv_bias || o.arch == model::DecoderArch::gpt2;
  if (o.nope_every > 0)
    for (int64_t l = 0; l < c.n_layers; ++l) c.nope_layers.push_back((l + 1) % o.nope_every == 0);
  if (o.longrope) {
    Rng frng(o.seed + 99);
    c.rope_scaling = model::RopeScaling::longrope;
    c.rope_original_max_ctx = 32;
    c.rope_attn_factor = 1.3;
    for (int64_t i = 0; i < c.rope_dim / 2; ++i) {
      c.rope_freq_divisors.push_back(1.0f + 3.0f * static_cast<float>(frng.uniform()));
      c.rope_long_divisors.push_back(1.0f + 3.0f * static_cast<float>(frng.uniform()));
    }
  }
  c.n_experts = o.experts;
  c.n_experts_used = o.experts > 0 ? o.experts_used : 0;
  c.expert_norm = o.expert_norm;
  c.qk_norm_whole = o.qk_norm_whole;
  if (o.qk_norm_whole) c.qk_norm = true;
  if (o.gemma3) {
    c.qk_norm = c.post_norms = true;
    c.mlp_act = ops::GluAct::gelu_tanh;
    c.embed_scale = std::sqrt(static_cast<float>(c.d_model));
    c.attn_scale = 1.0 / std::sqrt(1.5 * static_cast<double>(c.head_dim));
    c.sliding_window = 5;
    c.rope_theta = 1e6;
    c.rope_theta_local = 10000;
    c.rope_scaling = model::RopeScaling::linear;
    c.rope_factor = 4;
    for (int64_t l = 0; l < c.n_layers; ++l) c.local_layers.push_back((l + 1) % 3 != 0);
  }
  auto store = std::make_shared<std::vector<std::vector<float>>>();
  m.owners.push_back(store);
  Rng rng(o.seed);
  store->reserve(64 + 32 * static_cast<size_t>(o.layers));
  auto tensor = [&](Shape shape, float scale, float offset = 0) {
    std::vector<float> v(static_cast<size_t>(shape.numel()));
    for (float& x : v) x = offset + scale * rng.normal();
    store->push_back(std::move(v));
    return WeightRef{store->back().data(), DType::f32, shape};
  };
  const int64_t C = c.d_model, F = c.d_ff, Q = c.q_dim(), KV = c.kv_dim();
  const int64_t E = std::max<int64_t>(c.n_experts, 1);  // stacked experts' count (1: dense)
  const bool gpt2 = o.arch == model::DecoderArch::gpt2;
  model::DecoderWeights& w = m.weights;
  w.tok_embd = tensor(Shape({c.vocab, C}), 0.5f);
  if (gpt2) w.pos_embd = tensor(Shape({c.max_ctx, C}), 0.1f);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    model::DecoderLayer L;
    L.attn_norm = tensor(Shape({C}), 0.1f, 1.0f);
    L.ffn_norm = tensor(Shape({C}), 0.1f, 1.0f);
    L.wq = tensor(Shape({Q, C}), 0.3f);
    L.wk = tensor(Shape({KV, C}), 0.3f);
    L.wv = tensor(Shape({KV, C}), 0.3f);
    L.wo = tensor(Shape({C, Q}), 0.3f);
    L.w_up = tensor(Shape({E * F, C}), 0.3f);
    L.w_down = tensor(Shape({E * C, F}), 0.3f);
    if (c.moe()) L.ffn_router = tensor(Shape({E, C}), 0.3f);
    if (c.qk_norm) {
      L.q_norm = tensor(Shape({c.qk_norm_whole ? Q : c.head_dim}), 0.2f, 1.0f);
      L.k_norm = tensor(Shape({c.qk_norm_whole ? KV : c.head_dim}), 0.2f, 1.0f);
    }
    if (c.post_norms) {
      L.post_attn_norm = tensor(Shape({C}), 0.1f, 1.0f);
      L.post_ffn_norm = tensor(Shape({C}), 0.1f, 1.0f);
    }
    if (c.qkv_bias) {
      L.bq = tensor(Shape({Q}), 0.1f);
      L.bk = tensor(Shape({KV}), 0.1f);
      L.bv = tensor(Shape({KV}), 0.1f);
    }
    if (gpt2) {
      L.attn_norm_b = tensor(Shape({C}), 0.1f);
      L.ffn_norm_b = tensor(Shape({C}), 0.1f);
      L.bo = tensor(Shape({C}), 0.1f);
      L.b_up = tensor(Shape({F}), 0.1f);
      L.b_down = tensor(Shape({C}), 0.1f);
    } else {
      L.w_gate = tensor(Shape({E * F, C}), 0.3f);
    }
    w.layers.push_back(L);
  }
  w.out_norm = tensor(Shape({C}), 0.1f, 1.0f);
  if (gpt2) w.out_norm_b = tensor(Shape({C}), 0.1f);
  w.output = o.tied ? w.tok_embd : tensor(Shape({c.vocab, C}), 0.3f);
  c.validate("tiny");
  return m;
}

// Logits (T, V) of every position of `tokens`, computed directly in double; with hidden_states,
// the final norm's output (T, C) instead (what the head reads).
// run_ctx: the context the engine under test is sized for (LongRoPE picks its factors by it).
inline std::vector<double> reference_logits(const model::DecoderModel& m,
                                            const std::vector<int32_t>& tokens,
                                            bool hidden_states = false, int64_t run_ctx = 0) {
  const model::DecoderConfig& c = m.config;
  const bool gpt2 = c.arch == model::DecoderArch::gpt2;
  const auto T = static_cast<int64_t>(tokens.size());
  const int64_t C = c.d_model, H = c.n_heads, Hkv = c.n_kv_heads, D = c.head_dim, F = c.d_ff;
  auto f = [](const model::WeightRef& r) { return static_cast<const float*>(r.data); };
  using Vec = std::vector<double>;
  auto linear = [&](const Vec& x, const model::WeightRef& w, const model::WeightRef& b) {
    const int64_t N = w.rows(), K = w.cols();
    Vec y(static_cast<size_t>(N));
    for (int64_t n = 0; n < N; ++n) {
      double s = b.present() ? f(b)[n] : 0;
      for (int64_t k = 0; k < K; ++k) s += f(w)[n * K + k] * x[static_cast<size_t>(k)];
      y[static_cast<size_t>(n)] = s;
    }
    return y;
  };
  auto norm = [&](const Vec& x, const model::WeightRef& w, const model::WeightRef& b) {
    Vec y(x.size());
    double mean = 0, var = 0;
    if (gpt2) {
      for (double v : x) mean += v;
      mean /= C;
    }
    for (double v : x) var += (v - mean) * (v - mean);
    var /= C;
    const double r = 1 / std::sqrt(var + c.norm_eps);
    for (int64_t i = 0; i < C; ++i)
      y[static_cast<size_t>(i)] =
          (x[static_cast<size_t>(i)] - mean) * r * f(w)[i] + (b.present() ? f(b)[i] : 0);
    return y;
  };
  // Qwen3: each head's D values RMS-normalized with weights w (D); OLMoE: the whole vector.
  auto head_norm = [&](Vec& v, int64_t heads, const model::WeightRef& w) {
    const auto n = static_cast<int64_t>(v.size());
    const int64_t Dn = c.qk_norm_whole ? n : D, hn = c.qk_norm_whole ? 1 : heads;
    for (int64_t h = 0; h < hn; ++h) {
      double ss = 0;
      for (int64_t e = 0; e < Dn; ++e) ss += v[h * Dn + e] * v[h * Dn + e];
      const double r = 1 / std::sqrt(ss / static_cast<double>(Dn) + c.norm_eps);
      for (int64_t e = 0; e < Dn; ++e) v[h * Dn + e] *= r * f(w)[e];
    }
  };
  // A dense SwiGLU/GeGLU MLP on xn, with matrices gate (F,C), up (F,C), down (C,F) at row
  // offsets of the stacked experts (0 for a dense model).
  auto glu_mlp = [&](const Vec& xn, const model::DecoderLayer& L, int64_t e) {
    Vec hdn(static_cast<size_t>(F));
    for (int64_t i = 0; i < F; ++i) {
      double g = 0, u = 0;
      for (int64_t j = 0; j < C; ++j) {
        g += f(L.w_gate)[(e * F + i) * C + j] * xn[static_cast<size_t>(j)];
        u += f(L.w_up)[(e * F + i) * C + j] * xn[static_cast<size_t>(j)];
      }
      hdn[static_cast<size_t>(i)] =
          c.mlp_act == ops::GluAct::silu
              ? g / (1 + std::exp(-g)) * u
              : 0.5 * g * (1 + std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))) * u;
    }
    Vec y(static_cast<size_t>(C), 0.0);
    for (int64_t i = 0; i < C; ++i)
      for (int64_t j = 0; j < F; ++j)
        y[static_cast<size_t>(i)] += f(L.w_down)[(e * C + i) * F + j] * hdn[static_cast<size_t>(j)];
    return y;
  };
  // Mixture of experts: softmax over the router's logits, the experts_used most probable (the
  // lower id on ties), their probabilities renormalized or not, the experts' outputs so weighted.
  auto moe_mlp = [&](const Vec& xn, const model::DecoderLayer& L) {
    const Vec logit = linear(xn, L.ffn_router, {});
    const int64_t E = c.n_experts;
    double mx = -1e300, sum = 0;
    for (double v : logit) mx = std::max(mx, v);
    for (double v : logit) sum += std::exp(v - mx);
    std::vector<int64_t> order(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) order[static_cast<size_t>(e)] = e;
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return logit[a] > logit[b]; });
    double chosen = 0;
    for (int64_t j = 0; j < c.n_experts_used; ++j) chosen += std::exp(logit[order[j]] - mx) / sum;
    Vec y(static_cast<size_t>(C), 0.0);
    for (int64_t j = 0; j < c.n_experts_used; ++j) {
      const double p = std::exp(logit[order[j]] - mx) / sum;
      const Vec ye = glu_mlp(xn, L, order[j]);
      for (int64_t i = 0; i < C; ++i) y[i] += (c.expert_norm ? p / chosen : p) * ye[i];
    }
    return y;
  };
  std::vector<double> inv_global = model::rope_inv_freqs(c);
  double rope_scale = 1;  // LongRoPE: factors by the run's context, cos and sin scaled
  if (c.rope_scaling == model::RopeScaling::longrope) {
    const std::vector<float>& f =
        run_ctx > c.rope_original_max_ctx ? c.rope_long_divisors : c.rope_freq_divisors;
    for (size_t i = 0; i < inv_global.size(); ++i)
      inv_global[i] = std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / c.rope_dim) / f[i];
    rope_scale = c.rope_attn_factor;
  }
  // Gemma 3's local layers: base rope_theta_local, unscaled (computed here, not by the library).
  std::vector<double> inv_local(static_cast<size_t>(c.rope_dim / 2));
  for (size_t i = 0; i < inv_local.size(); ++i)
    inv_local[i] = std::pow(c.rope_theta_local, -2.0 * static_cast<double>(i) / c.rope_dim);
  const std::vector<double>* inv_now = &inv_global;
  bool rotary = true;  // the current layer's (SmolLM3's no-RoPE layers: false)
  auto rope = [&](Vec& v, int64_t heads, int64_t pos) {
    if (gpt2 || !rotary) return;
    const std::vector<double>& inv = *inv_now;
    const int64_t half = c.rope_dim / 2;
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const bool il = c.rope_layout == ops::RopeLayout::interleaved;
        const int64_t a = h * D + (il ? 2 * i : i), b = h * D + (il ? 2 * i + 1 : i + half);
        const double ang = static_cast<double>(pos) * inv[static_cast<size_t>(i)];
        const double x0 = v[static_cast<size_t>(a)], x1 = v[static_cast<size_t>(b)];
        const double cs = rope_scale * std::cos(ang), sn = rope_scale * std::sin(ang);
        v[static_cast<size_t>(a)] = x0 * cs - x1 * sn;
        v[static_cast<size_t>(b)] = x0 * sn + x1 * cs;
      }
  };
  std::vector<Vec> x(static_cast<size_t>(T), Vec(static_cast<size_t>(C)));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < C; ++i)
      x[t][i] = f(m.weights.tok_embd)[tokens[t] * C + i] * static_cast<double>(c.embed_scale) +
                (gpt2 ? f(m.weights.pos_embd)[t * C + i] : 0);
  // Gemma 3's post-norm: RMSNorm of a branch's output before it joins the stream.
  auto post = [&](Vec v, const model::WeightRef& w) { return c.post_norms ? norm(v, w, {}) : v; };
  for (int64_t layer = 0; layer < c.n_layers; ++layer) {
    const model::DecoderLayer& L = m.weights.layers[static_cast<size_t>(layer)];
    const bool local = !c.local_layers.empty() && c.local_layers[static_cast<size_t>(layer)];
    inv_now = local ? &inv_local : &inv_global;
    rotary = c.nope_layers.empty() || c.nope_layers[static_cast<size_t>(layer)] == 0;
    const int64_t window = c.local_layers.empty() || local ? c.sliding_window : 0;
    const double scale = c.attn_scale > 0 ? c.attn_scale : 1 / std::sqrt(static_cast<double>(D));
    std::vector<Vec> q(T), k(T), v(T);
    for (int64_t t = 0; t < T; ++t) {
      const Vec xn = norm(x[t], L.attn_norm, L.attn_norm_b);
      q[t] = linear(xn, L.wq, L.bq);
      k[t] = linear(xn, L.wk, L.bk);
      v[t] = linear(xn, L.wv, L.bv);
      if (c.qk_norm) {
        head_norm(q[t], H, L.q_norm);
        head_norm(k[t], Hkv, L.k_norm);
      }
      rope(q[t], H, t);
      rope(k[t], Hkv, t);
    }
    for (int64_t t = 0; t < T; ++t) {
      Vec att(static_cast<size_t>(H * D), 0.0);
      for (int64_t h = 0; h < H; ++h) {
        const int64_t g = h / (H / Hkv);
        // Keys outside the sliding window (Mistral v0.1, Gemma 3's local layers) get
        // probability 0.
        const int64_t first = window > 0 ? std::max<int64_t>(0, t + 1 - window) : 0;
        Vec s(static_cast<size_t>(t + 1), -1e300);
        double mx = -1e300, sum = 0;
        for (int64_t j = first; j <= t; ++j) {
          double d = 0;
          for (int64_t e = 0; e < D; ++e) d += q[t][h * D + e] * k[j][g * D + e];
          s[j] = d * scale;
          mx = std::max(mx, s[j]);
        }
        for (double& e : s) sum += (e = e == -1e300 ? 0.0 : std::exp(e - mx));
        for (int64_t j = 0; j <= t; ++j)
          for (int64_t e = 0; e < D; ++e) att[h * D + e] += s[j] / sum * v[j][g * D + e];
      }
      const Vec o = post(linear(att, L.wo, L.bo), L.post_attn_norm);
      for (int64_t i = 0; i < C; ++i) x[t][i] += o[i];
      const Vec xn = norm(x[t], L.ffn_norm, L.ffn_norm_b);
      if (c.moe()) {
        const Vec dn = moe_mlp(xn, L);
        for (int64_t i = 0; i < C; ++i) x[t][i] += dn[i];
        continue;
      }
      Vec hdn(static_cast<size_t>(F));
      const Vec up = linear(xn, L.w_up, L.b_up);
      if (gpt2) {
        for (int64_t i = 0; i < F; ++i) {
          const double u = up[i];
          hdn[i] = 0.5 * u * (1 + std::tanh(0.7978845608028654 * (u + 0.044715 * u * u * u)));
        }
      } else {
        const Vec gate = linear(xn, L.w_gate, {});
        for (int64_t i = 0; i < F; ++i) {
          const double g = gate[i];
          hdn[i] = c.mlp_act == ops::GluAct::silu
                       ? g / (1 + std::exp(-g)) * up[i]
                       : 0.5 * g *
                             (1 + std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))) *
                             up[i];
        }
      }
      const Vec dn = post(linear(hdn, L.w_down, L.b_down), L.post_ffn_norm);
      for (int64_t i = 0; i < C; ++i) x[t][i] += dn[i];
    }
  }
  std::vector<double> logits;
  for (int64_t t = 0; t < T; ++t) {
    Vec l = norm(x[t], m.weights.out_norm, m.weights.out_norm_b);
    if (!hidden_states) l = linear(l, m.weights.output, {});
    logits.insert(logits.end(), l.begin(), l.end());
  }
  return logits;
}

}  // namespace tessera::test
