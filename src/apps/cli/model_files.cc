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
  if (m.has_tokenizer) tokenizer::write_hf_tokenizer_config(path, m.tok, m.chat_template);
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
