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
  cfg["add_bos_token"] = sp.add_bos;
  write_file_atomic((std::filesystem::path(path) / "tokenizer_config.json").string(),
                    cfg.dump(2) + "\n");
}

}  // namespace tessera::cli
