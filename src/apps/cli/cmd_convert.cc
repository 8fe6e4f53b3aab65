// `tessera convert IN OUT`: a GGUF file to a Hugging Face folder or back (config, weights,
// tokenizer and chat template); weights keep their stored type where the format allows. With
// --lora, a PEFT adapter is merged into the weights first.
#include <cstdio>
#include <string>
#include <vector>

#include "apps/cli/args.h"
#include "apps/cli/infer_flags.h"
#include "apps/cli/model_files.h"
#include "core/error.h"
#include "model/lora.h"

namespace tessera::cli {
namespace {

// The folder type that loses nothing: f32 unless every matrix is already bf16 (or f16).
DType lossless_folder_dtype(const model::DecoderModel& m) {
  bool all_bf16 = true, all_f16 = true;
  for (const model::DecoderLayer& l : m.weights.layers)
    for (const model::WeightRef* r : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_up, &l.w_down}) {
      all_bf16 &= r->type == DType::bf16;
      all_f16 &= r->type == DType::f16;
    }
  return all_bf16 ? DType::bf16 : all_f16 ? DType::f16 : DType::f32;
}

int run(const Args& a) {
  const std::string dtype = a.str("--dtype");
  const std::string& in = a.positional()[0];
  const std::string& out = a.positional()[1];
  LoadedModel m = load_model_and_tokenizer(in, {}, true);
  const std::string lora = a.str("--lora");
  if (!lora.empty()) {
    model::apply_peft_adapter(m.model, lora);
    // A GGUF keeps each matrix's type (a quantized one rounds the merged values again); a folder
    // is written in floats, so the merge is kept in f32 for it.
    const bool keep_types = is_gguf_path(out);
    const int64_t n = model::merge_adapters(m.model, keep_types);
    std::printf("merged %s into %lld matrices (%s)\n", lora.c_str(), static_cast<long long>(n),
                keep_types ? "stored back in their types" : "in f32");
  }
  const DType folder =
      dtype.empty() ? lossless_folder_dtype(m.model) : parse_dtype(dtype, "--dtype");
  save_model(m, m.model, out, folder);
  std::printf("wrote %s (%s, %lld layers): %.1f MB of weights read, %.1f MB written\n", out.c_str(),
              is_gguf_path(out) ? "GGUF" : dtype_name(folder).data(),
              static_cast<long long>(m.model.config.n_layers),
              static_cast<double>(m.model.total_weight_bytes()) / 1e6,
              static_cast<double>(bytes_on_disk(out)) / 1e6);
  return 0;
}

const Registrar reg({
    "convert",
    "convert between GGUF and Hugging Face folders",
    {Flag::text("--dtype", "",
                "weight type of a folder: f32, bf16 or f16; empty: the one that loses nothing",
                "TYPE"),
     Flag::text("--lora", "", "a LoRA adapter folder (PEFT's files) merged into the weights",
                "DIR")},
    {{"IN", "a .gguf file or a Hugging Face folder"},
     {"OUT", "a .gguf file (by its suffix) or a Hugging Face folder"}},
    &run,
    {},
});

}  // namespace
}  // namespace tessera::cli
