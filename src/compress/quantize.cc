// Decoder weight quantization: every matrix converted row-parallel to a block type, with the
// error of each tensor measured against its source values.
#include "compress/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <memory>

#include "core/error.h"
#include "model/layer_tensors.h"

namespace tessera::compress {

using model::DecoderLayer;
using model::DecoderModel;
using model::WeightRef;

namespace {

// Rows per work chunk are chosen so a chunk holds about this many elements: enough to amortize
// the hand-off to a thread, small enough to balance a matrix over many threads. Chunks depend on
// the shape only, and per-chunk error sums are combined in chunk order, so the statistics (and
// the bytes) do not depend on the thread count.
constexpr int64_t kChunkElems = 1 << 16;

struct ErrorSums {
  double sq_err = 0, sq_val = 0, max_err = 0;
};

class ModelQuantizer {
 public:
  ModelQuantizer(ThreadPool& pool, DecoderModel& out, std::vector<TensorQuantStats>* stats)
      : pool_(pool), out_(out), stats_(stats) {}

  // Converts matrix `in` to `want` (or its fallback), into a buffer the output model owns.
  WeightRef matrix(const WeightRef& in, const std::string& name, DType want) {
    if (!in.present()) return {};
    TS_CHECK(in.shape.rank() == 2, "[quantize] tensor '", name, "' has shape ", in.shape.str(),
             ", expected a matrix");
    const int64_t rows = in.rows(), cols = in.cols();
    const DType to = quant_type_for_row(want, cols);
    auto* dst = static_cast<uint8_t*>(alloc(dtype_bytes(to, rows * cols)));
    const auto* src = static_cast<const uint8_t*>(in.data);
    const int64_t src_row = dtype_bytes(in.type, cols), dst_row = dtype_bytes(to, cols);
    const int64_t chunk_rows = std::max<int64_t>(1, kChunkElems / cols);
    const int64_t n_chunks = (rows + chunk_rows - 1) / chunk_rows;
    std::vector<ErrorSums> partial(static_cast<size_t>(n_chunks));
    pool_.parallel_for(n_chunks, 1, [&](int64_t k0, int64_t k1) {
      std::vector<float> x(static_cast<size_t>(cols)), y(static_cast<size_t>(cols));
      for (int64_t k = k0; k < k1; ++k) {
        ErrorSums& e = partial[static_cast<size_t>(k)];
        for (int64_t r = k * chunk_rows; r < std::min(rows, (k + 1) * chunk_rows); ++r) {
          const uint8_t* s = src + r * src_row;
          uint8_t* d = dst + r * dst_row;
          to_f32(in.type, s, x.data(), cols);
          if (in.type == to)
            std::memcpy(d, s, static_cast<size_t>(dst_row));  // requantizing would add error
          else
            from_f32(to, x.data(), d, cols);
          to_f32(to, d, y.data(), cols);
          for (int64_t c = 0; c < cols; ++c) {
            const double v = x[static_cast<size_t>(c)];
            const double err = std::fabs(static_cast<double>(y[static_cast<size_t>(c)]) - v);
            e.sq_err += err * err;
            e.sq_val += v * v;
            e.max_err = std::max(e.max_err, err);
          }
        }
      }
    });
    if (stats_) {
      ErrorSums total;
      for (const ErrorSums& e : partial) {
        total.sq_err += e.sq_err;
        total.sq_val += e.sq_val;
        total.max_err = std::max(total.max_err, e.max_err);
      }
      const double n = static_cast<double>(rows * cols);
      stats_->push_back({name, in.type, to, rows * cols, std::sqrt(total.sq_err / n), total.max_err,
                         std::sqrt(total.sq_val / n)});
    }
    return {dst, to, in.shape};
  }

  // Norm weights and biases: f32 copies.
  WeightRef vector(const WeightRef& in) {
    if (!in.present()) return {};
    const int64_t n = in.shape.numel();
    auto* dst = static_cast<float*>(alloc(n * 4));
    to_f32(in.type, in.data, dst, n);
    return {dst, DType::f32, in.shape};
  }

 private:
  void* alloc(int64_t bytes) {
    auto buf = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(bytes));
    out_.owners.push_back(buf);
    return buf->data();
  }

  ThreadPool& pool_;
  DecoderModel& out_;
  std::vector<TensorQuantStats>* stats_;
};

}  // namespace

DType quant_type_for_row(DType wanted, int64_t cols) {
  TS_CHECK(wanted != DType::i32, "[quantize] target type i32 is not a weight type");
  DType t = wanted;
  // Super-block types (256) fall back to the 32-element type a bit wider than their own, which
  // keeps their quality or better at the least size (as llama.cpp's quantizer: Q2_K / Q3_K ->
  // Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0); 32-element block types fall back to f16,
  // which fits any row.
  while (cols % traits(t).block_elems != 0) {
    switch (t) {
      case DType::q2_k:
      case DType::q3_k:
        t = DType::q4_0;
        break;
      case DType::q4_k:
        t = DType::q5_0;
        break;
      case DType::q5_k:
        t = DType::q5_1;
        break;
      case DType::q6_k:
        t = DType::q8_0;
        break;
      default:
        t = DType::f16;
        break;
    }
  }
  return t;
}

void parse_quant_type(std::string_view name, std::string_view what, QuantizeOptions* opts) {
  if (name == "q4_k_m" || name == "q5_k_m") {
    opts->type = name == "q4_k_m" ? DType::q4_k : DType::q5_k;
    opts->mix = QuantMix::k_m;
    return;
  }
  opts->type = parse_dtype(name, what);
  opts->mix = QuantMix::uniform;
}

DType output_type_for(const QuantizeOptions& opts) {
  if (opts.output_type) return *opts.output_type;
  switch (opts.type) {
    case DType::q2_k:
    case DType::q3_k:
    case DType::q4_k:
    case DType::q5_k:
    case DType::q4_0:
    case DType::q4_1:
    case DType::q5_0:
    case DType::q5_1:
      return DType::q6_k;  // falls back to q8_0 per row where rows are not whole super-blocks
    default:
      return opts.type;  // q6_k, q8_0 and the float types are at least as fine already
  }
}

bool k_m_layer_gets_more_bits(int64_t layer, int64_t n_layers) {
  const int64_t eighth = n_layers / 8;
  return layer < eighth || layer >= 7 * n_layers / 8 || (layer - eighth) % 3 == 2;
}

DecoderModel quantize_decoder(const DecoderModel& src, const QuantizeOptions& opts,
                              std::vector<TensorQuantStats>* stats) {
  TS_CHECK(opts.type != DType::i32, "[quantize] target type i32 is not a weight type");
  if (stats) stats->clear();
  DecoderModel out;
  out.config = src.config;
  out.gguf = src.gguf;  // tokenizer metadata source, if any
  out.source = src.source;
  ModelQuantizer q(opts.pool ? *opts.pool : default_pool(), out, stats);
  const model::DecoderWeights& s = src.weights;
  model::DecoderWeights& w = out.weights;
  const bool tied = s.output.data == s.tok_embd.data;
  const DType head = output_type_for(opts);
  DType embd = tied ? head : opts.type;
  if (opts.keep_embedding) embd = s.tok_embd.type;
  w.tok_embd = q.matrix(s.tok_embd, "token_embd", embd);
  w.pos_embd = q.matrix(s.pos_embd, "position_embd", opts.type);
  w.layers.resize(s.layers.size());
  for (size_t i = 0; i < s.layers.size(); ++i) {
    const DecoderLayer& a = s.layers[i];
    DecoderLayer& b = w.layers[i];
    const std::string p = model::gguf_layer_prefix(static_cast<int64_t>(i));
    const bool more_bits =
        opts.mix == QuantMix::k_m &&
        k_m_layer_gets_more_bits(static_cast<int64_t>(i), static_cast<int64_t>(s.layers.size()));
    const DType sensitive = more_bits ? DType::q6_k : opts.type;
    for (const model::LayerTensor& t : model::layer_tensors()) {
      if (t.kind != model::LayerTensorKind::matrix) continue;
      const auto m = static_cast<model::LayerMatrix>(t.matrix);
      // k-quant mixes give v and down more bits in some layers (llama.cpp's Q*_K_M).
      const bool v_or_down = m == model::LayerMatrix::v || m == model::LayerMatrix::down;
      b.*t.member = q.matrix(a.*t.member, p + model::tensor_module(t.gguf),
                             v_or_down ? sensitive : opts.type);
    }
    const auto from = a.vectors();
    const auto to = b.vectors();
    for (size_t v = 0; v < from.size(); ++v) *to[v] = q.vector(*from[v]);
  }
  w.out_norm = q.vector(s.out_norm);
  w.out_norm_b = q.vector(s.out_norm_b);
  // A tied head stays tied: it is the (converted) embedding, not a second copy.
  w.output = tied ? w.tok_embd : q.matrix(s.output, "output", head);
  return out;
}

}  // namespace tessera::compress
