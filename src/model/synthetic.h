// Synthetic decoder models for benchmarks: the shapes of real Llama-family models with random
// weights in any stored type, built in memory in about a second (no multi-gigabyte file to
// download or write). Named by a spec "synthetic:<shape>:<type>", e.g. "synthetic:1b:q4_0".
#pragma once

#include <string>

#include "model/decoder.h"

namespace tessera::model {

// True when `path` names a synthetic model (starts with "synthetic:").
bool is_synthetic_spec(const std::string& path);

// Shapes: 135m (SmolLM2-135M: 30 layers, width 576, MLP 1536, 9/3 heads, vocabulary 49152, tied),
// 1b (TinyLlama-1.1B: 22, 2048, 5632, 32/4, 32000), 8b (Llama-3-8B: 32, 4096, 14336, 32/8,
// 128256), moe-8x1b (1b with 8 experts of width 5632, 2 per token: 6.4B parameters, 1.8B of
// them read per token), dense-8x1b (1b with an MLP of 8 x 5632: the same parameter count). Types:
// f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k..q6_k (the k-quants need widths that are
// multiples of 256, which 135m's are not). Matrix values are N(0, 0.02^2) quantized to the type; a
// block of rows is drawn once and repeated down each matrix, which makes building fast and changes
// nothing for speed. Throws naming the spec part it cannot take.
DecoderModel make_synthetic_decoder(const std::string& spec);

}  // namespace tessera::model
