// Post-training quantization of a decoder model's weight matrices to a block type (q8_0, q4_0,
// q4_1, k-quants) with per-tensor error statistics.
#pragma once

#include <cstdint>
#include <string>
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

struct QuantizeOptions {
  DType type = DType::q8_0;     // target for 2-D weight matrices
  bool keep_embedding = false;  // token embedding (and a head tied to it) stays as is
  ThreadPool* pool = nullptr;   // nullptr: default_pool()
};

// Returns a model with every 2-D weight converted to opts.type (norm vectors and biases become
// f32); a tensor whose row length is not a multiple of the type's block size falls back to the
// closest type that fits (k-quants -> q8_0 -> f16), which its stats show. A tensor already in
// the target type is copied unchanged. The output holds its own buffers (the source may be
// released). Rows are converted in parallel; results do not depend on the thread count.
model::DecoderModel quantize_decoder(const model::DecoderModel& src, const QuantizeOptions& opts,
                                     std::vector<TensorQuantStats>* stats);

// The type a row of `cols` elements gets when `wanted` is asked for (see quantize_decoder).
DType quant_type_for_row(DType wanted, int64_t cols);

}  // namespace tessera::compress
