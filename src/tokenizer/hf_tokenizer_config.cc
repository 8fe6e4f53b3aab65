// A Hugging Face folder's tokenizer side beyond tokenizer.json: tokenizer_config.json's special
// tokens read onto a tokenizer (tokenizer.json names only unk: without them a folder's bos, pad
// and unk ids were guessed by name or lost, and eos became <|endoftext|> (0) where the model ends
// its turns with <|im_end|> (2)), and the files transformers reads them from written.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"
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

void write_hf_tokenizer_config(const std::string& folder, const Tokenizer& tok,
                               const std::string& chat_template) {
  using nlohmann::json;
  json cfg = json::object();
  if (!chat_template.empty()) cfg["chat_template"] = chat_template;
  const SpecialTokens& sp = tok.special_tokens();
  if (sp.bos >= 0) cfg["bos_token"] = tok.decode({sp.bos});
  if (sp.eos >= 0) cfg["eos_token"] = tok.decode({sp.eos});
  if (sp.pad >= 0) cfg["pad_token"] = tok.decode({sp.pad});
  if (sp.unk >= 0) cfg["unk_token"] = tok.decode({sp.unk});
  cfg["add_bos_token"] = sp.add_bos;
  const std::filesystem::path dir(folder);
  write_file_atomic((dir / "tokenizer_config.json").string(), cfg.dump(2) + "\n");
  // transformers 5 keeps the template in its own file and reads it from there first; 4.x reads
  // the copy in tokenizer_config.json.
  if (!chat_template.empty())
    write_file_atomic((dir / "chat_template.jinja").string(), chat_template);
  // The ids transformers' generate() reads: without eos_token_id it never stops at the end of
  // a turn. They go into config.json (beside the model's fields) and generation_config.json,
  // which generate() prefers.
  // An absent bos or eos is written as null: left out, transformers would take the model
  // type's default (GPT-2's 50256, outside a small trained vocabulary).
  json ids = json::object();
  ids["bos_token_id"] = sp.bos >= 0 ? json(sp.bos) : json(nullptr);
  ids["eos_token_id"] = sp.eos >= 0 ? json(sp.eos) : json(nullptr);
  if (sp.pad >= 0) ids["pad_token_id"] = sp.pad;
  const std::string config_path = (dir / "config.json").string();
  TS_CHECK(file_exists(config_path), "[tokenizer] ", config_path,
           ": write the model's config.json before the tokenizer's ids");
  json config = json::parse(read_text_file(config_path), nullptr, false);
  TS_CHECK(!config.is_discarded() && config.is_object(), "[tokenizer] ", config_path,
           ": not a JSON object");
  for (const auto& [k, v] : ids.items()) config[k] = v;
  write_file_atomic(config_path, config.dump(2) + "\n");
  json gen = ids;
  gen["_from_model_config"] = true;
  write_file_atomic((dir / "generation_config.json").string(), gen.dump(2) + "\n");
}

}  // namespace tessera::tokenizer
