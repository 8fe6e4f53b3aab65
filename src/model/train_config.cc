// Training presets (GPT-2 and Llama shapes), config validation, and parsing of precision /
// recompute names.
#include "core/error.h"
#include "model/train_model.h"

namespace tessera::model {

TrainConfig TrainConfig::preset(const std::string& name, int64_t vocab) {
  TS_CHECK(vocab > 0 && vocab <= (int64_t{1} << 24),
           "[model] vocabulary size must be in [1, 2^24], got ", vocab);
  TrainConfig c;
  auto llama = [&c](int64_t L, int64_t C, int64_t H, int64_t Hkv, int64_t F, int64_t T,
                    double theta, bool tied) {
    c.arch = DecoderArch::llama;
    c.n_layer = L, c.n_embd = C, c.n_head = H, c.n_kv_head = Hkv, c.d_ff = F, c.max_seq = T;
    c.rope_theta = theta, c.tied = tied;
  };
  if (name == "gpt2-tiny") {
    c.n_layer = 4, c.n_head = 4, c.n_embd = 128, c.max_seq = 256;
  } else if (name == "gpt2-mini") {
    c.n_layer = 6, c.n_head = 6, c.n_embd = 384, c.max_seq = 512;
  } else if (name == "gpt2-small" || name == "gpt2") {
    c.n_layer = 12, c.n_head = 12, c.n_embd = 768, c.max_seq = 1024;
  } else if (name == "gpt2-medium") {
    c.n_layer = 24, c.n_head = 16, c.n_embd = 1024, c.max_seq = 1024;
  } else if (name == "gpt2-large") {
    c.n_layer = 36, c.n_head = 20, c.n_embd = 1280, c.max_seq = 1024;
  } else if (name == "gpt2-xl") {
    c.n_layer = 48, c.n_head = 25, c.n_embd = 1600, c.max_seq = 1024;
  } else if (name == "llama:tiny") {  // a test shape: GQA 4/2, untied head
    llama(4, 128, 4, 2, 352, 256, 10000.0, false);
  } else if (name == "llama:smollm2-135m") {  // HuggingFaceTB/SmolLM2-135M's config.json
    llama(30, 576, 9, 3, 1536, 2048, 100000.0, true);
  } else if (name == "llama:smollm2-360m") {
    llama(32, 960, 15, 5, 2560, 2048, 100000.0, true);
  } else if (name == "llama:tinyllama-1.1b") {
    llama(22, 2048, 32, 4, 5632, 2048, 10000.0, false);
  } else {
    fail("[model] unknown model preset '", name,
         "' (known: gpt2-tiny, gpt2-mini, gpt2-small, gpt2-medium, gpt2-large, gpt2-xl, "
         "llama:tiny, llama:smollm2-135m, llama:smollm2-360m, llama:tinyllama-1.1b)");
  }
  c.vocab_size = vocab;
  c.padded_vocab_size = pad_vocab(vocab);
  return c;
}

void TrainConfig::validate() const {
  TS_CHECK(n_layer > 0 && n_layer <= 1024, "[model] n_layer must be in [1, 1024], got ", n_layer);
  TS_CHECK(n_head > 0 && n_embd > 0 && (n_embd % n_head == 0 || options.head_dim > 0),
           "[model] n_embd (", n_embd, ") must be a positive multiple of n_head (", n_head,
           ") unless the model sets head_dim");
  TS_CHECK(arch == DecoderArch::llama || options.head_dim == 0,
           "[model] GPT-2's heads are n_embd / n_head wide (no head_dim)");
  TS_CHECK(n_embd <= 65536, "[model] n_embd too large: ", n_embd);
  TS_CHECK(vocab_size > 0 && padded_vocab_size >= vocab_size && vocab_size <= (int64_t{1} << 24),
           "[model] bad vocabulary sizes V=", vocab_size, " Vp=", padded_vocab_size);
  TS_CHECK(max_seq > 0 && max_seq <= (int64_t{1} << 20),
           "[model] max_seq must be in [1, 2^20], got ", max_seq);
  TS_CHECK(n_kv_head >= 0 && n_head % kv_heads() == 0, "[model] n_head (", n_head,
           ") must be a multiple of n_kv_head (", kv_heads(), ")");
  TS_CHECK(d_ff >= 0 && ff() <= (int64_t{1} << 20), "[model] d_ff must be in [0, 2^20], got ",
           d_ff);
  TS_CHECK(arch == DecoderArch::llama || ((n_kv_head == 0 || n_kv_head == n_head) && tied),
           "[model] GPT-2 has as many key/value heads as heads and a tied head");
  TS_CHECK(arch == DecoderArch::gpt2 || head_dim() % 2 == 0,
           "[model] RoPE needs an even head dimension, got ", head_dim());
}

DecoderConfig TrainConfig::decoder_config() const {
  // GPT-2 has none of the options; a Llama takes them from `options`, its shape from the fields.
  DecoderConfig c = arch == DecoderArch::llama ? options : DecoderConfig{};
  c.arch = arch;
  if (c.name.empty())
    c.name = arch == DecoderArch::gpt2 ? "gpt2 (training model)" : "llama (training model)";
  c.n_layers = n_layer;
  c.d_model = n_embd;
  c.n_heads = n_head;
  c.n_kv_heads = kv_heads();
  c.head_dim = head_dim();
  c.d_ff = ff();
  c.vocab = vocab_size;
  c.max_ctx = max_seq;
  c.norm_eps = norm_eps;  // GPT-2: the eps of ops::layernorm_forward, which training uses
  c.tied_embeddings = tied;
  c.qkv_bias = arch == DecoderArch::gpt2 || qkv_bias;
  if (arch == DecoderArch::llama) {
    c.rope_theta = rope_theta;
    if (c.rope_dim == 0) c.rope_dim = c.head_dim;
    c.rope_layout = rope_layout;
  }
  c.validate(c.name);
  return c;
}

Precision parse_precision(const std::string& s, const std::string& what) {
  if (s == "f32" || s == "fp32") return Precision::f32;
  if (s == "bf16") return Precision::bf16;
  fail(what, " must be f32 or bf16, got '", s, "'");
}

Recompute parse_recompute(const std::string& s, const std::string& what) {
  if (s == "none") return Recompute::none;
  if (s == "gelu") return Recompute::gelu;
  if (s == "block") return Recompute::block;
  fail(what, " must be none, gelu or block, got '", s, "'");
}

}  // namespace tessera::model
