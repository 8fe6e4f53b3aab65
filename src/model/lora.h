// LoRA adapters: which matrices get them, their names in PEFT's files, and the files themselves
// (adapter_config.json + adapter_model.safetensors, as Hugging Face's peft writes and reads them).
// An adapter applied to a model is a LoraRef on its layer (model/decoder.h): the forward adds its
// low-rank term, the backward trains it (TrainModel's LoRA mode), and merge_adapters folds it into
// the matrix it adapts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/decoder.h"

namespace tessera::model {

struct LoraSpec {
  int64_t rank = 0;  // r; 0: no adapters
  double alpha = 0;  // the term is scaled by alpha / r
  std::vector<LayerMatrix> targets = {LayerMatrix::q, LayerMatrix::k, LayerMatrix::v,
                                      LayerMatrix::o};
  float scale() const { return static_cast<float>(alpha / static_cast<double>(rank)); }
};

// "q,k,v,o,gate,up,down" (PEFT's module names q_proj, ..., down_proj are accepted too; "all" is
// all seven) into targets, in layer order without repeats; throws naming `flag` and the entry.
std::vector<LayerMatrix> parse_lora_targets(const std::string& list, const std::string& flag);
const char* lora_target_name(LayerMatrix m);  // "q", ..., "down"
// The module's name in a Llama-family Hugging Face model: "model.layers.3.self_attn.q_proj".
std::string lora_module_name(int64_t layer, LayerMatrix m);
// PEFT's tensor names for that module's adapter: base_model.model.<module>.lora_A.weight (r, in)
// and .lora_B.weight (out, r).
std::string peft_a_name(int64_t layer, LayerMatrix m);
std::string peft_b_name(int64_t layer, LayerMatrix m);

// Throws naming `source` unless spec fits the model: a Llama-family model (GPT-2's q, k and v are
// one module in PEFT's files, c_attn, which these per-matrix adapters do not express), a rank in
// [1, the smallest dimension of every target matrix], targets the model has.
void check_lora_spec(const DecoderConfig& c, const LoraSpec& spec, const std::string& source);

// Writes m's adapters (every present LoraRef, f32 on the host) as a PEFT adapter in `dir`:
// adapter_model.safetensors with PEFT's names and adapter_config.json (peft_type LORA, r,
// lora_alpha, target_modules, base_model_name_or_path = base, task_type CAUSAL_LM, ...). The q/k
// rows of a model in GGUF's interleaved RoPE order are permuted back to Hugging Face's, as the
// HF writer does for the weights. Creates dir if needed; files written atomically.
void save_peft_adapter(const DecoderModel& m, const LoraSpec& spec, const std::string& base,
                       const std::string& dir);

// Reads the PEFT adapter in `dir` (a folder with adapter_config.json and
// adapter_model.safetensors; f32, bf16 or f16 tensors) and attaches it to m's layers as f32
// LoraRefs whose memory m then owns; q/k rows are permuted into m's RoPE order and the scale
// (alpha / r, or rsLoRA's alpha / sqrt(r)) folded into B, so the LoraRefs' scale is 1. Refuses
// by name what it cannot apply exactly: DoRA, trained biases, modules_to_save, per-module rank
// or alpha patterns, a module m lacks, a shape that does not fit, an adapter already applied.
// Returns the spec it found.
LoraSpec apply_peft_adapter(DecoderModel& m, const std::string& dir);

// Folds every adapter of m into the matrix it adapts, W + scale B A, stored back in W's type (a
// block type is quantized again: the merged model differs from the adapted one by that
// rounding) or, with keep_types false, as f32; in new buffers m owns. Then removes the
// adapters. Interleaved CPU layouts are refused (load without cpu_layout to merge). Returns the
// number of matrices merged.
int64_t merge_adapters(DecoderModel& m, bool keep_types = true);

}  // namespace tessera::model
