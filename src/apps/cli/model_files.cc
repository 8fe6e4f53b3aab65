// GGUF / HF folder output for convert and quantize.
#include "apps/cli/model_files.h"

#include <filesystem>

#include "core/error.h"
#include "core/file_io.h"
#include "formats/gguf.h"
#include "model/decoder_save.h"
#include "nlohmann/json.hpp"

namespace tessera::cli {

bool is_gguf_path(const std::string& path) {
  return path.size() > 5 && path.compare(path.size() - 5, 5, ".gguf") == 0;
}

void save_model(const LoadedModel& m, const model::DecoderModel& model, const std::string& path,
                DType folder_dtype) {
  if (is_gguf_path(path)) {
    model::save_decoder_gguf(model, path, [&](formats::GgufWriter& w) {
      if (m.has_tokenizer) m.tok.to_gguf(w);
      if (!m.chat_template.empty()) w.set("tokenizer.chat_template", m.chat_template);
      // A GGUF source's descriptive keys (general.basename, license, languages, size label,
      // ...) carry over; the ones that describe this file's content are written fresh above.
      if (!model.gguf) return;
      for (const auto& [key, value] : model.gguf->metadata()) {
        const bool describes_content =
            key == "general.architecture" || key == "general.name" || key == "general.file_type" ||
            key == "general.quantization_version" || key == "general.alignment";
        if (key.rfind("general.", 0) == 0 && !describes_content) w.set(key, value);
      }
    });
    return;
  }
  TS_CHECK(folder_dtype == DType::f32 || folder_dtype == DType::bf16 || folder_dtype == DType::f16,
           "--dtype ", dtype_name(folder_dtype),
           ": a Hugging Face folder holds f32, bf16 or f16 (write a .gguf for block types)");
  model::save_decoder_hf(model, path, folder_dtype, m.has_tokenizer ? m.tok.to_json_text() : "");
  if (!m.has_tokenizer) return;
  nlohmann::json cfg = nlohmann::json::object();
  if (!m.chat_template.empty()) cfg["chat_template"] = m.chat_template;
  const tokenizer::SpecialTokens& sp = m.tok.special_tokens();
  if (sp.bos >= 0) cfg["bos_token"] = m.tok.decode({sp.bos});
  if (sp.eos >= 0) cfg["eos_token"] = m.tok.decode({sp.eos});
  if (sp.pad >= 0) cfg["pad_token"] = m.tok.decode({sp.pad});
  if (sp.unk >= 0) cfg["unk_token"] = m.tok.decode({sp.unk});
  cfg["add_bos_token"] = sp.add_bos;
  const std::filesystem::path dir(path);
  write_file_atomic((dir / "tokenizer_config.json").string(), cfg.dump(2) + "\n");
  // The token ids transformers' generate() reads: without eos_token_id it never stops at the end
  // of a turn. They go into config.json (beside what save_decoder_hf wrote) and into
  // generation_config.json, which generate() prefers.
  nlohmann::json ids = nlohmann::json::object();
  if (sp.bos >= 0) ids["bos_token_id"] = sp.bos;
  if (sp.eos >= 0) ids["eos_token_id"] = sp.eos;
  if (sp.pad >= 0) ids["pad_token_id"] = sp.pad;
  const std::string config_path = (dir / "config.json").string();
  nlohmann::json config = nlohmann::json::parse(read_text_file(config_path));
  for (const auto& [k, v] : ids.items()) config[k] = v;
  write_file_atomic(config_path, config.dump(2) + "\n");
  nlohmann::json gen = ids;
  gen["_from_model_config"] = true;
  write_file_atomic((dir / "generation_config.json").string(), gen.dump(2) + "\n");
}

int64_t bytes_on_disk(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(path)) return static_cast<int64_t>(fs::file_size(path));
  int64_t total = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(path))
    if (e.is_regular_file() && e.path().extension() == ".safetensors")
      total += static_cast<int64_t>(e.file_size());
  return total;
}

}  // namespace tessera::cli
