// A model ready to serve: the decoder with its tokenizer and the chat template its file carries,
// loaded from a GGUF file or a Hugging Face folder. Shared by every command and the server.
#pragma once

#include <string>

#include "model/decoder.h"
#include "tokenizer/tokenizer.h"

namespace tessera::infer {

struct LoadedModel {
  model::DecoderModel model;
  tokenizer::Tokenizer tok;
  std::string chat_template;  // jinja text the file carries, or empty
  bool has_tokenizer = false;
};

// A GGUF file (tokenizer from its metadata) or a Hugging Face folder (tokenizer.json, the chat
// template from chat_template.jinja or tokenizer_config.json). With tokenizer_optional, a file
// without one loads (has_tokenizer false): quantize and convert of synthetic benchmark models.
LoadedModel load_model_and_tokenizer(const std::string& path, const model::DecoderLoadOptions& opts,
                                     bool tokenizer_optional = false);

}  // namespace tessera::infer
