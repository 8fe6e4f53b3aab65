// Paged attention at SmolLM2-135M's shapes (H=9, Hkv=3, D=64, 32-token blocks, keys transposed):
// causal prefill of one sequence and decode of a few sequences (one layer hot in cache, or 30
// layers in turn, as decode reads them), f16 and f32 caches.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "ops/paged_attention.h"

namespace {

using tessera::DType;

constexpr int64_t kD = 64, kBT = 32;

// One layer's cache for `seqs` sequences of `len` tokens each, blocks interleaved between the
// sequences (as an engine serving several of them would place them), and `rows` query rows.
struct Setup {
  std::vector<float> kv32, q, out;
  std::vector<uint16_t> kv16;
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> row_tables;  // (rows, nb): each row's sequence's table
  std::vector<int32_t> n_keys;
  tessera::ops::PagedAttentionArgs a;

  // Prefill (causal = true): `rows` rows of sequence 0 with n_keys 1..rows. Decode: one row per
  // sequence, each over all `len` keys.
  int64_t layer_elems = 0;  // one layer's cache; `layers` of them follow each other

  // kH query heads sharing kHkv key/value heads: SmolLM2-135M's 9 / 3 unless given.
  Setup(int64_t seqs, int64_t len, bool causal, DType type, int64_t layers = 1, int64_t kH = 9,
        int64_t kHkv = 3) {
    const int64_t nb = (len + kBT - 1) / kBT, half = kHkv * kBT * kD, stride = 2 * half;
    layer_elems = nb * seqs * stride;
    tables.assign(static_cast<size_t>(seqs), {});
    for (int64_t b = 0; b < nb; ++b)
      for (int64_t s = 0; s < seqs; ++s) tables[s].push_back(static_cast<int32_t>(b * seqs + s));
    tessera::Rng rng(1);
    kv32.resize(static_cast<size_t>(layers * layer_elems));
    for (auto& x : kv32) x = rng.normal();
    kv16.resize(kv32.size());
    tessera::from_f32(DType::f16, kv32.data(), kv16.data(), static_cast<int64_t>(kv16.size()));
    const int64_t rows = causal ? len : seqs;
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<int32_t>& t = tables[causal ? 0 : r];
      row_tables.insert(row_tables.end(), t.begin(), t.end());
      n_keys.push_back(static_cast<int32_t>(causal ? r + 1 : len));
    }
    q.resize(static_cast<size_t>(rows * kH * kD));
    for (auto& x : q) x = 2.0f * rng.normal();
    out.resize(q.size());
    a.out = out.data();
    a.q = q.data();
    a.rows = rows;
    a.H = kH;
    a.Hkv = kHkv;
    a.D = kD;
    a.kv = type == DType::f16 ? static_cast<const void*>(kv16.data()) : kv32.data();
    a.kv_type = type;
    a.k_transposed = true;
    a.block_tokens = kBT;
    a.block_stride = stride;
    a.v_offset = half;
    a.block_tables = row_tables.data();
    a.table_stride = nb;
    a.n_keys = n_keys.data();
    a.scale = 1.0f / std::sqrt(static_cast<float>(kD));
  }
};

// Calls cycle through the layers' caches, as a decode step does (a cache larger than L2 then
// streams from L3 or memory).
void run(benchmark::State& state, Setup& s, int64_t layers = 1, int64_t threads_arg = 2) {
  tessera::ThreadPool pool(static_cast<int>(state.range(threads_arg)));
  tessera::ops::Context ctx;
  ctx.pool = &pool;
  const size_t elem = s.a.kv_type == DType::f16 ? 2 : 4;
  const char* base = static_cast<const char*>(s.a.kv);
  int64_t layer = 0;
  for (auto _ : state) {
    s.a.kv = base + static_cast<size_t>(layer * s.layer_elems) * elem;
    tessera::ops::paged_attention(ctx, s.a);
    layer = (layer + 1) % layers;
  }
  state.counters["FLOP/s"] = benchmark::Counter(tessera::ops::paged_attention_cost(s.a).flops,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

// Args: tokens, f16 (1) or f32 (0), threads.
void BM_PagedAttentionPrefill(benchmark::State& state) {
  Setup s(1, state.range(0), true, state.range(1) ? DType::f16 : DType::f32);
  run(state, s);
}
BENCHMARK(BM_PagedAttentionPrefill)
    ->Args({512, 1, 1})
    ->Args({512, 1, 2})
    ->Args({512, 0, 1})
    ->Args({100, 1, 1})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// Args: keys per sequence, f16 (1) or f32 (0), threads, sequences (one row each), layers.
void BM_PagedAttentionDecode(benchmark::State& state) {
  Setup s(state.range(3), state.range(0), false, state.range(1) ? DType::f16 : DType::f32,
          state.range(4));
  run(state, s, state.range(4));
}
BENCHMARK(BM_PagedAttentionDecode)
    ->Args({512, 1, 1, 1, 1})
    ->Args({512, 1, 2, 1, 1})
    ->Args({575, 1, 1, 1, 1})
    ->Args({575, 1, 2, 1, 1})
    ->Args({512, 1, 2, 4, 1})
    ->Args({512, 1, 1, 1, 30})  // SmolLM2's 30 layers: 11.8 MB of cache
    ->Args({512, 1, 2, 1, 30})
    // 300 copies (118 MB): every call's cache comes from memory, as in a decode step, where the
    // weights read between two layers' attention evict it from L3.
    ->Args({512, 1, 1, 1, 300})
    ->Args({512, 1, 2, 1, 300})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// The synthetic 1.1B Llama's attention (32 query heads over 4 key/value heads: groups of 8),
// one row over 544 keys (a 512-token prompt and half of 64 generated), 22 layers' caches in
// turn; args: f16 (1) or f32 (0), threads.
void BM_PagedAttentionDecodeLlama1B(benchmark::State& state) {
  constexpr int64_t kLayers = 22;
  Setup s(1, 544, false, state.range(0) ? DType::f16 : DType::f32, kLayers, 32, 4);
  run(state, s, kLayers, 1);
}
BENCHMARK(BM_PagedAttentionDecodeLlama1B)
    ->Args({1, 1})
    ->Args({1, 2})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

}  // namespace
