// Loading a model with its tokenizer and chat template (GGUF metadata, or a Hugging Face folder's
// tokenizer.json, tokenizer_config.json and chat_template.jinja).
#include "infer/loaded_model.h"

#include <filesystem>

#include "core/error.h"
#include "core/file_io.h"
#include "formats/gguf.h"
#include "nlohmann/json.hpp"

namespace tessera::infer {

LoadedModel load_model_and_tokenizer(const std::string& path, const model::DecoderLoadOptions& opts,
                                     bool tokenizer_optional) {
  LoadedModel m;
  m.model = model::load_decoder(path, opts);
  const bool gguf_has_tokenizer = m.model.gguf && m.model.gguf->has("tokenizer.ggml.model");
  const bool folder_has_tokenizer =
      !m.model.gguf && file_exists((std::filesystem::path(path) / "tokenizer.json").string());
  if (tokenizer_optional && !gguf_has_tokenizer && !folder_has_tokenizer) return m;
  m.has_tokenizer = true;
  if (m.model.gguf) {
    m.tok = tokenizer::Tokenizer::from_gguf(*m.model.gguf);
    if (m.model.gguf->has("tokenizer.chat_template"))
      m.chat_template = m.model.gguf->get_string("tokenizer.chat_template");
  } else {
    const std::string tok_path = (std::filesystem::path(path) / "tokenizer.json").string();
    TS_CHECK(file_exists(tok_path), "[model] ", path, ": no tokenizer.json in the folder");
    m.tok = tokenizer::Tokenizer::load_json(tok_path);
    // HF keeps the chat template in tokenizer_config.json.
    const std::string cfg = (std::filesystem::path(path) / "tokenizer_config.json").string();
    // transformers 5 writes the template as chat_template.jinja beside tokenizer_config.json,
    // and reads it from there first.
    const std::string jinja_file = (std::filesystem::path(path) / "chat_template.jinja").string();
    if (file_exists(jinja_file)) m.chat_template = read_text_file(jinja_file);
    if (file_exists(cfg)) {
      const std::string text = read_text_file(cfg);
      tokenizer::apply_tokenizer_config(text, cfg, &m.tok);
      const auto j = nlohmann::json::parse(text, nullptr, false);
      TS_CHECK(!j.is_discarded() && j.is_object(), "[model] ", cfg, ": not a JSON object");
      if (j.contains("chat_template") && m.chat_template.empty()) {
        const auto& t = j["chat_template"];
        // A string, or a list of {name, template} where "default" is the one to use.
        if (t.is_string()) m.chat_template = t.get<std::string>();
        if (t.is_array())
          for (const auto& e : t)
            if (e.is_object() && e.value("name", "") == "default" && e["template"].is_string())
              m.chat_template = e["template"].get<std::string>();
      }
    }
  }
  TS_CHECK(m.tok.vocab_size() <= m.model.config.vocab, "[model] ", path, ": the tokenizer has ",
           m.tok.vocab_size(), " tokens, more than the model's ", m.model.config.vocab, " rows");
  return m;
}

}  // namespace tessera::infer
