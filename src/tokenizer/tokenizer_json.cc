// Hugging Face tokenizer.json for byte-level BPE: a reader that treats the file as hostile and a
// writer whose output the `tokenizers` library loads. Merges are read as "a b" or ["a", "b"].
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

namespace tessera::tokenizer {
namespace {

using nlohmann::json;

// Short rendering of a JSON value for error messages.
std::string show(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

struct Reader {
  const std::string& src;

  [[noreturn]] void bad(const std::string& field, const std::string& why) const {
    fail("[tokenizer] ", src, ": ", field, ": ", why);
  }
  const json* member(const json& obj, const char* key) const {
    const auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }
  const json& object(const json& obj, const char* key, const std::string& field) const {
    const json* v = member(obj, key);
    if (!v) bad(field, "missing");
    if (!v->is_object()) bad(field, "expected an object, got " + show(*v));
    return *v;
  }
  std::string string(const json& v, const std::string& field) const {
    if (!v.is_string()) bad(field, "expected a string, got " + show(v));
    return v.get<std::string>();
  }
  bool boolean(const json& obj, const char* key, const std::string& field, bool def) const {
    const json* v = member(obj, key);
    if (!v) return def;
    if (!v->is_boolean()) bad(field, "expected true or false, got " + show(*v));
    return v->get<bool>();
  }
  int64_t id(const json& v, const std::string& field, int64_t bound) const {
    if (!v.is_number_integer()) bad(field, "expected an integer id, got " + show(v));
    const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX}
                          ? INT64_MAX
                          : v.get<int64_t>();
    if (x < 0 || x >= bound)
      bad(field, cat("id ", show(v), " out of range [0, ", bound, ") (ids must be dense)"));
    return x;
  }
  // A component that must be absent/null or of type `type` (e.g. the ByteLevel decoder).
  const json* typed(const json& root, const char* key, const char* type, bool required) const {
    const json* v = member(root, key);
    if (!v) {
      if (required) bad(key, cat("missing (need type ", type, ")"));
      return nullptr;
    }
    if (!v->is_object()) bad(key, "expected an object, got " + show(*v));
    const json* t = member(*v, "type");
    if (!t || !t->is_string() || t->get<std::string>() != type)
      bad(cat(key, ".type"),
          cat("unsupported ", t ? show(*t) : std::string("(none)"), " (only ", type, ")"));
    return v;
  }
};

// type of a component object, or "" when it has none.
std::string type_of(const json& v) {
  const auto t = v.find("type");
  return t != v.end() && t->is_string() ? t->get<std::string>() : std::string();
}

// ByteLevel pre-tokenizer `v` (at `field`) with add_prefix_space false and use_regex as given.
void check_byte_level(const Reader& r, const json& v, const std::string& field, bool use_regex) {
  if (r.boolean(v, "add_prefix_space", field + ".add_prefix_space", false))
    r.bad(field + ".add_prefix_space", "true is unsupported (decode would not round-trip)");
  if (r.boolean(v, "use_regex", field + ".use_regex", true) != use_regex)
    r.bad(field + ".use_regex", use_regex ? "false is unsupported (only the GPT-2 pattern)"
                                          : "true is unsupported after a Split");
}

// Byte-level normalizer: null, NFC (Qwen2), or a Sequence of NFCs.
void parse_byte_level_normalizer(const Reader& r, const json& root, TokenizerState* st) {
  const json* norm = r.member(root, "normalizer");
  if (!norm) return;
  if (!norm->is_object()) r.bad("normalizer", "expected an object, got " + show(*norm));
  const bool seq = type_of(*norm) == "Sequence";
  const json items = seq ? norm->value("normalizers", json()) : json::array({*norm});
  if (!items.is_array()) r.bad("normalizer.normalizers", "expected an array, got " + show(*norm));
  for (size_t k = 0; k < items.size(); ++k) {
    const std::string field = seq ? cat("normalizer.normalizers[", k, "].type") : "normalizer.type";
    if (!items[k].is_object() || type_of(items[k]) != "NFC")
      r.bad(field, "unsupported " + show(items[k]) + " (only NFC, or null)");
    st->nfc = true;
  }
}

// Byte-level BPE: no normalizer or NFC; ByteLevel alone (gpt2), after Digits (smollm), or after
// a Split with the Llama 3 / Qwen2 pattern.
void parse_byte_level_components(const Reader& r, const json& root, TokenizerState* st) {
  parse_byte_level_normalizer(r, root, st);
  const json* pre = r.member(root, "pre_tokenizer");
  if (!pre) r.bad("pre_tokenizer", "missing (need type ByteLevel)");
  if (!pre->is_object()) r.bad("pre_tokenizer", "expected an object, got " + show(*pre));
  const std::string type = type_of(*pre);
  if (type == "ByteLevel") {
    check_byte_level(r, *pre, "pre_tokenizer", true);
    st->pre = PreTokenizer::gpt2;
  } else if (type == "Sequence") {
    const json* seq = r.member(*pre, "pretokenizers");
    if (!seq || !seq->is_array() || seq->size() != 2 || !(*seq)[0].is_object() ||
        !(*seq)[1].is_object() || type_of((*seq)[1]) != "ByteLevel")
      r.bad("pre_tokenizer.pretokenizers",
            "unsupported " + show(*pre) + " (only [Digits or Split, ByteLevel])");
    const json& first = (*seq)[0];
    const std::string first_type = type_of(first);
    if (first_type == "Digits") {
      if (!r.boolean(first, "individual_digits", "pre_tokenizer.pretokenizers[0].individual_digits",
                     false))
        r.bad("pre_tokenizer.pretokenizers[0].individual_digits", "false is unsupported");
      check_byte_level(r, (*seq)[1], "pre_tokenizer.pretokenizers[1]", true);
      st->pre = PreTokenizer::smollm;
    } else if (first_type == "Split") {
      const std::string field = "pre_tokenizer.pretokenizers[0]";
      const json* pattern = r.member(first, "pattern");
      const json* regex = pattern && pattern->is_object() ? r.member(*pattern, "Regex") : nullptr;
      const std::string re = regex ? r.string(*regex, field + ".pattern.Regex") : std::string();
      if (re == pre_tokenizer_split_regex(PreTokenizer::llama3))
        st->pre = PreTokenizer::llama3;
      else if (re == pre_tokenizer_split_regex(PreTokenizer::qwen2))
        st->pre = PreTokenizer::qwen2;
      else if (re == pre_tokenizer_split_regex(PreTokenizer::qwen35))
        st->pre = PreTokenizer::qwen35;
      else
        r.bad(field + ".pattern", "unsupported " + show(pattern ? *pattern : json()) +
                                      " (only the Llama 3, Qwen2 and Qwen3.5 patterns)");
      const json* behavior = r.member(first, "behavior");
      if (!behavior || *behavior != "Isolated")
        r.bad(field + ".behavior",
              "unsupported " + show(behavior ? *behavior : json()) + " (only Isolated)");
      if (r.boolean(first, "invert", field + ".invert", false))
        r.bad(field + ".invert", "true is unsupported");
      check_byte_level(r, (*seq)[1], "pre_tokenizer.pretokenizers[1]", false);
    } else {
      r.bad("pre_tokenizer.pretokenizers[0].type",
            "unsupported " + show(first_type) + " (only Digits or Split)");
    }
  } else {
    r.bad("pre_tokenizer.type",
          "unsupported " + show(type) + " (only ByteLevel, or a Sequence ending in ByteLevel)");
  }
  r.typed(root, "decoder", "ByteLevel", false);
}

bool is_replace(const json& v, std::string_view from, std::string_view to) {
  if (type_of(v) != "Replace") return false;
  const auto p = v.find("pattern"), c = v.find("content");
  return p != v.end() && p->is_object() && p->value("String", std::string()) == from &&
         c != v.end() && *c == to;
}

// SentencePiece-style: Llama 2's Prepend+Replace normalizer or a Metaspace pre-tokenizer.
void parse_spm_components(const Reader& r, const json& root, TokenizerState* st) {
  const std::string meta(kMetaSpace);
  bool replaced = false;
  if (const json* norm = r.member(root, "normalizer")) {
    json items =
        type_of(*norm) == "Sequence" ? norm->value("normalizers", json()) : json::array({*norm});
    if (!items.is_array()) r.bad("normalizer", "unsupported " + show(*norm));
    for (const json& n : items) {
      if (is_replace(n, " ", meta))
        replaced = true;
      else if (type_of(n) == "NFC")  // commutes with the others: ' ' and U+2581 are NFC-stable
        st->nfc = true;
      else if (type_of(n) == "Prepend" && n.value("prepend", std::string()) == meta)
        st->space_prefix = SpacePrefix::every;
      else
        r.bad("normalizer",
              "unsupported " + show(n) + " (only NFC, Prepend \u2581 and Replace ' ' -> \u2581)");
    }
  }
  if (const json* pre = r.member(root, "pre_tokenizer")) {
    if (!pre->is_object() || type_of(*pre) != "Metaspace")
      r.bad("pre_tokenizer.type", "unsupported " + show(*pre) + " (only Metaspace or null)");
    if (pre->value("replacement", std::string()) != meta)
      r.bad("pre_tokenizer.replacement", "unsupported (only \u2581)");
    SpacePrefix scheme = SpacePrefix::every_if_missing;
    if (const json* ps = r.member(*pre, "prepend_scheme")) {
      const std::string v = r.string(*ps, "pre_tokenizer.prepend_scheme");
      if (v == "first")
        scheme = SpacePrefix::first;
      else if (v == "never")
        scheme = SpacePrefix::none;
      else if (v != "always")
        r.bad("pre_tokenizer.prepend_scheme", "unsupported " + show(*ps));
    } else if (!r.boolean(*pre, "add_prefix_space", "pre_tokenizer.add_prefix_space", true)) {
      scheme = SpacePrefix::none;
    }
    if (st->space_prefix != SpacePrefix::none && scheme != SpacePrefix::none)
      r.bad("pre_tokenizer.prepend_scheme", "the normalizer already prepends \u2581");
    if (st->space_prefix == SpacePrefix::none) st->space_prefix = scheme;
    st->split_at_spaces = r.boolean(*pre, "split", "pre_tokenizer.split", true);
    replaced = true;
  }
  if (!replaced)
    r.bad("normalizer",
          "byte_fallback BPE needs a normalizer or Metaspace pre_tokenizer that "
          "maps ' ' to \u2581");
  if (const json* dec = r.member(root, "decoder")) {
    json items = type_of(*dec) == "Sequence" ? dec->value("decoders", json()) : json::array({*dec});
    if (!items.is_array()) r.bad("decoder", "unsupported " + show(*dec));
    for (const json& d : items) {
      const std::string t = type_of(d);
      if (t != "Replace" && t != "ByteFallback" && t != "Fuse" && t != "Strip" && t != "Metaspace")
        r.bad("decoder.type",
              "unsupported " + show(d) + " (only Replace, ByteFallback, Fuse, Strip, Metaspace)");
    }
  }
}

// Id of the special token a TemplateProcessing post-processor puts first, or "" (Llama adds
// bos this way).
std::string leading_special(const json& root) {
  const auto pp = root.find("post_processor");
  if (pp == root.end() || !pp->is_object()) return {};
  std::vector<json> procs = {*pp};
  if (type_of(*pp) == "Sequence" && pp->value("processors", json()).is_array())
    for (const json& p : (*pp)["processors"]) procs.push_back(p);
  for (const json& p : procs) {
    if (!p.is_object() || type_of(p) != "TemplateProcessing") continue;
    const json single = p.value("single", json());
    if (single.is_array() && !single.empty() && single[0].is_object() &&
        single[0].contains("SpecialToken") && single[0]["SpecialToken"].is_object())
      return single[0]["SpecialToken"].value("id", std::string());
  }
  return {};
}

TokenizerState parse(const json& root, const std::string& src) {
  const Reader r{src};
  if (!root.is_object()) r.bad("(root)", "expected an object, got " + show(root));
  TokenizerState impl;
  const json& model = r.object(root, "model", "model");
  if (const json* t = r.member(model, "type"))
    if (!t->is_string() || t->get<std::string>() != "BPE")
      r.bad("model.type", "unsupported " + show(*t) + " (only BPE)");
  if (const json* d = r.member(model, "dropout"))
    if (!d->is_number() || d->get<double>() != 0.0)
      r.bad("model.dropout", "unsupported " + show(*d) + " (only null)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const std::string field = cat("model.", key);
    if (const json* v = r.member(model, key))
      if (!r.string(*v, field).empty()) r.bad(field, "unsupported " + show(*v) + " (only null)");
  }
  r.boolean(model, "fuse_unk", "model.fuse_unk", false);
  const json* pre = r.member(root, "pre_tokenizer");
  const bool spm = r.boolean(model, "byte_fallback", "model.byte_fallback", false) ||
                   (pre && pre->is_object() && type_of(*pre) == "Metaspace");
  if (spm) {
    impl.model = TokenizerModel::sentencepiece_bpe;
    parse_spm_components(r, root, &impl);
  } else {
    parse_byte_level_components(r, root, &impl);
  }
  impl.ignore_merges = r.boolean(model, "ignore_merges", "model.ignore_merges", false);

  const json& vocab = r.object(model, "vocab", "model.vocab");
  static const json kEmpty = json::array();
  const json* added_json = r.member(root, "added_tokens");
  if (!added_json) added_json = &kEmpty;
  if (!added_json->is_array()) r.bad("added_tokens", "expected an array, got " + show(*added_json));
  const int64_t bound = static_cast<int64_t>(vocab.size() + added_json->size());

  for (size_t k = 0; k < added_json->size(); ++k) {
    const json& a = (*added_json)[k];
    const std::string field = cat("added_tokens[", k, "]");
    if (!a.is_object()) r.bad(field, "expected an object, got " + show(a));
    AddedToken t;
    const json* id = r.member(a, "id");
    if (!id) r.bad(field + ".id", "missing");
    t.id = static_cast<int32_t>(r.id(*id, field + ".id", bound));
    const json* content = r.member(a, "content");
    if (!content) r.bad(field + ".content", "missing");
    t.content = r.string(*content, field + ".content");
    if (t.content.empty()) r.bad(field + ".content", "empty");
    t.special = r.boolean(a, "special", field + ".special", false);
    t.normalized = r.boolean(a, "normalized", field + ".normalized", false);
    if (r.boolean(a, "single_word", field + ".single_word", false))
      r.bad(field + ".single_word", "true is unsupported");
    t.lstrip = r.boolean(a, "lstrip", field + ".lstrip", false);
    t.rstrip = r.boolean(a, "rstrip", field + ".rstrip", false);
    impl.added.push_back(std::move(t));
  }

  // id -> raw bytes; vocab entries that are added tokens keep their literal content.
  std::vector<std::string> tokens(bound);
  std::vector<uint8_t> assigned(bound, 0);
  std::unordered_map<int32_t, const AddedToken*> added_by_id;
  for (const AddedToken& t : impl.added) added_by_id[t.id] = &t;
  std::unordered_map<std::string, int32_t> id_of_key;
  id_of_key.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const std::string field = cat("model.vocab[", show(json(it.key())), "]");
    const auto id = static_cast<int32_t>(r.id(it.value(), field, bound));
    if (assigned[id]) r.bad(field, cat("id ", id, " is used twice"));
    assigned[id] = 1;
    id_of_key.emplace(it.key(), id);
    const auto a = added_by_id.find(id);
    if (a != added_by_id.end()) {
      if (a->second->content != it.key())
        r.bad(field, cat("id ", id, " is added token ", show(json(a->second->content))));
      tokens[id] = it.key();
    } else if (spm) {
      tokens[id] = it.key();
    } else if (!vocab_string_to_bytes(it.key(), &tokens[id])) {
      tokens[id] = it.key();
      impl.verbatim.push_back(id);
    }
  }
  for (const AddedToken& t : impl.added) {
    if (assigned[t.id]) continue;
    assigned[t.id] = 1;
    tokens[t.id] = t.content;
  }
  int64_t n = 0;
  while (n < bound && assigned[n]) ++n;
  for (int64_t id = n; id < bound; ++id)
    if (assigned[id]) r.bad("model.vocab", cat("ids are not contiguous: id ", n, " is missing"));
  tokens.resize(n);
  impl.tokens = std::move(tokens);

  const json* merges = r.member(model, "merges");
  if (!merges) merges = &kEmpty;
  if (!merges->is_array()) r.bad("model.merges", "expected an array, got " + show(*merges));
  impl.merges.reserve(merges->size());
  for (size_t k = 0; k < merges->size(); ++k) {
    const json& m = (*merges)[k];
    const std::string field = cat("model.merges[", k, "]");
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        r.bad(field, "expected \"left right\" with one space, got " + show(m));
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2) {
      a = r.string(m[0], field + "[0]"), b = r.string(m[1], field + "[1]");
    } else {
      r.bad(field, "expected \"left right\" or [\"left\", \"right\"], got " + show(m));
    }
    const auto ia = id_of_key.find(a), ib = id_of_key.find(b);
    if (ia == id_of_key.end()) r.bad(field, cat("token ", show(json(a)), " is not in model.vocab"));
    if (ib == id_of_key.end()) r.bad(field, cat("token ", show(json(b)), " is not in model.vocab"));
    impl.merges.emplace_back(ia->second, ib->second);
  }
  // Special ids: tokenizer.json names only unk; bos from the post-processor, else by name.
  auto id_of = [&](const std::string& key) {
    const auto it = id_of_key.find(key);
    if (it != id_of_key.end()) return it->second;
    for (const AddedToken& t : impl.added)
      if (t.content == key) return t.id;
    return int32_t{-1};
  };
  if (const json* unk = r.member(model, "unk_token")) {
    impl.special.unk = id_of(r.string(*unk, "model.unk_token"));
    if (impl.special.unk < 0) r.bad("model.unk_token", show(*unk) + " is not in model.vocab");
  }
  const std::string lead = leading_special(root);
  impl.special.add_bos = !lead.empty() && id_of(lead) >= 0;
  for (const char* name : {"<s>", "<|begin_of_text|>", "<|startoftext|>"})
    if (impl.special.bos < 0) impl.special.bos = id_of(name);
  if (impl.special.add_bos) impl.special.bos = id_of(lead);
  for (const char* name : {"</s>", "<|end_of_text|>", "<|endoftext|>"})
    if (impl.special.eos < 0) impl.special.eos = id_of(name);
  impl.finalize(src);
  return impl;
}

}  // namespace

Tokenizer Tokenizer::from_json_text(std::string_view text, const std::string& source_name) {
  json root;
  try {
    root = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    fail("[tokenizer] ", source_name, ": not valid JSON: ", e.what());
  }
  Tokenizer t;
  try {
    static_cast<TokenizerState&>(*t.impl_) = parse(root, source_name);
  } catch (const json::exception& e) {  // a type mismatch the checks above did not foresee
    fail("[tokenizer] ", source_name, ": malformed: ", e.what());
  }
  return t;
}

Tokenizer Tokenizer::load_json(const std::string& path) {
  return from_json_text(read_text_file(path), path);
}

}  // namespace tessera::tokenizer
