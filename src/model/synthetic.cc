// Synthetic Llama-shaped models: the presets, and weights drawn once per matrix pattern.
#include "model/synthetic.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/rng.h"

namespace tessera::model {
namespace {

struct Preset {
  const char* name;
  int64_t layers, width, ffn, heads, kv_heads, vocab, ctx;
  double theta;
  bool tied;
  int64_t experts = 0, experts_used = 0;  // ffn: each expert's width
};

// moe-8x1b: the 1b shape with 8 experts of its MLP, 2 per token (as Mixtral 8x7B is to Mistral
// 7B); dense-8x1b: the dense model of the same parameter count (one MLP 8 times as wide), its
// yardstick in `bench generate`.
constexpr Preset kPresets[] = {
    {"135m", 30, 576, 1536, 9, 3, 49152, 8192, 100000, true},
    {"1b", 22, 2048, 5632, 32, 4, 32000, 2048, 10000, false},
    {"8b", 32, 4096, 14336, 32, 8, 128256, 8192, 500000, false},
    {"moe-8x1b", 22, 2048, 5632, 32, 4, 32000, 2048, 10000, false, 8, 2},
    {"dense-8x1b", 22, 2048, 8 * 5632, 32, 4, 32000, 2048, 10000, false},
};

// Rows drawn per matrix before the pattern repeats.
constexpr int64_t kPatternRows = 16;

DType parse_type(const std::string& t, const std::string& spec) {
  const DType d = parse_dtype(t, spec);
  TS_CHECK(d != DType::i32, "[model] ", spec, ": i32 is not a weight type");
  return d;
}

}  // namespace

bool is_synthetic_spec(const std::string& path) {
  return path.rfind("synthetic:", 0) == 0;
}

DecoderModel make_synthetic_decoder(const std::string& spec) {
  TS_CHECK(is_synthetic_spec(spec), "[model] ", spec, ": not a synthetic model spec");
  const std::string rest = spec.substr(10);
  const size_t colon = rest.find(':');
  TS_CHECK(colon != std::string::npos, "[model] ", spec,
           ": expected synthetic:<shape>:<type>, e.g. synthetic:1b:q4_0");
  const std::string shape_name = rest.substr(0, colon);
  const DType type = parse_type(rest.substr(colon + 1), spec);
  const Preset* s = nullptr;
  for (const Preset& k : kPresets)
    if (shape_name == k.name) s = &k;
  TS_CHECK(s != nullptr, "[model] ", spec, ": unknown shape '", shape_name,
           "' (135m, 1b, 8b, moe-8x1b, dense-8x1b)");
  const int64_t block = traits(type).block_elems;
  TS_CHECK(s->width % block == 0 && s->ffn % block == 0, "[model] ", spec, ": type ",
           dtype_name(type), " needs widths that are multiples of ", block, " (this shape has ",
           s->width, " and ", s->ffn, ")");

  DecoderModel m;
  DecoderConfig& c = m.config;
  c.arch = DecoderArch::llama;
  c.name = spec;
  c.n_layers = s->layers;
  c.d_model = s->width;
  c.n_heads = s->heads;
  c.n_kv_heads = s->kv_heads;
  c.head_dim = s->width / s->heads;
  c.d_ff = s->ffn;
  c.vocab = s->vocab;
  c.max_ctx = s->ctx;
  c.norm_eps = 1e-5f;
  c.rope_theta = s->theta;
  c.rope_dim = c.head_dim;
  c.tied_embeddings = s->tied;
  c.n_experts = s->experts;
  c.n_experts_used = s->experts_used;
  c.validate(spec);

  auto store = std::make_shared<std::vector<std::vector<uint8_t>>>();
  m.owners.push_back(store);
  store->reserve(static_cast<size_t>(16 * s->layers + 8));
  Rng rng(20261130);
  auto matrix = [&](int64_t rows, int64_t cols) {
    const int64_t pattern = std::min(rows, kPatternRows);
    std::vector<float> values(static_cast<size_t>(pattern * cols));
    for (float& v : values) v = 0.02f * rng.normal();
    const auto row_bytes = static_cast<size_t>(dtype_bytes(type, cols));
    std::vector<uint8_t> bytes(row_bytes * static_cast<size_t>(rows));
    from_f32(type, values.data(), bytes.data(), pattern * cols);
    for (int64_t r = pattern; r < rows; ++r)
      std::memcpy(bytes.data() + static_cast<size_t>(r) * row_bytes,
                  bytes.data() + static_cast<size_t>(r % pattern) * row_bytes, row_bytes);
    store->push_back(std::move(bytes));
    return WeightRef{store->back().data(), type, Shape({rows, cols})};
  };
  auto ones = [&](int64_t n) {
    std::vector<uint8_t> bytes(static_cast<size_t>(n) * sizeof(float));
    const float one = 1.0f;
    for (int64_t i = 0; i < n; ++i) std::memcpy(bytes.data() + i * sizeof(float), &one, 4);
    store->push_back(std::move(bytes));
    return WeightRef{store->back().data(), DType::f32, Shape({n})};
  };
  // The router: f32, every row drawn, so that tokens spread over the experts.
  auto router = [&](int64_t rows, int64_t cols) {
    std::vector<uint8_t> bytes(static_cast<size_t>(rows * cols) * sizeof(float));
    for (int64_t i = 0; i < rows * cols; ++i) {
      const float v = 0.02f * rng.normal();
      std::memcpy(bytes.data() + i * sizeof(float), &v, sizeof(float));
    }
    store->push_back(std::move(bytes));
    return WeightRef{store->back().data(), DType::f32, Shape({rows, cols})};
  };
  const int64_t C = c.d_model, Q = c.q_dim(), KV = c.kv_dim(), F = c.d_ff;
  const int64_t E = std::max<int64_t>(c.n_experts, 1);
  DecoderWeights& w = m.weights;
  w.tok_embd = matrix(c.vocab, C);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    DecoderLayer L;
    L.attn_norm = ones(C);
    L.ffn_norm = ones(C);
    L.wq = matrix(Q, C);
    L.wk = matrix(KV, C);
    L.wv = matrix(KV, C);
    L.wo = matrix(C, Q);
    L.w_gate = matrix(E * F, C);
    L.w_up = matrix(E * F, C);
    L.w_down = matrix(E * C, F);
    if (c.moe()) L.ffn_router = router(c.n_experts, C);
    w.layers.push_back(L);
  }
  w.out_norm = ones(C);
  w.output = s->tied ? w.tok_embd : matrix(c.vocab, C);
  m.source = spec;
  return m;
}

}  // namespace tessera::model
