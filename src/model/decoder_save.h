// Writers for decoder models: GGUF v3 with llama.cpp's names and metadata, and Hugging Face
// folders (config.json + model.safetensors) in f32, bf16 or f16.
#pragma once

#include <functional>
#include <string>

#include "core/dtype.h"
#include "formats/gguf.h"
#include "model/decoder.h"

namespace tessera::model {

// Writes GGUF v3 with llama.cpp's tensor names and metadata (general.architecture llama|gpt2,
// <arch>.block_count, context_length, embedding_length, feed_forward_length, attention.*,
// rope.*). Matrices keep their stored type, norms and biases are written as f32. Llama q/k rows
// (and biases) are permuted to GGUF's interleaved RoPE order when the model is in half layout,
// and written as they are when already interleaved; GPT-2 q/k/v are fused into attn_qkv. Llama
// 3 RoPE scaling is written as llama.cpp does (tensor rope_freqs.weight of per-pair divisors)
// plus its parameters under llama.rope.scaling.*. `extra` adds metadata (the tokenizer's keys)
// before writing.
void save_decoder_gguf(const DecoderModel& m, const std::string& path,
                       const std::function<void(formats::GgufWriter&)>& extra = {});

// Writes an HF folder: config.json (LlamaForCausalLM, Qwen2ForCausalLM when q/k/v carry biases
// and o does not, Qwen3ForCausalLM with q/k norms, Gemma3ForCausalLM with post-norms, or
// GPT2LMHeadModel; a mixture of experts as OlmoeForCausalLM with whole-vector q/k norms,
// Qwen3MoeForCausalLM with per-head ones, else MixtralForCausalLM, each expert its own tensors)
// + model.safetensors with every tensor in `dtype` (f32,
// bf16 or f16; quantized weights are dequantized). Interleaved q/k rows are permuted back to
// HF's rotate-half order. `tokenizer_json` (if non-empty) is written as tokenizer.json. Throws
// when the model has per-pair RoPE divisors that config.json cannot express.
void save_decoder_hf(const DecoderModel& m, const std::string& folder, DType dtype,
                     const std::string& tokenizer_json = "");

}  // namespace tessera::model
