// Chat data prepared with a model file's own tokenizer and chat template: what `prepare --chat`
// and `finetune` share.
#pragma once

#include <cstdint>
#include <string>

#include "train/data.h"

namespace tessera::cli {

// Loads the model's tokenizer and chat template from `model` (a .gguf file or Hugging Face
// folder; refused naming `flag` when it is neither or has no template) and writes the
// conversations of the JSONL `in` as masked shards in `out` (train::prepare_chat_data; pad_to as
// there).
train::PrepareStats prepare_chat_for_model(const std::string& flag, const std::string& model,
                                           const std::string& in, const std::string& out,
                                           double val_fraction, int64_t min_tokens, int64_t pad_to);

}  // namespace tessera::cli
