// Tokenizer <-> GGUF metadata (tokenizer.ggml.*): model "gpt2" (byte-level BPE with merges and a
// pre-tokenizer name), "llama" and "gemma4" (SentencePiece-style BPE with scores or merges and
// byte tokens) and "bert" (WordPiece with the BERT normalizer's flags).
#include <cmath>
#include <unordered_map>

#include "core/error.h"
#include "formats/gguf.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

namespace tessera::tokenizer {
namespace {

// GGUF token types (llama.cpp's numbering).
constexpr int32_t kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6;

struct KeyReader {
  const formats::GgufFile& f;

  [[noreturn]] void bad(const std::string& key, const std::string& why) const {
    fail("[tokenizer] ", f.path(), ": ", key, ": ", why);
  }
  // Any integer item of an array, else an error naming key[i].
  int64_t int_item(const formats::GgufValue& v, const std::string& key, size_t i) const {
    return std::visit(
        [&](const auto& x) -> int64_t {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool> &&
                        !std::is_same_v<T, uint64_t>) {
            return static_cast<int64_t>(x);
          } else {
            bad(cat(key, "[", i, "]"),
                cat("expected an integer, got ", formats::gguf_type_name(v.type())));
          }
        },
        v.v);
  }
  // Optional array with one entry per token.
  const formats::GgufArray* per_token(const std::string& key, size_t n) const {
    if (!f.has(key)) return nullptr;
    const formats::GgufArray& a = f.get_array(key);
    if (a.items.size() != n) bad(key, cat(a.items.size(), " entries for ", n, " tokens"));
    return &a;
  }
  int32_t token_id(const std::string& key, size_t n) const {
    if (!f.has(key)) return -1;
    const int64_t id = f.get_int(key);
    if (id < 0 || id >= static_cast<int64_t>(n))
      bad(key, cat("id ", id, " out of range [0, ", n, ")"));
    return static_cast<int32_t>(id);
  }
};

}  // namespace

Tokenizer Tokenizer::from_gguf(const formats::GgufFile& f) {
  const KeyReader r{f};
  const std::string& model = f.get_string("tokenizer.ggml.model");
  Tokenizer tok;
  TokenizerState& st = *tok.impl_;
  // "gemma4" is SentencePiece-style BPE over raw UTF-8 (merges, <0xNN> byte fallback) whose
  // pre-tokenizer splits at the edges of newline runs.
  if (model == "llama" || model == "gemma4")
    st.model = TokenizerModel::sentencepiece_bpe;
  else if (model == "bert")
    st.model = TokenizerModel::wordpiece;
  else if (model != "gpt2")
    r.bad("tokenizer.ggml.model",
          cat("unsupported '", model, "' (only gpt2, llama, gemma4 and bert)"));
  st.split_newline_runs = model == "gemma4";
  const bool spm = st.model == TokenizerModel::sentencepiece_bpe;
  const bool wordpiece = st.model == TokenizerModel::wordpiece;
  if (wordpiece) {
    // HF's BertNormalizer defaults: lowercase on, strip_accents following lowercase.
    constexpr const char* kLower = "tokenizer.ggml.normalizer.lowercase";
    constexpr const char* kStrip = "tokenizer.ggml.normalizer.strip_accents";
    st.bert_lowercase = f.has(kLower) ? f.get_bool(kLower) : true;
    st.bert_strip_accents = f.has(kStrip) ? f.get_bool(kStrip) : st.bert_lowercase;
    if (f.has("tokenizer.ggml.pre")) st.pre_name = f.get_string("tokenizer.ggml.pre");
  }
  if (st.model == TokenizerModel::byte_level_bpe && f.has("tokenizer.ggml.pre")) {
    st.pre_name = f.get_string("tokenizer.ggml.pre");
    st.pre = parse_pre_tokenizer(st.pre_name, cat(f.path(), ": tokenizer.ggml.pre"));
  }
  // GGUF has no flag for HF's ignore_merges; Llama 3 sets it, and llama.cpp implies it there.
  st.ignore_merges = st.pre == PreTokenizer::llama3;
  // GGUF has no normalizer key either; Qwen2's tokenizer.json has NFC, so "qwen2" implies it
  // (Qwen3.5's has none: its pattern keeps combining marks with the letters instead).
  st.nfc = st.pre == PreTokenizer::qwen2;

  const std::vector<std::string> names = f.get_string_array("tokenizer.ggml.tokens");
  const size_t n = names.size();
  if (n == 0) r.bad("tokenizer.ggml.tokens", "empty");
  if (n > (size_t{1} << 24)) r.bad("tokenizer.ggml.tokens", cat(n, " tokens (at most 2^24)"));
  const formats::GgufArray* types = r.per_token("tokenizer.ggml.token_type", n);
  st.tokens.resize(n);
  for (size_t id = 0; id < n; ++id) {
    const std::string key = cat("tokenizer.ggml.tokens[", id, "]");
    const int64_t type =
        types ? r.int_item(types->items[id], "tokenizer.ggml.token_type", id) : kNormal;
    if (type < kNormal || type > kByte)
      r.bad(cat("tokenizer.ggml.token_type[", id, "]"), cat("unknown token type ", type));
    if (names[id].empty()) r.bad(key, "empty token");
    if (type == kUnknown || type == kControl || type == kUserDefined) {
      AddedToken a;
      a.content = names[id];
      a.id = static_cast<int32_t>(id);
      a.special = type != kUserDefined;
      st.added.push_back(std::move(a));
      st.tokens[id] = names[id];
      if (type == kUnknown && st.special.unk < 0) st.special.unk = static_cast<int32_t>(id);
    } else if (spm || wordpiece) {
      if (type == kByte && (names[id].size() != 6 || names[id].compare(0, 3, "<0x") != 0))
        r.bad(key, cat("byte token '", names[id], "' is not of the form <0xNN>"));
      st.tokens[id] = names[id];
    } else if (!vocab_string_to_bytes(names[id], &st.tokens[id])) {
      st.tokens[id] = names[id];
      st.verbatim.push_back(static_cast<int32_t>(id));
    }
  }

  if (f.has("tokenizer.ggml.merges")) {
    std::unordered_map<std::string, int32_t> id_of;
    id_of.reserve(n);
    for (size_t id = 0; id < n; ++id) id_of.emplace(names[id], static_cast<int32_t>(id));
    const std::vector<std::string> merges = f.get_string_array("tokenizer.ggml.merges");
    st.merges.reserve(merges.size());
    for (size_t k = 0; k < merges.size(); ++k) {
      const std::string key = cat("tokenizer.ggml.merges[", k, "]");
      const std::string& m = merges[k];
      const size_t sp = m.find(' ');
      if (sp == std::string::npos || m.find(' ', sp + 1) != std::string::npos)
        r.bad(key, cat("expected \"left right\" with one space, got '", m, "'"));
      const auto a = id_of.find(m.substr(0, sp)), b = id_of.find(m.substr(sp + 1));
      if (a == id_of.end() || b == id_of.end())
        r.bad(key, cat("token '", a == id_of.end() ? m.substr(0, sp) : m.substr(sp + 1),
                       "' is not in tokenizer.ggml.tokens"));
      st.merges.emplace_back(a->second, b->second);
    }
  } else if (st.model == TokenizerModel::byte_level_bpe) {
    r.bad("tokenizer.ggml.merges", "missing (a gpt2 vocabulary needs merges)");
  }
  if (spm) {
    if (const formats::GgufArray* scores = r.per_token("tokenizer.ggml.scores", n)) {
      st.scores.resize(n);
      for (size_t id = 0; id < n; ++id) {
        const float* s = scores->items[id].get_if<float>();
        if (!s || !std::isfinite(*s))
          r.bad(cat("tokenizer.ggml.scores[", id, "]"), "expected a finite f32");
        st.scores[id] = *s;
      }
    } else if (st.merges.empty()) {
      r.bad("tokenizer.ggml.scores", "missing (a llama vocabulary needs scores or merges)");
    }
    const bool prefix = f.has("tokenizer.ggml.add_space_prefix")
                            ? f.get_bool("tokenizer.ggml.add_space_prefix")
                            : true;
    st.space_prefix = prefix ? SpacePrefix::every : SpacePrefix::none;
  }

  st.special.bos = r.token_id("tokenizer.ggml.bos_token_id", n);
  st.special.eos = r.token_id("tokenizer.ggml.eos_token_id", n);
  st.special.eot = r.token_id("tokenizer.ggml.eot_token_id", n);
  st.special.pad = r.token_id("tokenizer.ggml.padding_token_id", n);
  if (f.has("tokenizer.ggml.unknown_token_id"))
    st.special.unk = r.token_id("tokenizer.ggml.unknown_token_id", n);
  st.special.add_bos =
      f.has("tokenizer.ggml.add_bos_token") ? f.get_bool("tokenizer.ggml.add_bos_token") : spm;
  st.finalize(cat(f.path(), " (tokenizer.ggml.tokens/merges)"));
  return tok;
}

// GGUF has no keys for HF's normalizer or lstrip/rstrip: NFC comes back only as implied by pre
// "qwen2", and added tokens come back without stripping (llama.cpp keeps no such flags either).
void Tokenizer::to_gguf(formats::GgufWriter& w) const {
  const Impl& m = *impl_;
  TS_CHECK(vocab_size() > 0, "[tokenizer] to_gguf: the tokenizer is empty");
  const bool spm = m.model == TokenizerModel::sentencepiece_bpe;
  const bool wordpiece = m.model == TokenizerModel::wordpiece;
  w.set("tokenizer.ggml.model", m.split_newline_runs ? "gemma4"
                                : spm                ? "llama"
                                : wordpiece          ? "bert"
                                                     : "gpt2");
  if (m.model == TokenizerModel::byte_level_bpe)
    w.set("tokenizer.ggml.pre",
          m.pre_name.empty() ? std::string(pre_tokenizer_name(m.pre)) : m.pre_name);
  if (wordpiece) {
    if (!m.pre_name.empty()) w.set("tokenizer.ggml.pre", m.pre_name);
    w.set("tokenizer.ggml.normalizer.lowercase", m.bert_lowercase);
    w.set("tokenizer.ggml.normalizer.strip_accents", m.bert_strip_accents);
  }
  std::vector<std::string> names(m.tokens.size());
  std::vector<int32_t> types(m.tokens.size(), kNormal);
  for (size_t id = 0; id < m.tokens.size(); ++id) {
    names[id] = m.vocab_string(static_cast<int32_t>(id));
    if (m.is_added[id] == 1)
      types[id] = kUserDefined;
    else if (m.is_added[id] == 2)
      // SentencePiece's <unk> is UNKNOWN; a byte-level vocabulary's specials are all CONTROL
      // (SmolLM2's <|endoftext|> is both CONTROL and the unk id, and llama.cpp warns on load
      // when a CONTROL token comes back as UNKNOWN).
      types[id] = spm && static_cast<int32_t>(id) == m.special.unk ? kUnknown : kControl;
    else if (spm && m.byte_of[id] >= 0)
      types[id] = kByte;
  }
  w.set("tokenizer.ggml.tokens", formats::gguf_array(formats::GgufType::string, names));
  w.set("tokenizer.ggml.token_type", formats::gguf_array(formats::GgufType::i32, types));
  // Score-derived merges are not written: the scores say the same, ties included.
  if (!wordpiece && (!spm || m.merge_ranks.empty())) {
    std::vector<std::string> merges(m.merges.size());
    for (size_t r = 0; r < m.merges.size(); ++r) {
      const std::string &a = names[m.merges[r].first], &b = names[m.merges[r].second];
      TS_CHECK(a.find(' ') == std::string::npos && b.find(' ') == std::string::npos,
               "[tokenizer] to_gguf: merge ", r, " '", a, "' + '", b,
               "' holds a space, which GGUF's \"left right\" merges cannot store");
      merges[r] = a + " " + b;
    }
    if (!merges.empty() || !spm)
      w.set("tokenizer.ggml.merges", formats::gguf_array(formats::GgufType::string, merges));
  }
  if (spm) {
    std::vector<float> scores = m.scores;
    if (scores.empty()) {
      // llama.cpp merges by the score of the merged piece: earlier merges score higher.
      const auto last = static_cast<float>(m.merges.size());
      scores.assign(m.tokens.size(), -last - 1);
      for (size_t r = m.merges.size(); r-- > 0;) {
        const auto [a, b] = m.merges[r];
        const auto it = m.ids_by_bytes.find(m.tokens[a] + m.tokens[b]);
        if (it != m.ids_by_bytes.end()) scores[it->second] = -static_cast<float>(r);
      }
    }
    w.set("tokenizer.ggml.scores", formats::gguf_array(formats::GgufType::f32, scores));
  }
  // Written for byte-level vocabularies too (always false there: they never add a space), as
  // llama.cpp's converter does, so a rewritten file keeps the key its source had.
  w.set("tokenizer.ggml.add_space_prefix", m.space_prefix != SpacePrefix::none);
  const std::pair<const char*, int32_t> ids[] = {
      {"tokenizer.ggml.bos_token_id", m.special.bos},
      {"tokenizer.ggml.eos_token_id", m.special.eos},
      {"tokenizer.ggml.eot_token_id", m.special.eot},
      {"tokenizer.ggml.unknown_token_id", m.special.unk},
      {"tokenizer.ggml.padding_token_id", m.special.pad}};
  for (const auto& [key, id] : ids)
    if (id >= 0) w.set(key, static_cast<uint32_t>(id));
  w.set("tokenizer.ggml.add_bos_token", m.special.add_bos);
}

}  // namespace tessera::tokenizer
