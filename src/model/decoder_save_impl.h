// Helpers shared by the decoder writers (decoder_gguf_write.cc, decoder_hf_write.cc): q/k row
// orders for the two RoPE layouts, row gathers and dequantization of WeightRefs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/decoder.h"

namespace tessera::model::save_detail {

// For each destination row, the source row that moves there when q/k rows change between HF's
// rotate-half order and GGUF's interleaved order. Within a head, rotation pairs are rows
// (i, i + R/2) in half order and (2i, 2i + 1) interleaved; rows past R = rope_dim stay put.
std::vector<int64_t> rope_row_source(int64_t heads, int64_t head_dim, int64_t rope_dim,
                                     bool to_interleaved);
// Rows of `w` (any dtype: rows are whole blocks; a vector's rows are its elements) in the order
// `src` gives.
std::vector<uint8_t> gather_rows(const WeightRef& w, const std::vector<int64_t>& src);
// All of `w` converted to f32.
std::vector<float> as_f32(const WeightRef& w);
// dst (cols, rows) = src (rows, cols)^T.
std::vector<float> transpose(const std::vector<float>& src, int64_t rows, int64_t cols);

// Throws naming `path` and `what` when the model lacks a weight the format needs.
void require(const WeightRef& w, const std::string& what, const std::string& path);

}  // namespace tessera::model::save_detail
