// GPT-2 presets, config validation, and parsing of precision / recompute names.
#include "core/error.h"
#include "model/gpt2.h"

namespace tessera::model {

Gpt2Config Gpt2Config::preset(const std::string& name, int64_t vocab) {
  TS_CHECK(vocab > 0 && vocab <= (int64_t{1} << 24),
           "[model] vocabulary size must be in [1, 2^24], got ", vocab);
  Gpt2Config c;
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
  } else {
    fail("[model] unknown model preset '", name,
         "' (known: gpt2-tiny, gpt2-mini, gpt2-small, gpt2-medium, gpt2-large, gpt2-xl)");
  }
  c.vocab_size = vocab;
  c.padded_vocab_size = pad_vocab(vocab);
  return c;
}

void Gpt2Config::validate() const {
  TS_CHECK(n_layer > 0 && n_layer <= 1024, "[model] n_layer must be in [1, 1024], got ", n_layer);
  TS_CHECK(n_head > 0 && n_embd > 0 && n_embd % n_head == 0, "[model] n_embd (", n_embd,
           ") must be a positive multiple of n_head (", n_head, ")");
  TS_CHECK(n_embd <= 65536, "[model] n_embd too large: ", n_embd);
  TS_CHECK(vocab_size > 0 && padded_vocab_size >= vocab_size && vocab_size <= (int64_t{1} << 24),
           "[model] bad vocabulary sizes V=", vocab_size, " Vp=", padded_vocab_size);
  TS_CHECK(max_seq > 0 && max_seq <= (int64_t{1} << 20),
           "[model] max_seq must be in [1, 2^20], got ", max_seq);
}

Precision parse_precision(const std::string& s) {
  if (s == "f32" || s == "fp32") return Precision::f32;
  if (s == "bf16") return Precision::bf16;
  fail("--precision must be f32 or bf16, got '", s, "'");
}

Recompute parse_recompute(const std::string& s) {
  if (s == "none") return Recompute::none;
  if (s == "gelu") return Recompute::gelu;
  if (s == "block") return Recompute::block;
  fail("--recompute must be none, gelu or block, got '", s, "'");
}

}  // namespace tessera::model
