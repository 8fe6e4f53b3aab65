// Writing a loaded model (with its tokenizer and chat template) as GGUF or as a Hugging Face
// folder, for `convert` and `quantize`.
#pragma once

#include <cstdint>
#include <string>

#include "apps/cli/infer_flags.h"
#include "core/dtype.h"

namespace tessera::cli {

// True when `path` names a GGUF file (by its .gguf suffix); otherwise it is a folder.
bool is_gguf_path(const std::string& path);
// Writes `model` with m's tokenizer and chat template to `path`: GGUF keeps the stored types;
// a folder gets config.json (with the bos/eos/pad ids), generation_config.json,
// model.safetensors in `folder_dtype` (f32, bf16, f16), tokenizer.json and tokenizer_config.json
// (with the chat template and the special tokens).
void save_model(const LoadedModel& m, const model::DecoderModel& model, const std::string& path,
                DType folder_dtype);
// Bytes written at `path`: a file's size, or a folder's *.safetensors.
int64_t bytes_on_disk(const std::string& path);

}  // namespace tessera::cli
