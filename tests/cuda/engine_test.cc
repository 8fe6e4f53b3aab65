// The engine on the GPU (--device cuda: weights, activations and the paged KV cache on the
// device) against the same engine on the CPU, on tiny random Llama and GPT-2 models with weights
// in every type the CUDA kernels take: chunked prefill across cache blocks, token-by-token decode,
// two sequences per call, sequence reuse after a free; and its one-line errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <ostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/cuda/dependent_launch.h"
#include "backend/cuda/ops_backend.h"
#include "core/dtype.h"
#include "core/rng.h"
#include "cuda_test_util.h"
#include "infer/engine.h"
#include "infer/tiny_model.h"
#include "ops/op_tally.h"
#include "test_util/expect_error.h"

namespace tessera::infer {
namespace {

// Converts every weight matrix of m to `type` (norm weights and biases stay f32), in place.
void convert_matrices(model::DecoderModel& m, DType type) {
  if (type == DType::f32) return;
  auto store = std::make_shared<std::vector<std::vector<uint8_t>>>();
  m.owners.push_back(store);
  store->reserve(16 + 8 * m.weights.layers.size());
  auto convert = [&](model::WeightRef& r) {
    if (!r.present()) return;
    std::vector<uint8_t> bytes(static_cast<size_t>(dtype_bytes(type, r.shape.numel())));
    from_f32(type, static_cast<const float*>(r.data), bytes.data(), r.shape.numel());
    store->push_back(std::move(bytes));
    r = model::WeightRef{store->back().data(), type, r.shape};
  };
  const bool tied = m.weights.output.data == m.weights.tok_embd.data;
  for (model::DecoderLayer& l : m.weights.layers)
    for (model::WeightRef* r : l.matrices()) convert(*r);
  convert(m.weights.tok_embd);
  if (tied)
    m.weights.output = m.weights.tok_embd;
  else
    convert(m.weights.output);
}

// The weights the GPU's GEMM route computes with: every layer matrix and an untied output head
// decoded and rounded to f16 (as cuda::dequantize_to_f16 does, bit for bit). The token embedding
// stays as it is: the engine looks it up on the host for both devices.
model::DecoderModel f16_copy(const model::DecoderModel& src) {
  model::DecoderModel m = src;
  auto store = std::make_shared<std::vector<std::vector<uint8_t>>>();
  m.owners.push_back(store);
  store->reserve(16 + 8 * m.weights.layers.size());
  auto widen = [&](model::WeightRef& r) {
    if (!r.present() || r.type == DType::f32 || r.type == DType::f16) return;
    const int64_t n = r.shape.numel();
    std::vector<float> f(static_cast<size_t>(n));
    to_f32(r.type, r.data, f.data(), n);
    std::vector<uint8_t> bytes(static_cast<size_t>(dtype_bytes(DType::f16, n)));
    from_f32(DType::f16, f.data(), bytes.data(), n);
    store->push_back(std::move(bytes));
    r = model::WeightRef{store->back().data(), DType::f16, r.shape};
  };
  for (model::DecoderLayer& l : m.weights.layers)
    for (model::WeightRef* r : l.matrices()) widen(*r);
  if (m.weights.output.data != m.weights.tok_embd.data) widen(m.weights.output);
  return m;
}

// ||got - want|| / ||want||: for comparisons where legitimate rounding differences are amplified
// element by element (a tiny random model moves its worst logit ~100x more than its typical one)
// but a wrong product would still be uncorrelated (a ratio near sqrt(2)).
double relative_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

struct Case {
  model::DecoderArch arch;
  DType weights;
  DType kv;
  bool tied, bias;
};

std::string case_name(const Case& c) {
  return cat(c.arch == model::DecoderArch::gpt2 ? "gpt2" : "llama", "_", dtype_name(c.weights),
             "_kv", dtype_name(c.kv), c.tied ? "_tied" : "", c.bias ? "_bias" : "");
}
std::string param_name(const ::testing::TestParamInfo<Case>& i) {
  return case_name(i.param);
}
// gtest (and so the ctest names) would print the struct's bytes, padding included.
void PrintTo(const Case& c, std::ostream* os) {
  *os << case_name(c);
}

model::DecoderModel make_model(const Case& c) {
  test::TinyOptions o;
  o.arch = c.arch;
  // Head dim 64 (the paged decode kernel's smallest); widths multiples of 256 for the k-quants.
  o.width = 256;
  o.heads = 4;
  o.kv_heads = c.arch == model::DecoderArch::gpt2 ? 4 : 2;
  o.ffn = 512;
  o.vocab = 300;
  o.ctx = 256;
  o.tied = c.tied;
  o.qkv_bias = c.bias;
  o.seed = 77;
  model::DecoderModel m = test::make_tiny_model(o);
  convert_matrices(m, c.weights);
  return m;
}

EngineOptions options(const Case& c, bool cuda) {
  EngineOptions o;
  o.max_ctx = 128;
  o.kv_tokens = 512;
  o.block_tokens = 16;
  o.max_rows = 24;  // a 50-token prompt runs in three chunks
  o.kv_type = c.kv;
  if (cuda) {
    cuda::register_ops_backend();
    o.ctx.device = ops::Device::cuda;
  }
  return o;
}

// How far the GPU's logits may sit from the CPU's: a bound on the worst element over rms(want)
// (none when negative) and on the relative L2 distance.
struct Allowance {
  double worst_over_rms, l2;
};

// The allowance for a model's weights and cache type, from distances measured on the CPU
// (tests/cuda/engine_test.cc's cases, the CPU engine with its attention computed in float64
// against the same engine in f32; then with that attention also rounding q * scale and p to
// f16 on every run of >= 16 rows of one sequence, as the GPU's prompt tiles do):
// - f32/f16/bf16 weights, f32 cache: only summation orders differ (worst 3.4e-5 rms).
// - the same weights, f16 cache: prompts take the tiles, and the decode steps read the keys
//   they wrote; the f16 queries move the logits by up to 0.0028 relative L2 and the worst
//   element by 0.027 rms (the probabilities' rounding alone 0.002; the queries' dominates).
// - block types: both sides quantize the activations to the same int8 blocks, but an
//   activation on a rounding boundary lands one step apart after any reordering, and a tiny
//   random model amplifies that: f32-order differences alone move up to 0.019 relative L2 and
//   the worst element by 0.17 rms, the f16 tiles up to 0.048 L2 and 0.3 rms. The worst element
//   says nothing there; the L2 bound still separates them from a wrong product (~1).
Allowance allowance(const Case& c) {
  const bool block_type =
      c.weights != DType::f32 && c.weights != DType::f16 && c.weights != DType::bf16;
  if (block_type) return c.kv == DType::f16 ? Allowance{-1, 0.15} : Allowance{-1, 0.05};
  return c.kv == DType::f16 ? Allowance{0.08, 0.01} : Allowance{2e-3, 2e-3};
}

// got within the allowance of want, reporting the worst element.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, Allowance tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double ss = 0;
  for (float w : want) ss += static_cast<double>(w) * w;
  const double rms = std::sqrt(ss / static_cast<double>(want.size()));
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " element " << i;
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (d > worst) worst = d, at = i;
  }
  const double l2 = relative_l2(got, want);
  if (tol.worst_over_rms >= 0) {
    EXPECT_LE(worst, tol.worst_over_rms * rms)
        << what << ": worst element " << at << " got " << got[at] << " want " << want[at]
        << " (rms " << rms << ", relative L2 " << l2 << ")";
  }
  EXPECT_LE(l2, tol.l2) << what << ": relative L2 (worst element " << at << " got " << got[at]
                        << " want " << want[at] << ", rms " << rms << ")";
}

class CudaEngine : public ::testing::TestWithParam<Case> {};

// The GPU engine (the model's forward pass on the CUDA ops backend) against the CPU engine:
// prefill, decode, single rows, reused blocks.
TEST_P(CudaEngine, MatchesCpuEngine) {
  TS_REQUIRE_CUDA_DEVICE();
  const Case c = GetParam();
  const model::DecoderModel m = make_model(c);
  Engine cpu(m, options(c, false)), gpu(m, options(c, true));
  EXPECT_NE(gpu.device_description(), "cpu");
  const Allowance tol = allowance(c);
  const int64_t V = m.config.vocab;

  const std::vector<int32_t> p0 = test::random_tokens(50, V, 1), p1 = test::random_tokens(7, V, 2);
  int32_t a0 = cpu.new_sequence(), a1 = cpu.new_sequence();
  int32_t b0 = gpu.new_sequence(), b1 = gpu.new_sequence();
  // Prefill: every logit row of the long prompt, and the last of the short one.
  const std::vector<float> want = cpu.forward({Feed{a0, p0, true}, Feed{a1, p1, false}});
  const std::vector<float> got = gpu.forward({Feed{b0, p0, true}, Feed{b1, p1, false}});
  expect_close(got, want, tol, "prefill logits");

  // Decode 12 steps of both sequences, each fed the CPU's greedy token (so both sides see the
  // same inputs whatever their argmax).
  std::vector<int32_t> next = {1, 2};
  for (int step = 0; step < 12; ++step) {
    const std::vector<float> w =
        cpu.forward({Feed{a0, {&next[0], 1}, false}, Feed{a1, {&next[1], 1}, false}});
    const std::vector<float> g =
        gpu.forward({Feed{b0, {&next[0], 1}, false}, Feed{b1, {&next[1], 1}, false}});
    expect_close(g, w, tol, cat("decode step ", step));
    for (int s = 0; s < 2; ++s)
      next[static_cast<size_t>(s)] = static_cast<int32_t>(
          std::max_element(w.begin() + s * V, w.begin() + (s + 1) * V) - (w.begin() + s * V));
  }

  // One sequence alone: one-row steps take the fused q/k/v and gate/up products.
  int32_t t1 = next[1];
  for (int step = 0; step < 4; ++step) {
    const std::vector<float> w = cpu.forward({Feed{a1, {&t1, 1}, false}});
    expect_close(gpu.forward({Feed{b1, {&t1, 1}, false}}), w, tol, cat("single-row step ", step));
    t1 = static_cast<int32_t>(std::max_element(w.begin(), w.end()) - w.begin());
  }

  // A freed sequence's blocks are reused by a new one, which must not see the old keys.
  cpu.free_sequence(a0);
  gpu.free_sequence(b0);
  a0 = cpu.new_sequence();
  b0 = gpu.new_sequence();
  const std::vector<int32_t> p2 = test::random_tokens(20, V, 3);
  expect_close(gpu.forward({Feed{b0, p2, false}}), cpu.forward({Feed{a0, p2, false}}), tol,
               "reused blocks");
}

INSTANTIATE_TEST_SUITE_P(
    Types, CudaEngine,
    ::testing::Values(Case{model::DecoderArch::llama, DType::f32, DType::f32, false, false},
                      Case{model::DecoderArch::llama, DType::f16, DType::f16, true, false},
                      Case{model::DecoderArch::llama, DType::bf16, DType::f16, false, true},
                      Case{model::DecoderArch::llama, DType::q8_0, DType::f16, false, false},
                      Case{model::DecoderArch::llama, DType::q4_0, DType::f16, false, true},
                      Case{model::DecoderArch::llama, DType::q4_1, DType::f32, true, false},
                      Case{model::DecoderArch::llama, DType::q4_k, DType::f16, false, false},
                      Case{model::DecoderArch::llama, DType::q6_k, DType::f16, false, false},
                      Case{model::DecoderArch::llama, DType::q5_0, DType::f16, false, true},
                      Case{model::DecoderArch::llama, DType::q5_1, DType::f32, false, false},
                      Case{model::DecoderArch::llama, DType::q5_k, DType::f16, true, false},
                      Case{model::DecoderArch::gpt2, DType::f32, DType::f16, true, true},
                      Case{model::DecoderArch::gpt2, DType::q8_0, DType::f16, false, true}),
    param_name);

// A Q4_K_M-style file keeps wv and w_down in q6_k next to q4_k: the q/k/v products cannot be
// one matrix then, and one-row steps fall back to separate products (gate/up still fuse).
TEST(CudaEngine, MixedTypesInALayerMatchCpu) {
  TS_REQUIRE_CUDA_DEVICE();
  const Case c{model::DecoderArch::llama, DType::f32, DType::f16, false, false};
  model::DecoderModel m = make_model(c);
  auto store = std::make_shared<std::vector<std::vector<uint8_t>>>();
  m.owners.push_back(store);
  store->reserve(64);
  auto convert = [&](model::WeightRef& r, DType t) {
    std::vector<uint8_t> bytes(static_cast<size_t>(dtype_bytes(t, r.shape.numel())));
    from_f32(t, static_cast<const float*>(r.data), bytes.data(), r.shape.numel());
    store->push_back(std::move(bytes));
    r = model::WeightRef{store->back().data(), t, r.shape};
  };
  for (model::DecoderLayer& l : m.weights.layers) {
    for (model::WeightRef* r : {&l.wq, &l.wk, &l.wo, &l.w_gate, &l.w_up}) convert(*r, DType::q4_k);
    for (model::WeightRef* r : {&l.wv, &l.w_down}) convert(*r, DType::q6_k);
  }
  Engine cpu(m, options(c, false)), gpu(m, options(c, true));
  const std::vector<int32_t> p = test::random_tokens(20, m.config.vocab, 4);
  const int32_t a = cpu.new_sequence(), b = gpu.new_sequence();
  const Allowance tol = allowance({c.arch, DType::q4_k, c.kv, c.tied, c.bias});  // block types
  expect_close(gpu.forward({Feed{b, p, false}}), cpu.forward({Feed{a, p, false}}), tol, "prefill");
  int32_t t = 7;
  for (int step = 0; step < 3; ++step) {
    const std::vector<float> w = cpu.forward({Feed{a, {&t, 1}, false}});
    expect_close(gpu.forward({Feed{b, {&t, 1}, false}}), w, tol, cat("step ", step));
    t = static_cast<int32_t>(std::max_element(w.begin(), w.end()) - w.begin());
  }
}

// Chunks of 65 rows or more run their products as f16 tensor-core GEMMs over weights widened to
// f16: a 150-token prompt in chunks of 96 takes that route, then decode takes the matvecs.
// The prefill is compared with the CPU engine on the same f16 weights (f16_copy), so only the
// GPU's f16 rounding of the activations differs: rounding one operand of every product to f16
// moves this model's logits by 0.0056 relative L2 on the CPU, the prompt tiles' f16 queries and
// probabilities (emulated on the CPU) up to 0.0025 more, and 0.03 allows for all. The
// decode step after it reads a cache from the f16 route but takes the int8-activation matvecs
// of the stored weights (block types), so it sits between the CPU engine on the stored weights
// and on the f16 copy, which differ by up to 0.21 (q4_0's step; 0.07-0.11 over the prefill): it
// must stay within twice that distance of the copy, plus the f16 allowance.
TEST(CudaEngine, LongPrefillThroughGemmMatchesCpu) {
  TS_REQUIRE_CUDA_DEVICE();
  for (DType t : {DType::f16, DType::bf16, DType::q8_0, DType::q4_0, DType::q5_0, DType::q4_k,
                  DType::q5_k, DType::q6_k}) {
    const Case c{model::DecoderArch::llama, t, DType::f16, false, true};
    const model::DecoderModel m = make_model(c);
    const model::DecoderModel f16 = f16_copy(m);
    EngineOptions co = options(c, false), go = options(c, true);
    co.max_rows = go.max_rows = 96;
    co.max_ctx = go.max_ctx = 256;  // the model's context: the prompt is 150 tokens
    Engine cpu(m, co), cpu_copy(f16, co), gpu(m, go);
    const std::vector<int32_t> p = test::random_tokens(150, m.config.vocab, 9);
    const int32_t a = cpu.new_sequence(), at = cpu_copy.new_sequence(), b = gpu.new_sequence();
    const std::vector<float> got = gpu.forward({Feed{b, p, true}});
    const std::vector<float> want = cpu_copy.forward({Feed{at, p, true}});
    ASSERT_EQ(got.size(), want.size());
    EXPECT_LT(relative_l2(got, want), 0.03) << dtype_name(t) << " prefill";
    cpu.forward({Feed{a, p, false}});
    const int32_t next = 5;
    const std::vector<float> got_step = gpu.forward({Feed{b, {&next, 1}, false}});
    const std::vector<float> copy_step = cpu_copy.forward({Feed{at, {&next, 1}, false}});
    const std::vector<float> stored_step = cpu.forward({Feed{a, {&next, 1}, false}});
    ASSERT_EQ(got_step.size(), copy_step.size());
    const double spread = relative_l2(stored_step, copy_step);  // 0 for f16 and bf16
    EXPECT_LT(relative_l2(got_step, copy_step), 2 * spread + 0.03)
        << dtype_name(t) << " decode (the CPU routes differ by " << spread << ")";
  }
}

// Decode steps replay a captured CUDA graph from the second step of a shape on: the replay must
// give exactly what eager launches give (an engine whose ops an observer watches records none).
TEST(CudaEngine, GraphReplayEqualsEagerLaunches) {
  TS_REQUIRE_CUDA_DEVICE();
  const Case c{model::DecoderArch::llama, DType::q4_0, DType::f16, false, false};
  const model::DecoderModel m = make_model(c);
  ops::OpTally watching;
  EngineOptions eo = options(c, true);
  eo.ctx.observer = &watching;
  Engine eager(m, eo), graphed(m, options(c, true));
  const std::vector<int32_t> p = test::random_tokens(30, m.config.vocab, 5);
  const int32_t a = eager.new_sequence(), b = graphed.new_sequence();
  EXPECT_EQ(eager.forward({Feed{a, p, false}}), graphed.forward({Feed{b, p, false}}));
  int32_t next = 3;
  for (int step = 0; step < 6; ++step) {
    const std::vector<float> want = eager.forward({Feed{a, {&next, 1}, false}});
    const std::vector<float> got = graphed.forward({Feed{b, {&next, 1}, false}});
    ASSERT_EQ(got, want) << "decode step " << step;
    next = static_cast<int32_t>(std::max_element(want.begin(), want.end()) - want.begin());
  }
  // Prompts of one shape: the first runs eagerly, the second is captured, the third replays a
  // graph that holds the prompt-tile kernel (its tile list is read from the device each time).
  for (int i = 0; i < 3; ++i) {
    const std::vector<int32_t> q =
        test::random_tokens(24, m.config.vocab, 10 + static_cast<uint64_t>(i));
    const int32_t ea = eager.new_sequence(), gb = graphed.new_sequence();
    ASSERT_EQ(graphed.forward({Feed{gb, q, false}}), eager.forward({Feed{ea, q, false}}))
        << "prompt " << i;
  }
}

// The prompt tiles against the decode kernel on the same GPU (TESSERA_CUDA_PAGED_PREFILL=0, read
// at each plan, so set around the plain engine's calls): they must differ (the tiles round
// q * scale and p to f16, so equal logits would mean they never ran) but stay within the f16
// cache's allowance: 70 tokens in chunks of 24 and 46 (the second a 46-row tile with a 24-key
// prefix), then decode steps reading the tiles' keys.
TEST(CudaEngine, PromptTilesStayCloseToTheDecodeKernel) {
  TS_REQUIRE_CUDA_DEVICE();
  struct Unset {
    ~Unset() { unsetenv("TESSERA_CUDA_PAGED_PREFILL"); }
  } unset;
  for (const Case& c : {Case{model::DecoderArch::llama, DType::f16, DType::f16, false, false},
                        Case{model::DecoderArch::gpt2, DType::f32, DType::f16, true, true}}) {
    const model::DecoderModel m = make_model(c);
    EngineOptions o = options(c, true);
    o.max_rows = 46;
    Engine plain(m, o), tiled(m, o);
    auto on_plain = [&](const std::vector<Feed>& feeds) {
      setenv("TESSERA_CUDA_PAGED_PREFILL", "0", 1);
      std::vector<float> got = plain.forward(feeds);
      unsetenv("TESSERA_CUDA_PAGED_PREFILL");
      return got;
    };
    const std::vector<int32_t> p = test::random_tokens(70, m.config.vocab, 11);
    const int32_t a = plain.new_sequence(), b = tiled.new_sequence();
    const std::vector<float> want = on_plain({Feed{a, p, true}});
    const std::vector<float> got = tiled.forward({Feed{b, p, true}});
    EXPECT_NE(got, want) << case_name(c) << ": the tiles did not run";
    expect_close(got, want, allowance(c), cat(case_name(c), " prompt"));
    int32_t next = 4;
    for (int step = 0; step < 3; ++step) {
      const std::vector<float> w = on_plain({Feed{a, {&next, 1}, false}});
      expect_close(tiled.forward({Feed{b, {&next, 1}, false}}), w, allowance(c),
                   cat(case_name(c), " step ", step));
      next = static_cast<int32_t>(std::max_element(w.begin(), w.end()) - w.begin());
    }
  }
  // A bad value is refused at the next plan, naming the variable.
  setenv("TESSERA_CUDA_PAGED_PREFILL", "yes", 1);
  const Case c{model::DecoderArch::llama, DType::f16, DType::f16, false, false};
  const model::DecoderModel m = make_model(c);
  Engine e(m, options(c, true));
  const int32_t s = e.new_sequence();
  const std::vector<int32_t> p = test::random_tokens(20, m.config.vocab, 12);
  test::expect_error([&] { e.forward({Feed{s, p, false}}); }, "TESSERA_CUDA_PAGED_PREFILL=yes");
}

// Programmatic dependent launch lets each decode kernel start while the one before finishes
// (each waits for its inputs on the device): the logits must be exactly those of ordinary
// launches, through prefill, graphed decode steps and a two-sequence batch, for a Llama and a
// GPT-2. Skipped where the GPU cannot launch dependents (both engines would launch alike).
TEST(CudaEngine, DependentLaunchesKeepTheLogitsBitForBit) {
  TS_REQUIRE_CUDA_DEVICE();
  // Puts the switch back however the test ends (later tests run with the process's setting).
  struct Restore {
    bool was = cuda::dependent_launch_enabled();
    ~Restore() { cuda::set_dependent_launch(was); }
  } restore;
  cuda::set_dependent_launch(true);
  if (!cuda::dependent_launch_enabled())
    GTEST_SKIP() << "this GPU takes no programmatic dependent launches (sm_90 only)";
  // Block-typed, 16-bit (the L2-prefetching matvec), f32 (no prefetch) and k-quant weights.
  for (const Case& c : {Case{model::DecoderArch::llama, DType::q4_0, DType::f16, false, false},
                        Case{model::DecoderArch::llama, DType::f16, DType::f16, true, false},
                        Case{model::DecoderArch::llama, DType::bf16, DType::f32, false, true},
                        Case{model::DecoderArch::llama, DType::q6_k, DType::f16, false, false},
                        Case{model::DecoderArch::gpt2, DType::q8_0, DType::f16, false, false},
                        Case{model::DecoderArch::gpt2, DType::f32, DType::f16, true, true}}) {
    SCOPED_TRACE(cat(c.arch == model::DecoderArch::gpt2 ? "gpt2 " : "llama ", dtype_name(c.weights),
                     " kv ", dtype_name(c.kv)));
    const model::DecoderModel m = make_model(c);
    Engine plain(m, options(c, true)), dependent(m, options(c, true));
    // The switch is read at each launch (and baked into a graph when captured): flip it
    // before each engine's call.
    auto both = [&](const std::vector<Feed>& a, const std::vector<Feed>& b) {
      cuda::set_dependent_launch(false);
      std::vector<float> want = plain.forward(a);
      cuda::set_dependent_launch(true);
      std::vector<float> got = dependent.forward(b);
      return std::make_pair(std::move(want), std::move(got));
    };
    const std::vector<int32_t> p = test::random_tokens(30, m.config.vocab, 8);
    const int32_t a = plain.new_sequence(), b = dependent.new_sequence();
    const int32_t a2 = plain.new_sequence(), b2 = dependent.new_sequence();
    auto [want, got] = both({Feed{a, p, false}}, {Feed{b, p, false}});
    ASSERT_EQ(got, want) << "prefill";
    int32_t next = 3;
    for (int step = 0; step < 5; ++step) {
      std::tie(want, got) = both({Feed{a, {&next, 1}, false}}, {Feed{b, {&next, 1}, false}});
      ASSERT_EQ(got, want) << "decode step " << step;
      next = static_cast<int32_t>(std::max_element(want.begin(), want.end()) - want.begin());
    }
    const std::vector<int32_t> p2 = test::random_tokens(3, m.config.vocab, 9);
    for (int step = 0; step < 3; ++step) {
      std::tie(want, got) = both({Feed{a, {&next, 1}, false}, Feed{a2, p2, false}},
                                 {Feed{b, {&next, 1}, false}, Feed{b2, p2, false}});
      ASSERT_EQ(got, want) << "two sequences, step " << step;
    }
  }
}

// Stages timed on the GPU (an observer that waits for each op, so each runs eagerly and alone):
// the logits stay exactly the graphed engine's, every stage gets device time, and each stage's
// bytes are the CPU engine's for the same steps.
TEST(CudaEngine, TimedStagesKeepTheResults) {
  TS_REQUIRE_CUDA_DEVICE();
  const Case c{model::DecoderArch::llama, DType::q4_0, DType::f16, false, false};
  const model::DecoderModel m = make_model(c);
  ops::TallySwitch cpu_watch, gpu_watch;
  ops::OpTally cpu_stages, gpu_stages;
  gpu_watch.synchronize = true;
  EngineOptions co = options(c, false), to = options(c, true);
  co.ctx.observer = &cpu_watch;
  to.ctx.observer = &gpu_watch;
  Engine cpu(m, co), graphed(m, options(c, true)), timed(m, to);
  const std::vector<int32_t> p = test::random_tokens(30, m.config.vocab, 6);
  const int32_t a = cpu.new_sequence(), b = graphed.new_sequence(), t = timed.new_sequence();
  cpu.forward({Feed{a, p, false}});
  EXPECT_EQ(timed.forward({Feed{t, p, false}}), graphed.forward({Feed{b, p, false}}));
  cpu_watch.into = &cpu_stages;
  gpu_watch.into = &gpu_stages;
  int32_t next = 3;
  for (int step = 0; step < 4; ++step) {
    cpu.forward({Feed{a, {&next, 1}, false}});
    const std::vector<float> want = graphed.forward({Feed{b, {&next, 1}, false}});
    ASSERT_EQ(timed.forward({Feed{t, {&next, 1}, false}}), want) << "decode step " << step;
    next = static_cast<int32_t>(std::max_element(want.begin(), want.end()) - want.begin());
  }
  auto scope = [](const ops::OpTally& tally, const char* name) {
    for (const ops::ScopeTotal& s : tally.scopes())
      if (s.name == name) return s;
    return ops::ScopeTotal{};
  };
  for (int i = 0; i < kNumStages; ++i) {
    const char* name = stage_name(static_cast<Stage>(i));
    const ops::ScopeTotal g = scope(gpu_stages, name), h = scope(cpu_stages, name);
    EXPECT_GT(g.seconds, 0) << name;
    EXPECT_GT(g.bytes, 0) << name;
    EXPECT_NEAR(g.bytes, h.bytes, 1e-9 * h.bytes) << name;
  }
}

TEST(CudaEngine, RefusesWhatTheKernelsCannotTake) {
  TS_REQUIRE_CUDA_DEVICE();
  // Head dim 8: the paged attention kernel takes 64 or 128.
  test::TinyOptions o;
  const model::DecoderModel small = test::make_tiny_model(o);
  EngineOptions eo;
  eo.max_ctx = 64;
  cuda::register_ops_backend();
  eo.ctx.device = ops::Device::cuda;
  Engine e(small, eo);
  const int32_t seq = e.new_sequence();
  const std::vector<int32_t> p = test::random_tokens(3, small.config.vocab, 1);
  test::expect_error([&] { e.forward({Feed{seq, p, false}}); }, "head dim D=8");
}

// A sliding window of 20 keys over a 50-token prompt (chunks of 24: the tiles' rows start their
// keys at different points, the later ones past the first key tile) and 12 decode steps after
// it, against the CPU engine, which reads the same window; an f32 cache takes the decode kernel
// for every row, an f16 cache the tiles for the prompt.
TEST(CudaEngine, SlidingWindowMatchesCpu) {
  TS_REQUIRE_CUDA_DEVICE();
  for (const Case& c : {Case{model::DecoderArch::llama, DType::f16, DType::f16, false, false},
                        Case{model::DecoderArch::llama, DType::f32, DType::f32, false, true},
                        Case{model::DecoderArch::llama, DType::q4_0, DType::f16, false, false}}) {
    model::DecoderModel m = make_model(c);
    m.config.sliding_window = 20;
    Engine cpu(m, options(c, false)), gpu(m, options(c, true));
    const std::vector<int32_t> p = test::random_tokens(50, m.config.vocab, 12);
    const int32_t a = cpu.new_sequence(), b = gpu.new_sequence();
    const std::string name = case_name(c);
    expect_close(gpu.forward({Feed{b, p, true}}), cpu.forward({Feed{a, p, true}}), allowance(c),
                 name + " prompt");
    int32_t next = 6;
    for (int step = 0; step < 12; ++step) {
      const std::vector<float> w = cpu.forward({Feed{a, {&next, 1}, false}});
      expect_close(gpu.forward({Feed{b, {&next, 1}, false}}), w, allowance(c),
                   cat(name, " step ", step));
      next = static_cast<int32_t>(std::max_element(w.begin(), w.end()) - w.begin());
    }
  }
}

}  // namespace
}  // namespace tessera::infer
