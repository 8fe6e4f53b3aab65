// The model's tokenizer and template, loaded once, rendering a chat JSONL into masked shards.
#include "apps/cli/chat_prepare.h"

#include <filesystem>

#include "core/error.h"
#include "infer/loaded_model.h"
#include "train/chat_data.h"

namespace tessera::cli {

train::PrepareStats prepare_chat_for_model(const std::string& flag, const std::string& model,
                                           const std::string& in, const std::string& out,
                                           double val_fraction, int64_t min_tokens,
                                           int64_t pad_to) {
  TS_CHECK(model.ends_with(".gguf") || std::filesystem::is_directory(model), flag, " ", model,
           ": chat data needs a model (a .gguf file or Hugging Face folder) whose chat template "
           "renders the conversations");
  model::DecoderLoadOptions lo;
  lo.mmap = true;
  const infer::LoadedModel m = infer::load_model_and_tokenizer(model, lo, false);
  TS_CHECK(!m.chat_template.empty(), flag, " ", model,
           ": the model has no chat template to render the conversations with");
  const tokenizer::SpecialTokens& sp = m.tok.special_tokens();
  train::ChatTemplate t;
  t.source = m.chat_template;
  t.name = model + " chat template";
  t.bos = sp.bos >= 0 ? m.tok.decode({sp.bos}) : "";
  t.eos = sp.eos >= 0 ? m.tok.decode({sp.eos}) : "";
  train::PrepareChatOptions o;
  o.input_path = in;
  o.out_dir = out;
  o.tokenizer_json = m.tok.to_json_text();
  o.val_fraction = val_fraction;
  o.min_tokens = min_tokens;
  o.pad_to = pad_to;
  return train::prepare_chat_data(o, m.tok, t);
}

}  // namespace tessera::cli
