// Post-training quantization of a decoder model's weight matrices to a block type (q8_0, q4_0,
// q4_1, k-quants) with per-tensor error statistics.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "model/decoder.h"

namespace tessera::compress {

// Error of one converted tensor, measured against the source values dequantized to f32.
struct TensorQuantStats {
  std::string name;                          // GGUF-style: "token_embd", "blk.3.attn_q", "output"
  DType from = DType::f32, to = DType::f32;  // `to` differs from the requested type on fallback
  int64_t elements = 0;
  double rms_error = 0, max_error = 0, rms_value = 0;
};

// How matrices other than the output head are typed. uniform: all `type`. k_m (with q4_k or
// q5_k: the "_M" files people download): attn_v and ffn_down get q6_k in the layers where an
// error costs most (the first and last eighth, and every third between), the others `type`.
enum class QuantMix { uniform, k_m };

struct QuantizeOptions {
  DType type = DType::q8_0;  // target for 2-D weight matrices
  QuantMix mix = QuantMix::uniform;
  // The output head's type (the token embedding when the head is tied to it). Empty: automatic,
  // q6_k (q8_0 where its rows are not whole 256-element super-blocks) for every target coarser
  // than those, else `type`: the head's error reaches every logit, and llama-quantize keeps it
  // there too (a q4_0 head cost SmolLM2 8.7% perplexity). The untied token embedding is `type`.
  std::optional<DType> output_type;
  bool keep_embedding = false;  // token embedding (and a head tied to it) stays as is
  ThreadPool* pool = nullptr;   // nullptr: default_pool()
};

// "q4_k_m" -> q4_k with QuantMix::k_m, "q5_k_m" likewise; any other name through parse_dtype.
// Throws naming `what` on an unknown name.
void parse_quant_type(std::string_view name, std::string_view what, QuantizeOptions* opts);
// The head's type under `opts` (see QuantizeOptions::output_type), before row fallbacks.
DType output_type_for(const QuantizeOptions& opts);
// Whether layer `layer` of `n_layers` takes the k_m mix's extra bits.
bool k_m_layer_gets_more_bits(int64_t layer, int64_t n_layers);

// Returns a model with every 2-D weight converted to opts.type, or the type opts.mix and
// opts.output_type give it (norm vectors and biases become f32); a tensor whose row length is not a
// multiple of the type's block size falls back to the closest type that fits (k-quants -> q8_0 ->
// f16), which its stats show. A tensor already in the target type is copied unchanged. The output
// holds its own buffers (the source may be released). Rows are converted in parallel; results do
// not depend on the thread count.
model::DecoderModel quantize_decoder(const model::DecoderModel& src, const QuantizeOptions& opts,
                                     std::vector<TensorQuantStats>* stats);

// The type a row of `cols` elements gets when `wanted` is asked for (see quantize_decoder).
DType quant_type_for_row(DType wanted, int64_t cols);

}  // namespace tessera::compress
