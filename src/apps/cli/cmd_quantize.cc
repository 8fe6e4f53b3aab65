// `tessera quantize IN OUT --type T`: converts every weight matrix to T (q8_0, q4_0, q4_1, q5_0,
// q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, f16, bf16, f32, or the q4_k_m / q5_k_m mixes), the output
// head to --output-type or a finer type (compress/quantize.h), and reports the error of each
// tensor against its source values.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "apps/cli/args.h"
#include "apps/cli/infer_flags.h"
#include "apps/cli/model_files.h"
#include "compress/quantize.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace tessera::cli {
namespace {

// Bytes of the converted matrices (what the stats cover): the embedding, every layer's seven
// and an untied head.
int64_t matrix_bytes(const model::DecoderModel& m) {
  auto bytes = [](const model::WeightRef& w) {
    return w.present() ? dtype_bytes(w.type, w.shape.numel()) : int64_t{0};
  };
  int64_t total = bytes(m.weights.tok_embd) + bytes(m.weights.pos_embd);
  for (const model::DecoderLayer& l : m.weights.layers)
    for (const model::WeightRef* w : l.matrices()) total += bytes(*w);
  if (m.weights.output.data != m.weights.tok_embd.data) total += bytes(m.weights.output);
  return total;
}

int run(const Args& a) {
  compress::QuantizeOptions qo;
  const std::string type_name = a.str("--type");
  compress::parse_quant_type(type_name, "--type", &qo);
  const DType type = qo.type;
  if (!a.str("--output-type").empty())
    qo.output_type = parse_dtype(a.str("--output-type"), "--output-type");
  if (a.on("--pure")) {
    TS_CHECK(qo.mix == compress::QuantMix::uniform && !qo.output_type,
             "--pure makes every matrix --type: it cannot go with a mix (", type_name,
             ") or --output-type");
    qo.output_type = qo.type;
  }
  const bool keep_embedding = a.on("--keep-embedding");
  const bool quiet = a.on("--quiet");
  const int64_t threads = a.i64("--threads");
  const std::string dtype = a.str("--dtype");
  std::unique_ptr<ThreadPool> pool;
  if (threads > 0) pool = std::make_unique<ThreadPool>(static_cast<int>(threads));
  const std::string& in = a.positional()[0];
  const std::string& out = a.positional()[1];
  const LoadedModel m = load_model_and_tokenizer(in, {}, true);
  qo.keep_embedding = keep_embedding;
  qo.pool = pool.get();
  std::vector<compress::TensorQuantStats> stats;
  const model::DecoderModel q = compress::quantize_decoder(m.model, qo, &stats);
  save_model(m, q, out, dtype.empty() ? type : parse_dtype(dtype, "--dtype"));

  double worst_rel = 0, sum_sq_err = 0, sum_sq_val = 0;
  std::string worst;
  for (const compress::TensorQuantStats& s : stats) {
    const double rel = s.rms_value > 0 ? s.rms_error / s.rms_value : 0;
    if (!quiet)
      std::printf("%-28s %5s -> %-5s %10lld  rms err %.3e  max err %.3e  rel rms %.4f\n",
                  s.name.c_str(), dtype_name(s.from).data(), dtype_name(s.to).data(),
                  static_cast<long long>(s.elements), s.rms_error, s.max_error, rel);
    if (rel > worst_rel) worst_rel = rel, worst = s.name;
    sum_sq_err += s.rms_error * s.rms_error * static_cast<double>(s.elements);
    sum_sq_val += s.rms_value * s.rms_value * static_cast<double>(s.elements);
  }
  int64_t elements = 0;
  for (const compress::TensorQuantStats& s : stats) elements += s.elements;
  std::printf(
      "%s -> %s (%s): %.1f MB -> %.1f MB of weights, %.2f bits per weight of the matrices; "
      "overall rel rms error %.4f, worst %s %.4f\n",
      in.c_str(), out.c_str(), type_name.c_str(),
      static_cast<double>(m.model.total_weight_bytes()) / 1e6,
      static_cast<double>(q.total_weight_bytes()) / 1e6,
      elements > 0 ? 8.0 * static_cast<double>(matrix_bytes(q)) / static_cast<double>(elements)
                   : 0.0,
      sum_sq_val > 0 ? std::sqrt(sum_sq_err / sum_sq_val) : 0.0, worst.c_str(), worst_rel);
  return 0;
}

const Registrar reg({
    "quantize",
    "quantize a model's weights (q8_0, q4_0, q4_1, q5_0, q5_1, q2_k..q6_k, f16)",
    {
        Flag::text("--type", "",
                   "q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, f16, bf16, f32, "
                   "or q4_k_m / q5_k_m (q6_k for attn_v and ffn_down in 1/3 of the layers)",
                   "TYPE")
            .required(),
        Flag::text("--output-type", "",
                   "type of the output head (the embedding if tied); empty: q6_k (q8_0 where "
                   "rows are not whole 256-blocks) below those types, else --type",
                   "TYPE"),
        Flag::toggle("--pure", "every matrix --type, the output head too (a uniform file)"),
        Flag::toggle("--keep-embedding", "leave the token embedding in its stored type"),
        Flag::toggle("--quiet", "only the summary line, not one line per tensor"),
        Flag::threads(),
        Flag::text("--dtype", "", "weight type of an OUT folder; empty: --type", "TYPE"),
    },
    {{"IN", "a .gguf file or a Hugging Face folder"},
     {"OUT", "a .gguf file (by its suffix) or a Hugging Face folder"}},
    &run,
    {},
});

}  // namespace
}  // namespace tessera::cli
