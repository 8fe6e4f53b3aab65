// tokenizer_config.json's special tokens onto a tokenizer read from tokenizer.json, which names
// only unk: without them a folder's bos, pad and unk ids were guessed by name or lost, and eos
// became <|endoftext|> (0) where the model ends its turns with <|im_end|> (2).
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace tessera::tokenizer {

void apply_tokenizer_config(std::string_view json_text, const std::string& source, Tokenizer* tok) {
  using nlohmann::json;
  const json j = json::parse(json_text.begin(), json_text.end(), nullptr, false);
  TS_CHECK(!j.is_discarded() && j.is_object(), "[tokenizer] ", source, ": not a JSON object");
  SpecialTokens s = tok->special_tokens();
  // A token is written as its text or as an AddedToken object {"content": text, ...}; null or
  // absent leaves the id as tokenizer.json gave it.
  auto read = [&](const char* key, int32_t* id) {
    if (!j.contains(key) || j[key].is_null()) return;
    const json& v = j[key];
    const json* text = &v;
    if (v.is_object()) {
      TS_CHECK(v.contains("content") && v["content"].is_string(), "[tokenizer] ", source,
               ": field '", key, "' is an object without a string 'content'");
      text = &v["content"];
    }
    TS_CHECK(text->is_string(), "[tokenizer] ", source, ": field '", key,
             "' must be a string or an object with 'content', got ", v.dump());
    const int32_t found = tok->token_id(text->get<std::string>());
    TS_CHECK(found >= 0, "[tokenizer] ", source, ": field '", key, "' names ", text->dump(),
             ", which is not in the tokenizer's vocabulary");
    *id = found;
  };
  read("bos_token", &s.bos);
  read("eos_token", &s.eos);
  read("pad_token", &s.pad);
  read("unk_token", &s.unk);
  if (j.contains("add_bos_token") && !j["add_bos_token"].is_null()) {
    TS_CHECK(j["add_bos_token"].is_boolean(), "[tokenizer] ", source,
             ": field 'add_bos_token' must be true or false, got ", j["add_bos_token"].dump());
    s.add_bos = j["add_bos_token"].get<bool>();
  }
  TS_CHECK(!s.add_bos || s.bos >= 0, "[tokenizer] ", source,
           ": 'add_bos_token' is true but no bos token is known");
  tok->set_special_tokens(s);
}

}  // namespace tessera::tokenizer
