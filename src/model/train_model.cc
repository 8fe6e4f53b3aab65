// The training model's setup (GPT-2 or Llama): the parameter table (Hugging Face names and order),
// initialization, the activation-arena plan for each recompute policy, the bf16 weight copy, and
// the FLOP count.
#include "model/train_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include "core/error.h"
#include "core/rng.h"
#include "model/train_model_impl.h"
#include "ops/backend.h"
#include "ops/ops.h"

namespace tessera::model {

TrainModel::TrainModel(const TrainConfig& cfg, const ops::Context& ctx)
    : cfg_(cfg), ctx_(ctx), impl_(std::make_unique<Impl>(*this)) {
  cfg_.validate();
  ops::require_device(ctx_, "the training model");
  const int64_t C = cfg_.n_embd, L = cfg_.n_layer, F = cfg_.ff(), Vp = cfg_.padded_vocab_size;
  Impl& im = *impl_;
  // The token embedding (and an untied head) has Vp rows; rows >= V are padding so the head's
  // product has an aligned N. They stay zero: init_weights zeroes them, no token selects them,
  // their logits are masked by softmax_xent (gradient 0) and forward_backward re-zeroes their
  // gradient rows.
  if (cfg_.arch == DecoderArch::gpt2) {  // Hugging Face GPT-2's names and order
    im.wte = table_.add("wte.weight", {Vp, C});
    im.wpe = table_.add("wpe.weight", {cfg_.max_seq, C});
    using DL = DecoderLayer;
    for (int64_t l = 0; l < L; ++l) {
      const std::string h = hf_gpt2_layer_prefix(l);
      auto add = [&](WeightRef DL::*m, Shape shape) {
        return table_.add(h + layer_tensor(m).hf_gpt2, shape);
      };
      add(&DL::attn_norm, {C});
      add(&DL::attn_norm_b, {C});
      table_.add(h + kFusedQkv.hf_gpt2, {3 * C, C});
      table_.add(h + kFusedQkvBias.hf_gpt2, {3 * C});
      add(&DL::wo, {C, C});
      add(&DL::bo, {C});
      add(&DL::ffn_norm, {C});
      add(&DL::ffn_norm_b, {C});
      add(&DL::w_up, {F, C});
      add(&DL::b_up, {F});
      add(&DL::w_down, {C, F});
      add(&DL::b_down, {C});
    }
    table_.add("ln_f.weight", {C});
    table_.add("ln_f.bias", {C});
    im.head = im.wte;
  } else {  // Hugging Face Llama's names; q, k, v adjacent and gate, up adjacent, so the layer
            // code runs each trio / pair as one product
    const DecoderConfig dc = cfg_.decoder_config();
    im.wte = table_.add("model.embed_tokens.weight", {Vp, C});
    for (int64_t l = 0; l < L; ++l) {
      const std::string h = hf_layer_prefix(l);
      for (const LayerTensor& t : layer_tensors()) {
        if (!trained_tensor(t, dc)) continue;
        const Shape shape = layer_tensor_shape(t, dc);
        if (!dc.moe() || !expert_stack(t)) {
          table_.add(hf_layer_name(h, t, dc), shape);
          continue;
        }
        // Each expert's matrix, in order: they view as the stacked matrix (as_decoder).
        const auto m = static_cast<LayerMatrix>(t.matrix);
        for (int64_t e = 0; e < dc.n_experts; ++e)
          table_.add(hf_expert_name(h, hf_moe_is_mixtral(dc), e, m), shape);
      }
    }
    table_.add("model.norm.weight", {C});
    im.head = cfg_.tied ? im.wte : table_.add("lm_head.weight", {Vp, C});
  }
  allocate_parameters();
}

TrainModel::TrainModel(DecoderModel base, const LoraSpec& spec, const ops::Context& ctx)
    : ctx_(ctx), impl_(std::make_unique<Impl>(*this)) {
  ops::require_device(ctx_, "the training model");
  const DecoderConfig& c = base.config;
  check_lora_spec(c, spec, base.source);
  cfg_ = trainable_config(c, base.source);
  cfg_.padded_vocab_size = cfg_.vocab_size;  // the head is the base's (V,C) matrix
  Impl& im = *impl_;
  im.wte = im.head = -1;
  im.lora = spec;
  // Per layer, per target in layer order: A (r,K) then B (N,r), PEFT's names.
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const DecoderLayer& layer = base.weights.layers[static_cast<size_t>(l)];
    for (LayerMatrix m : spec.targets) {
      const WeightRef& w = *layer.matrices()[static_cast<size_t>(m)];
      TS_CHECK(w.present(), "[lora] ", base.source, ": layer ", l, " has no ", lora_target_name(m),
               " matrix");
      table_.add(peft_a_name(l, m), {spec.rank, w.cols()});
      table_.add(peft_b_name(l, m), {w.rows(), spec.rank});
    }
  }
  // The widest norm (OLMoE's q norm spans q_dim), weight and bias.
  const int64_t sink = 2 * std::max({cfg_.n_embd, c.head_dim, c.q_dim(), c.kv_dim()});
  im.base = std::move(base);
  im.base_device = to_device(im.base, ctx_);
  im.norm_sink = ops::Buffer(ctx_.device, static_cast<size_t>(sink) * sizeof(float));
  allocate_parameters();
}

TrainModel::~TrainModel() = default;

void TrainModel::allocate_parameters() {
  const auto bytes = static_cast<size_t>(table_.total_elems()) * sizeof(float);
  params_ = ops::Buffer(ctx_.device, bytes);
  grads_ = ops::Buffer(ctx_.device, bytes);
  ops::zero(ctx_, params_.data(), bytes);
  ops::zero(ctx_, grads_.data(), bytes);
}

bool TrainModel::is_lora() const {
  return impl_->is_lora();
}
const LoraSpec& TrainModel::lora() const {
  return impl_->lora;
}
const DecoderModel& TrainModel::lora_base() const {
  TS_CHECK(is_lora(), "[train] the model is not a LoRA model");
  return impl_->base;
}

float* TrainModel::grads() {
  if (grads_zero_pending_) {
    ops::zero(ctx_, grads_.data(), grads_.size());
    grads_zero_pending_ = false;
  }
  return grads_.as<float>();
}

void TrainModel::zero_grads() {
  grads_zero_pending_ = true;
  if (impl_->norm_sink.size() != 0)
    ops::zero(ctx_, impl_->norm_sink.data(), impl_->norm_sink.size());
}

void TrainModel::Impl::zero_unwritten_grads() {
  TrainModel& m = model;
  const int64_t total = m.num_params();
  float* base = m.grads_.as<float>();
  if (is_lora()) {
    ops::zero(m.ctx_, base, static_cast<size_t>(total) * sizeof(float));
    return;
  }
  if (written_grads.empty()) {
    auto add = [&](const WeightRef& w) {
      if (!w.present()) return;
      const int64_t b = static_cast<const float*>(w.data) - base;
      written_grads.emplace_back(b, b + w.shape.numel());
    };
    const DecoderConfig& c = grad_view.config;
    for (const DecoderLayer& l : grad_view.weights.layers) {
      for (const WeightRef* w : {&l.wq, &l.wk, &l.wv, &l.wo}) add(*w);
      if (!c.moe())
        for (const WeightRef* w : {&l.w_gate, &l.w_up, &l.w_down}) add(*w);
    }
    written_grads.emplace_back(head, head + m.cfg_.padded_vocab_size * m.cfg_.n_embd);
    std::sort(written_grads.begin(), written_grads.end());
  }
  int64_t at = 0;
  auto zero_to = [&](int64_t end) {
    if (end > at) ops::zero(m.ctx_, base + at, static_cast<size_t>(end - at) * sizeof(float));
  };
  for (const auto& [b, e] : written_grads) {
    zero_to(b);
    at = std::max(at, e);
  }
  zero_to(total);
}

void TrainModel::init_weights(uint64_t seed) {
  const auto& ts = table_.tensors();
  if (is_lora()) {  // A (r,K) uniform in +-1/sqrt(K), as PEFT's kaiming_uniform(a=sqrt(5)); B zero
    ops::HostMirror<float> host(ctx_, params(), num_params(), ops::HostMirror<float>::write);
    for (size_t i = 0; i < ts.size(); ++i) {
      const TensorInfo& t = ts[i];
      float* dst = host.data() + t.offset;
      const bool is_a = i % 2 == 0;
      const float bound = 1.0f / std::sqrt(static_cast<float>(t.shape[1]));
      Rng rng(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(i) * 0xd1b54a32d192ed03ull + 1);
      for (int64_t j = 0; j < t.numel(); ++j)
        dst[j] = is_a ? bound * (2.0f * rng.uniform() - 1.0f) : 0.0f;
    }
    host.flush();
    return;
  }
  const float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(cfg_.n_layer));
  // Each tensor's role from the model's own description of its layers (as_decoder): norm
  // weights (q/k norms too) 1, biases 0, the products that feed the residual stream (attention
  // output, MLP down) N(0, 0.02 / sqrt(2L)), every other matrix N(0, 0.02).
  const DecoderModel view = as_decoder(*this);
  std::map<const void*, float> role;  // first float of a tensor -> its value (ones) or std
  auto mark = [&role](const WeightRef& w, float v) {
    if (w.present()) role[w.data] = v;
  };
  for (const DecoderLayer& l : view.weights.layers) {
    for (const WeightRef* norm :
         {&l.attn_norm, &l.ffn_norm, &l.q_norm, &l.k_norm, &l.post_attn_norm, &l.post_ffn_norm})
      mark(*norm, -1);
    mark(l.wo, proj_std);
    const int64_t E = view.config.n_experts;
    for (int64_t e = 0; e < std::max<int64_t>(E, 1); ++e)  // each expert's down matrix its own
      mark(E > 0 ? expert_rows(l.w_down, e, E) : l.w_down, proj_std);
  }
  mark(view.weights.out_norm, -1.0f);
  ops::HostMirror<float> host(ctx_, params(), num_params(), ops::HostMirror<float>::write);
  const float* base = params();
  // Each tensor draws from its own stream (seed, tensor index), so tensors can be filled in
  // parallel and the result does not depend on the thread count.
  ctx_.threads().parallel_for(static_cast<int64_t>(ts.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const TensorInfo& t = ts[static_cast<size_t>(i)];
      float* dst = host.data() + t.offset;
      const int64_t n = t.numel();
      const auto it = role.find(base + t.offset);
      if (t.shape.rank() == 1) {
        const float v = it != role.end() && it->second < 0 ? 1.0f : 0.0f;
        for (int64_t j = 0; j < n; ++j) dst[j] = v;
        continue;
      }
      const float std = it != role.end() ? it->second : 0.02f;
      Rng rng(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(i) * 0xd1b54a32d192ed03ull + 1);
      const int64_t real = unpadded_elems(t);
      for (int64_t j = 0; j < real; ++j) dst[j] = std * rng.normal();
      for (int64_t j = real; j < n; ++j) dst[j] = 0.0f;
    }
  });
  host.flush();
  params_updated();
}

int64_t TrainModel::unpadded_elems(const TensorInfo& t) const {
  const bool padded = t.offset == impl_->wte || t.offset == impl_->head;
  return padded ? cfg_.vocab_size * cfg_.n_embd : t.numel();
}

const void* TrainModel::Impl::weight(int64_t off) const {
  if (bf16()) return params_bf16.as<uint16_t>() + off;
  return p(off);
}

void TrainModel::params_updated() {
  Impl& im = *impl_;
  if (!im.bf16() || im.params_bf16.size() == 0) return;  // f32: GEMMs read the master weights
  ops::convert_f32_to_bf16(ctx_, im.params_bf16.as<uint16_t>(), params(), num_params());
}

void TrainModel::plan(int64_t B, int64_t T, Precision precision, Recompute recompute) {
  TS_CHECK(B > 0 && B <= (int64_t{1} << 20),
           "[train] plan: batch size B must be in [1, 2^20], got ", B);
  TS_CHECK(T > 0 && T <= cfg_.max_seq, "[train] plan: sequence length T=", T,
           " must be in [1, max_seq=", cfg_.max_seq, "]");
  Impl& im = *impl_;
  TS_CHECK(!im.is_lora() || precision == Precision::f32,
           "[train] LoRA trains in f32 precision (the base's products run in its stored type)");
  // A LoRA base is described by its own config (q/k norms, heads wider than width / heads).
  const DecoderConfig dc = im.is_lora() ? im.base.config : cfg_.decoder_config();
  const bool llama = dc.arch == DecoderArch::llama;
  const int64_t C = cfg_.n_embd, L = cfg_.n_layer, H = cfg_.n_head, Vp = cfg_.padded_vocab_size;
  const int64_t QD = dc.q_dim(), QKV = QD + 2 * dc.kv_dim(), F = dc.d_ff;
  const int64_t N = B * T;
  // A mixture of experts runs its MLP over N k rows, one per choice (k = 1 for a dense MLP).
  const bool moe = dc.moe();
  const int64_t k = moe ? dc.n_experts_used : 1, E = dc.n_experts, NK = N * k;
  const size_t f = sizeof(float);
  ArenaPlan plan;
  auto res = [&](const std::string& name, int64_t elems) {
    return plan.reserve(name, static_cast<size_t>(elems) * f);
  };
  // bf16 precision keeps the products' inputs as bf16 (BlockTensors::xn1_bf16...): the products
  // round them to bf16 anyway, so the step's bits stay those of f32 storage. It keeps q/k/v, the
  // attention output and the MLP's input products as bf16 too: a bf16 step rounds those where
  // they are written (CausalAttention, BlockTensors::round_ff_in), in every policy. Not with
  // block recompute (nothing is kept per layer), nor in LoRA mode (f32).
  const bool keep16 = precision == Precision::bf16 && recompute != Recompute::block;
  auto res16 = [&](const std::string& name, int64_t elems) {
    return plan.reserve(name, static_cast<size_t>(elems) * sizeof(uint16_t));
  };
  // Which of a layer's ln1, ln2 and MLP activation slots hold bf16 (the same for every layer).
  const bool ln1_16 = keep16, ln2_16 = keep16 && !moe,
             gelu_16 = keep16 && !moe && recompute == Recompute::none;
  const size_t ln_shared = keep16 ? res("ln_f32", N * C) : 0;
  // q/k/v, the attention output and the MLP's input products: kept as bf16 per layer (keep16),
  // the f32 tensors one set that every layer computes in.
  const size_t qkv_shared = keep16 ? res("qkv_f32", N * QKV) : 0,
               atty_shared = keep16 ? res("atty_f32", N * QD) : 0,
               fch_shared = keep16 ? res("fch_f32", NK * F) : 0,
               fup_shared = keep16 && llama ? res("fup_f32", NK * F) : 0;
  // Offsets first (the arena does not exist yet), pointers after allocation.
  std::vector<size_t> resid_off;
  for (int64_t l = 0; l <= L; ++l) resid_off.push_back(res(cat("resid.", l), N * C));
  const size_t scratch_c = res("scratch_c", N * std::max(C, QD)), dresid = res("dresid", N * C),
               dbig = res("dbig", std::max(N * QKV, NK * F)),
               dup = llama ? res("dup", std::max(N * QD, NK * F)) : 0,
               rot = llama ? res("rot", N * std::max(QD, dc.kv_dim())) : 0,
               dpost = dc.post_norms ? res("dpost", N * C) : 0;
  // int32 arrays take f32 slots (both 4 bytes).
  const size_t moe_dy = moe ? res("moe_dy", NK * C) : 0, moe_dw = moe ? res("moe_dw", 3 * NK) : 0,
               moe_dlogits = moe ? res("moe_dlogits", N * E) : 0,
               moe_slot = moe ? res("moe_slot", NK) : 0;
  struct LayerOff {
    size_t ln1, ln1_mean, ln1_rstd, qkv, atty, lse, resid_mid, ln2, ln2_mean, ln2_rstd, fch, fup,
        gelu, qk_raw, post_in, post_rstd, router, moe_ids, moe_weights, moe_x, moe_y;
  };
  // none: a full set per layer; gelu: per layer but the MLP's activation (GELU, SwiGLU) lives in
  // dbig (recomputed in backward); block: one shared set, replayed per layer in backward.
  const int64_t n_sets = recompute == Recompute::block ? 1 : L;
  std::vector<LayerOff> lo;
  for (int64_t s = 0; s < n_sets; ++s) {
    const std::string h = recompute == Recompute::block ? "shared." : cat("h.", s, ".");
    LayerOff o;
    o.ln1 = ln1_16 ? res16(h + "ln1.bf16", N * C) : res(h + "ln1", N * C);
    o.ln1_mean = res(h + "ln1_mean", N);
    o.ln1_rstd = res(h + "ln1_rstd", N);
    o.qkv = keep16 ? res16(h + "qkv.bf16", N * QKV) : res(h + "qkv", N * QKV);
    o.atty = keep16 ? res16(h + "atty.bf16", N * QD) : res(h + "atty", N * QD);
    o.lse = res(h + "lse", N * H);
    o.resid_mid = res(h + "resid_mid", N * C);
    o.ln2 = ln2_16 ? res16(h + "ln2.bf16", N * C) : res(h + "ln2", N * C);
    o.ln2_mean = res(h + "ln2_mean", N);
    o.ln2_rstd = res(h + "ln2_rstd", N);
    o.fch = keep16 ? res16(h + "fch.bf16", NK * F) : res(h + "fch", NK * F);
    o.fup = !llama ? 0 : keep16 ? res16(h + "fup.bf16", NK * F) : res(h + "fup", NK * F);
    o.gelu = gelu_16                        ? res16(h + "gelu.bf16", NK * F)
             : recompute == Recompute::none ? res(h + "gelu", NK * F)
                                            : dbig;
    o.router = moe ? res(h + "router", N * E) : 0;
    o.moe_ids = moe ? res(h + "moe_ids", 2 * NK) : 0;
    o.moe_weights = moe ? res(h + "moe_weights", 2 * NK) : 0;
    o.moe_x = moe ? res(h + "moe_x", NK * C) : 0;
    o.moe_y = moe ? res(h + "moe_y", NK * C) : 0;
    o.qk_raw = dc.qk_norm ? res(h + "qk_raw", N * (QD + dc.kv_dim())) : 0;
    o.post_in = dc.post_norms ? res(h + "post_in", 2 * N * C) : 0;
    o.post_rstd = dc.post_norms ? res(h + "post_rstd", 2 * N) : 0;
    lo.push_back(o);
  }
  const size_t lnf = res("lnf", N * C), lnf_mean = res("lnf_mean", N),
               lnf_rstd = res("lnf_rstd", N),
               logits = res("logits", std::min(N, Impl::kHeadRows) * Vp), losses = res("losses", N);
  const int64_t r = im.lora.rank;
  const size_t lora_u = r > 0 ? res("lora_u", N * r) : 0,
               lora_gu = r > 0 ? res("lora_gu", N * r) : 0;

  // The arena is allocated by the first step after plan() (once; later steps never allocate),
  // so sizing a plan that is never run, e.g. to compare policies, costs no memory.
  im.planned = false;
  im.arena = ops::Buffer();
  im.plan = plan;
  im.bind = [&im, L, llama, moe, recompute, resid_off, scratch_c, dresid, dbig, dup, rot, dpost,
             moe_dy, moe_dw, moe_dlogits, moe_slot, lo, lnf, lnf_mean, lnf_rstd, logits, losses, r,
             lora_u, lora_gu, ln_shared, ln1_16, ln2_16, gelu_16, keep16, qkv_shared, atty_shared,
             fch_shared, fup_shared](char* base) {
    auto at = [base](size_t off) { return reinterpret_cast<float*>(base + off); };
    auto at_moe = [&](size_t off) { return moe ? at(off) : nullptr; };
    auto ints_moe = [&](size_t off) {
      return moe ? reinterpret_cast<int32_t*>(base + off) : nullptr;
    };
    im.moe_dy = at_moe(moe_dy);
    im.moe_dw = at_moe(moe_dw);
    im.moe_dlogits = at_moe(moe_dlogits);
    im.moe_slot = ints_moe(moe_slot);
    im.resid.clear();
    for (size_t off : resid_off) im.resid.push_back(at(off));
    im.scratch_c = at(scratch_c);
    im.dresid = at(dresid);
    im.dbig = at(dbig);
    im.dup = llama ? at(dup) : nullptr;
    im.rot = llama ? at(rot) : nullptr;
    im.dpost = dpost ? at(dpost) : nullptr;
    im.acts.clear();
    for (int64_t l = 0; l < L; ++l) {
      const LayerOff& o = lo[static_cast<size_t>(recompute == Recompute::block ? 0 : l)];
      auto b16 = [base](bool is, size_t off) {
        return is ? reinterpret_cast<uint16_t*>(base + off) : nullptr;
      };
      im.acts.push_back({ln1_16 ? at(ln_shared) : at(o.ln1),
                         at(o.ln1_mean),
                         at(o.ln1_rstd),
                         keep16 ? at(qkv_shared) : at(o.qkv),
                         keep16 ? at(atty_shared) : at(o.atty),
                         at(o.lse),
                         at(o.resid_mid),
                         ln2_16 ? at(ln_shared) : at(o.ln2),
                         at(o.ln2_mean),
                         at(o.ln2_rstd),
                         keep16 ? at(fch_shared) : at(o.fch),
                         !llama   ? nullptr
                         : keep16 ? at(fup_shared)
                                  : at(o.fup),
                         gelu_16 ? at(dbig) : at(o.gelu),
                         o.qk_raw ? at(o.qk_raw) : nullptr,
                         o.post_in ? at(o.post_in) : nullptr,
                         o.post_rstd ? at(o.post_rstd) : nullptr,
                         at_moe(o.router),
                         ints_moe(o.moe_ids),
                         at_moe(o.moe_weights),
                         at_moe(o.moe_x),
                         at_moe(o.moe_y),
                         b16(ln1_16, o.ln1),
                         b16(ln2_16, o.ln2),
                         b16(gelu_16, o.gelu),
                         b16(keep16, o.qkv),
                         b16(keep16, o.atty),
                         b16(keep16, o.fch),
                         b16(keep16 && llama, o.fup)});
    }
    im.lnf = at(lnf);
    im.lnf_mean = at(lnf_mean);
    im.lnf_rstd = at(lnf_rstd);
    im.logits = at(logits);
    im.losses = at(losses);
    im.lora_u = r > 0 ? at(lora_u) : nullptr;
    im.lora_gu = r > 0 ? at(lora_gu) : nullptr;
  };
  if (im.is_lora()) im.embed_rows.assign(static_cast<size_t>(N * C), 0.0f);
  im.routing.assign(moe ? static_cast<size_t>(L) : 0, MoeRouting{});
  // The rotary tables for positions 0..T-1 (LongRoPE's factors picked by T), on the step's
  // device.
  if (llama) make_rope_tables(ctx_, dc, T, &im.rope, &im.rope_local, &im.rope_device);
  im.max_n = N;
  im.max_t = T;
  im.precision = precision;
  im.recompute = recompute;
  im.last_logits = nullptr;
  if (precision == Precision::bf16) {
    const auto bytes = static_cast<size_t>(num_params()) * sizeof(uint16_t);
    if (im.params_bf16.size() != bytes) im.params_bf16 = ops::Buffer(ctx_.device, bytes);
  } else {
    im.params_bf16 = ops::Buffer();
  }
  im.make_view();
  im.planned = true;
  params_updated();
}

void TrainModel::Impl::make_view() {
  if (is_lora()) {
    // The base's weights on the device, adapters viewing the parameters; the gradient view has
    // only the adapters (viewing the gradients) and the norms' sink.
    view = base_device.view;
    attach_lora_views(model, model.params(), view);
    grad_view = view;
    const float* sink = norm_sink.as<float>();
    auto frozen = [sink](WeightRef& w, int64_t at) {
      if (w.present()) w = WeightRef{sink + at, DType::f32, w.shape};
    };
    auto absent = [](WeightRef& w) { w = WeightRef{}; };
    DecoderWeights& g = grad_view.weights;
    for (DecoderLayer& l : g.layers) {
      for (WeightRef* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.bq, &l.bk, &l.bv, &l.bo, &l.w_gate,
                           &l.w_up, &l.w_down, &l.b_up, &l.b_down, &l.ffn_router})
        absent(*w);
      frozen(l.q_norm, 0);
      frozen(l.k_norm, 0);
      frozen(l.attn_norm, 0);
      frozen(l.attn_norm_b, model.cfg_.n_embd);
      frozen(l.ffn_norm, 0);
      frozen(l.ffn_norm_b, model.cfg_.n_embd);
      frozen(l.post_attn_norm, 0);
      frozen(l.post_ffn_norm, 0);
    }
    attach_lora_views(model, model.grads(), grad_view);
    absent(g.tok_embd);
    absent(g.pos_embd);
    absent(g.output);
    frozen(g.out_norm, 0);
    frozen(g.out_norm_b, model.cfg_.n_embd);
    return;
  }
  view = as_decoder(model);
  grad_view = as_decoder(model, model.grads());
  if (!bf16()) return;
  const float* base = model.params();
  for (DecoderLayer& l : view.weights.layers)
    for (WeightRef* m : l.matrices()) {
      if (!m->present()) continue;
      m->data = params_bf16.as<uint16_t>() + (static_cast<const float*>(m->data) - base);
      m->type = DType::bf16;
    }
}

size_t TrainModel::activation_bytes() const {
  return impl_->plan.total_bytes();
}

void TrainModel::Impl::ensure_arena() {
  TS_CHECK(planned, "[train] call plan(B, T, precision, recompute) before forward");
  if (arena.size() != 0) return;
  arena = ops::Buffer(model.ctx_.device, plan.total_bytes());
  ops::zero(model.ctx_, arena.data(), arena.size());
  if (model.ctx_.device != ops::Device::cpu)
    ints = ops::Buffer(model.ctx_.device, static_cast<size_t>(2 * max_n) * sizeof(int32_t));
  bind(arena.as<char>());
}

const float* TrainModel::logits() const {
  TS_CHECK(impl_->last_logits != nullptr,
           "[train] logits(): no forward pass without targets has run since plan() (a step keeps "
           "only a chunk of the head's rows)");
  return impl_->last_logits;
}

double TrainModel::flops_per_token_train(int64_t T) const {
  // 6 FLOPs per parameter per token (2 forward, 4 backward) for every matrix the token passes
  // through: the non-embedding parameters (embedding lookups are not matmuls; an untied head
  // counted with the head below) plus the head (V x C, counted with the real vocabulary).
  // Attention's QK^T and PV add 2*2*T*q_dim FLOPs per token per layer forward over the full
  // T x T scores, times 3 for training = 12*L*T*q_dim; the causal mask halves it: 6*L*T*q_dim.
  const double C = static_cast<double>(cfg_.n_embd), L = static_cast<double>(cfg_.n_layer);
  const double QD = static_cast<double>(cfg_.n_head * cfg_.head_dim());
  const Impl& im = *impl_;
  // A token passes through k of a MoE layer's E experts: the others' three matrices do no work.
  const DecoderConfig dc = im.is_lora() ? im.base.config : cfg_.decoder_config();
  const double idle = dc.moe() ? static_cast<double>(dc.n_experts - dc.n_experts_used) * 3.0 *
                                     static_cast<double>(dc.d_ff * dc.d_model) * L
                               : 0.0;
  if (im.is_lora()) {
    // The frozen matrices and the head: forward and the input's gradient, 4 FLOPs per weight;
    // the adapters: 6 per parameter, plus the backward's replay of x A^T (2 r K per adapter).
    double frozen = static_cast<double>(cfg_.vocab_size) * C, replay = 0;
    for (const DecoderLayer& l : im.base.weights.layers)
      for (const WeightRef* w : l.matrices())
        if (w->present()) frozen += static_cast<double>(w->shape.numel());
    for (size_t i = 0; i < table_.tensors().size(); i += 2)
      replay += 2.0 * static_cast<double>(table_.tensors()[i].numel());
    return 4.0 * (frozen - idle) + 6.0 * static_cast<double>(num_params()) + replay +
           6.0 * L * static_cast<double>(T) * QD;
  }
  double non_embedding = 0;
  for (const auto& t : table_.tensors())
    if (t.offset != im.wte && t.offset != im.wpe && t.offset != im.head)
      non_embedding += static_cast<double>(t.numel());
  non_embedding -= idle;
  const double head = static_cast<double>(cfg_.vocab_size) * C;
  return 6.0 * (non_embedding + head) + 6.0 * L * static_cast<double>(T) * QD;
}

}  // namespace tessera::model
