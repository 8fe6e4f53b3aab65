// Hugging Face tokenizer.json for byte-level BPE: a reader that treats the file as hostile and a
// writer whose output the `tokenizers` library loads. Merges are read as "a b" or ["a", "b"].
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"
#include "model/tokenizer.h"
#include "model/tokenizer_impl.h"
#include "model/tokenizer_pretokenize.h"

namespace tessera::model {
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

TokenizerState parse(const json& root, const std::string& src) {
  const Reader r{src};
  if (!root.is_object()) r.bad("(root)", "expected an object, got " + show(root));
  if (r.member(root, "normalizer"))
    r.bad("normalizer", "unsupported " + show(root["normalizer"]) + " (only null)");
  const json* pre = r.typed(root, "pre_tokenizer", "ByteLevel", true);
  if (r.boolean(*pre, "add_prefix_space", "pre_tokenizer.add_prefix_space", false))
    r.bad("pre_tokenizer.add_prefix_space", "true is unsupported (decode would not round-trip)");
  if (!r.boolean(*pre, "use_regex", "pre_tokenizer.use_regex", true))
    r.bad("pre_tokenizer.use_regex", "false is unsupported (only the GPT-2 pattern)");
  r.typed(root, "decoder", "ByteLevel", false);
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
  r.boolean(model, "byte_fallback", "model.byte_fallback", false);  // moot: all bytes are tokens
  r.boolean(model, "fuse_unk", "model.fuse_unk", false);
  TokenizerState impl;
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
    for (const char* key : {"single_word", "lstrip", "rstrip"})
      if (r.boolean(a, key, cat(field, ".", key), false))
        r.bad(cat(field, ".", key), "true is unsupported");
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
    } else if (!vocab_string_to_bytes(it.key(), &tokens[id])) {
      r.bad(field, "not a byte-level token string (chars outside GPT-2's byte alphabet)");
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
  impl.finalize(src);
  return impl;
}

// JSON string literal for UTF-8 text (contents are valid UTF-8: checked on read and in training).
std::string quote(const std::string& s) {
  return json(s).dump();
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

std::string Tokenizer::to_json_text() const {
  const Impl& m = *impl_;
  // Written by hand rather than through a json object: nlohmann's object sorts keys, and the
  // vocabulary reads best in id order.
  std::string s = "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n";
  s += "  \"added_tokens\": [";
  for (size_t k = 0; k < m.added.size(); ++k) {
    const AddedToken& a = m.added[k];
    s += cat(k ? ",\n" : "\n", "    {\"id\": ", a.id, ", \"content\": ", quote(a.content),
             ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, \"normalized\": ",
             a.normalized ? "true" : "false", ", \"special\": ", a.special ? "true" : "false", "}");
  }
  s += m.added.empty() ? "],\n" : "\n  ],\n";
  s += "  \"normalizer\": null,\n";
  s += "  \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
       "\"trim_offsets\": true, \"use_regex\": true},\n";
  s += "  \"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
       "\"trim_offsets\": false, \"use_regex\": true},\n";
  s += "  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
       "\"trim_offsets\": true, \"use_regex\": true},\n";
  s += "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n    \"unk_token\": null,\n"
       "    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n"
       "    \"fuse_unk\": false,\n    \"byte_fallback\": false,\n";
  if (m.ignore_merges) s += "    \"ignore_merges\": true,\n";
  s += "    \"vocab\": {";
  std::vector<std::string> keys(m.tokens.size());
  for (size_t id = 0; id < m.tokens.size(); ++id) {
    keys[id] = m.is_added[id] ? m.tokens[id] : bytes_to_vocab_string(m.tokens[id]);
    s += cat(id ? ",\n" : "\n", "      ", quote(keys[id]), ": ", id);
  }
  s += "\n    },\n    \"merges\": [";
  for (size_t r = 0; r < m.merges.size(); ++r)
    s += cat(r ? ",\n" : "\n", "      ",
             quote(keys[m.merges[r].first] + " " + keys[m.merges[r].second]));
  s += m.merges.empty() ? "]\n  }\n}\n" : "\n    ]\n  }\n}\n";
  return s;
}

void Tokenizer::save_json(const std::string& path) const {
  write_file_atomic(path, to_json_text());
}

}  // namespace tessera::model
