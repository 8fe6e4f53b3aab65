// The planner: a dry run of the model's own forward pass for the op list, roofs for the times,
// the model's tensors for the memory.
#include "explain/plan.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "core/arena.h"
#include "core/error.h"
#include "core/interleave.h"
#include "core/rng.h"
#include "core/thread_pool.h"
#include "infer/engine.h"
#include "infer/sampler.h"
#include "model/decoder_forward.h"
#include "ops/op_tally.h"
#include "ops/ops.h"
#include "ops/paged_attention.h"
#include "ops/quant.h"
#include "profile/timer.h"

namespace tessera::explain {

namespace {

// Median seconds of `reps` calls of f after one warm-up call.
template <typename F>
double median_seconds(int reps, F&& f) {
  f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const profile::Timer timer;
    f();
    t.push_back(timer.seconds());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

bool is_product(const std::string& op) {
  return op.starts_with("matmul_wt") || op == "gemm";
}

// "q4_1x8" -> "q4_1": the stored type of a layout.
std::string plain_name(const std::string& dtype) {
  for (int i = 0; i < 64; ++i) {
    const auto t = static_cast<DType>(i);
    if (dtype_name(t) == dtype) return std::string(dtype_name(plain_type(t)));
    if (t == DType::q6_kx8) break;
  }
  return dtype;
}

// The engine's cache layout on the CPU for the model's heads: blocks of `block` tokens, keys
// then values in each.
void set_cpu_layout(ops::PagedKvLayout& a, const model::DecoderConfig& c, DType kv_type,
                    int64_t block) {
  a.Hkv = c.n_kv_heads;
  a.D = c.head_dim;
  a.kv_type = kv_type;
  a.k_transposed = ops::paged_keys_transposed(ops::Device::cpu);
  a.block_tokens = block;
  a.v_offset = block * a.Hkv * a.D;
  a.block_stride = 2 * a.v_offset;
}

// The rate (GB/s of cached keys and values) at which paged attention reads a cache that streams
// from memory: `rows` decode rows of `keys` keys each, the layer's cache cycled through copies
// that together pass ~150 MB (past the L3 these VMs give a process, as a decode step's cache
// reads are between one layer and the next), the model's heads and the engine's layout. The
// kernel's arithmetic (exponentials, f16 widening) and how its work splits over the threads at
// that many rows are in the rate: on these VMs it reaches about half the read roof at 8 rows, a
// third at one.
double measure_attention_gbs(const ops::Context& ctx, const model::DecoderConfig& c, DType kv_type,
                             int64_t kRows, int64_t kKeys) {
  constexpr int64_t kBlock = 32;
  ops::PagedAttentionArgs a;
  set_cpu_layout(a, c, kv_type, kBlock);
  const int64_t blocks = kRows * ((kKeys + kBlock - 1) / kBlock), elems = blocks * a.block_stride;
  const auto layer_bytes = static_cast<size_t>(elems * dtype_bytes(kv_type, 1));
  const auto kCopies = static_cast<int64_t>(std::max<size_t>(2, (150u << 20) / layer_bytes + 1));
  AlignedBuffer<uint8_t> kv(layer_bytes * static_cast<size_t>(kCopies));
  std::memset(kv.data(), 0, kv.size());  // zeros: finite in f32 and f16 alike
  std::vector<int32_t> tables(static_cast<size_t>(blocks)), n_keys(kRows, kKeys);
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = static_cast<int32_t>(i);
  std::vector<float> q(static_cast<size_t>(kRows * c.n_heads * c.head_dim), 0.1f), out(q.size());
  a.out = out.data();
  a.q = q.data();
  a.rows = kRows;
  a.H = c.n_heads;
  a.block_tables = tables.data();
  a.table_stride = (kKeys + kBlock - 1) / kBlock;
  a.n_keys = n_keys.data();
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  int64_t copy = 0;
  const double s = median_seconds(3, [&] {
    for (int64_t i = 0; i < kCopies; ++i, ++copy) {
      a.kv = kv.data() + static_cast<size_t>(copy % kCopies) * layer_bytes;
      ops::paged_attention(ctx, a);
    }
  });
  return static_cast<double>(kCopies) * ops::paged_attention_cost(a).bytes / s * 1e-9;
}

// The GFLOP/s of paged attention over a prompt: 128 rows of one sequence at positions 384..511
// (each attending to the keys up to its own), the sequence's cache hot as a prompt chunk finds
// it, the model's heads and the engine's layout.
double measure_prefill_attention_gflops(const ops::Context& ctx, const model::DecoderConfig& c,
                                        DType kv_type) {
  constexpr int64_t kRows = 128, kKeys = 512, kBlock = 32, kBlocks = kKeys / kBlock;
  ops::PagedAttentionArgs a;
  set_cpu_layout(a, c, kv_type, kBlock);
  AlignedBuffer<uint8_t> kv(
      static_cast<size_t>(kBlocks * a.block_stride * dtype_bytes(kv_type, 1)));
  std::memset(kv.data(), 0, kv.size());
  std::vector<int32_t> tables(static_cast<size_t>(kRows * kBlocks)), n_keys(kRows);
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = static_cast<int32_t>(i % kBlocks);
  for (int64_t r = 0; r < kRows; ++r) n_keys[static_cast<size_t>(r)] = kKeys - kRows + 1 + r;
  std::vector<float> q(static_cast<size_t>(kRows * c.n_heads * c.head_dim), 0.1f), out(q.size());
  a.kv = kv.data();
  a.out = out.data();
  a.q = q.data();
  a.rows = kRows;
  a.H = c.n_heads;
  a.block_tables = tables.data();
  a.table_stride = kBlocks;
  a.n_keys = n_keys.data();
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  const double s = median_seconds(5, [&] { ops::paged_attention(ctx, a); });
  return ops::paged_attention_cost(a).flops / s * 1e-9;
}

// Seconds per row that a layer's rotation and cache append (ops::rope_kv_append, as the engine
// issues it) take writing into a cache that streams from memory: 16 rows a call, each into a
// block of its own, successive calls into other blocks of a cache as large as the attention
// measurement's (6,144 blocks: 151 MB for SmolLM2 in f16; with 768 the lines stayed in the caches
// and the append came out 4x faster than in a decode step). With the keys stored transposed,
// each key element lands in a cache line of its own, so the append costs far more than its bytes
// say.
double measure_rope_kv_append_row_s(const ops::Context& ctx, const model::DecoderConfig& c,
                                    DType kv_type) {
  constexpr int64_t kRows = 16, kBlock = 32, kBlocks = 16 * 48 * 8;
  ops::RopeKvAppendArgs a;
  set_cpu_layout(a, c, kv_type, kBlock);
  a.n_blocks = kBlocks;
  AlignedBuffer<uint8_t> kv(
      static_cast<size_t>(kBlocks * a.block_stride * dtype_bytes(kv_type, 1)));
  std::memset(kv.data(), 0, kv.size());
  const int64_t QD = c.q_dim(), KV = c.kv_dim(), ld = QD + 2 * KV;
  std::vector<float> qkv(static_cast<size_t>(kRows * ld), 0.5f), q(static_cast<size_t>(kRows * QD));
  std::vector<int32_t> slot(kRows), pos(kRows);
  constexpr int64_t kPositions = 4096;
  ops::RopeTable rope;
  if (c.arch == model::DecoderArch::llama) {
    rope = ops::make_rope_table(kPositions, model::rope_inv_freqs(c), c.rope_attn_factor);
    a.rope = &rope;
    a.layout = c.rope_layout;
    a.positions = pos.data();
  }
  a.kv = kv.data();
  a.q = qkv.data(), a.ldq = ld, a.H = c.n_heads, a.q_out = q.data();
  a.k = qkv.data() + QD;
  a.v = qkv.data() + QD + KV;
  a.ldk = a.ldv = ld;
  a.rows = kRows;
  a.slot = slot.data();
  int64_t step = 0;
  constexpr int64_t kCalls = 48;  // one per copy of the layer, as a step's layers follow
  const double s = median_seconds(5, [&] {
    for (int64_t call = 0; call < kCalls; ++call, ++step) {
      for (int64_t r = 0; r < kRows; ++r) {  // row r of this call: its block, the next token
        slot[static_cast<size_t>(r)] =
            static_cast<int32_t>(((step % 384) * kRows + r) * kBlock + (step / 384) % kBlock);
        pos[static_cast<size_t>(r)] = static_cast<int32_t>(step % kPositions);
      }
      ops::rope_kv_append(ctx, a);
    }
  });
  return s / static_cast<double>(kCalls * kRows);
}

// One greedy pick over the vocabulary's logits (the sampler every decode step runs per
// sequence), in seconds.
double measure_sample_s(int64_t vocab) {
  std::vector<float> logits(static_cast<size_t>(vocab));
  Rng rng(3);
  for (float& x : logits) x = static_cast<float>(rng.uniform());
  infer::SamplingParams p;
  p.temperature = 0;
  infer::Sampler sampler(p);
  return median_seconds(7, [&] { (void)sampler.sample(logits, {}); });
}

bool is_attention(const std::string& op) {
  return op == "paged_attention" || op == "rope_kv_append";
}

// "m=1 k=576 n=960", "k" -> 576; 0 when absent.
int64_t shape_extent(const std::string& shape, const std::string& name) {
  const std::string key = name + "=";
  for (size_t at = shape.find(key); at != std::string::npos; at = shape.find(key, at + 1))
    if (at == 0 || shape[at - 1] == ' ') return std::atoll(shape.c_str() + at + key.size());
  return 0;
}

// The matrices the weight products read: every layer's, and the head (the embedding if tied).
std::vector<const model::WeightRef*> product_sources(const model::DecoderModel& model) {
  std::vector<const model::WeightRef*> out;
  for (const model::DecoderLayer& l : model.weights.layers)
    for (const model::WeightRef* w : l.matrices()) out.push_back(w);
  out.push_back(model.weights.output.present() ? &model.weights.output : &model.weights.tok_embd);
  return out;
}

double weight_bytes(const model::DecoderModel& model) {
  double bytes = 0;
  std::map<const void*, bool> seen;  // a tied head is the embedding's bytes
  for (const model::WeightRef* w : product_sources(model))
    if (w->present() && !seen[w->data]) {
      seen[w->data] = true;
      bytes += static_cast<double>(w->bytes());
    }
  return bytes;
}

// The measured rate of products of this type and shape, or null.
const ProductRate* machine_rate(const Machine& m, const std::string& dtype, int64_t k, int64_t n) {
  for (const ProductRate& r : m.product_rates)
    if (r.dtype == dtype && r.k == k && r.n == n) return &r;
  return nullptr;
}

// The rows of each product in one call of a grouped product of `n` rows: the layer's matrices
// of this type and width whose rows add up to n (the fewest that do; matrices of equal shapes
// time alike), those that follow each other in memory joined into one product as the model's
// forward joins them. {n} where none add up.
std::vector<int64_t> group_parts(const model::DecoderModel& model, const std::string& dtype,
                                 int64_t k, int64_t n) {
  std::vector<const model::WeightRef*> cand;
  for (const model::WeightRef* w : model.weights.layers.at(0).matrices())
    if (w->present() && w->shape.rank() == 2 && w->cols() == k &&
        dtype_name(plain_type(w->type)) == dtype)
      cand.push_back(w);
  uint32_t best = 0;
  for (uint32_t set = 1; set < (1u << cand.size()); ++set) {
    int64_t rows = 0;
    for (size_t i = 0; i < cand.size(); ++i)
      if (set >> i & 1) rows += cand[i]->rows();
    if (rows == n && std::popcount(set) >= 2 &&
        (best == 0 || std::popcount(set) < std::popcount(best)))
      best = set;
  }
  if (best == 0) return {n};
  std::vector<int64_t> parts;
  const model::WeightRef* last = nullptr;
  for (size_t i = 0; i < cand.size(); ++i) {
    if (!(best >> i & 1)) continue;
    if (last != nullptr && last->continued_by(*cand[i]))
      parts.back() += cand[i]->rows();
    else
      parts.push_back(cand[i]->rows());
    last = cand[i];
  }
  return parts;
}

// Measures rate (its dtype, k and n set) at each of rows_list: the products of one call (a
// group's parts, or one matrix) made of the model's own rows of that type and width, in the
// layout the engine gives them, cycled through copies that fill ring_bytes (see cpu_machine).
// False when the model has no rows of that type and width.
bool measure_product(const ops::Context& ctx, const model::DecoderModel& model, bool grouped,
                     double ring_bytes, const std::vector<int64_t>& rows_list, ProductRate& rate) {
  const model::WeightRef* src = nullptr;
  for (const model::WeightRef* w : product_sources(model))
    if (w->present() && w->shape.rank() == 2 && w->cols() == rate.k &&
        dtype_name(plain_type(w->type)) == rate.dtype)
      src = w;
  if (src == nullptr) return false;
  const int64_t N = rate.n, K = rate.k;
  const std::vector<int64_t> parts =
      grouped ? group_parts(model, rate.dtype, K, N) : std::vector<int64_t>{N};
  const auto row_bytes = static_cast<size_t>(dtype_bytes(src->type, K));
  std::vector<size_t> offset;  // of each part in a copy
  std::vector<DType> layout;
  size_t stride = 0;
  for (int64_t p : parts) {
    offset.push_back(stride);
    layout.push_back(ops::cpu_preferred_layout(plain_type(src->type), p));
    stride += (row_bytes * static_cast<size_t>(p) + 63) / 64 * 64;
  }
  const auto copies =
      static_cast<size_t>(std::max(1.0, std::ceil(ring_bytes / static_cast<double>(stride))));
  AlignedBuffer<uint8_t> wb(stride * copies);
  const auto* from = static_cast<const uint8_t*>(src->data);
  for (size_t i = 0; i < parts.size(); ++i) {
    uint8_t* to = wb.data() + offset[i];
    for (int64_t r = 0; r < parts[i]; ++r)  // the source's rows, over again where it has fewer
      std::memcpy(to + static_cast<size_t>(r) * row_bytes,
                  from + static_cast<size_t>(r % src->rows()) * row_bytes, row_bytes);
    // The engine rearranges plain matrices once at load; so does this copy.
    if (src->type != layout[i]) interleave_rows(src->type, to, parts[i], K);
  }
  for (size_t i = 1; i < copies; ++i) std::memcpy(wb.data() + i * stride, wb.data(), stride);
  size_t cursor = 0;  // where the ring goes on: what the last call read is not read again soon
  for (int64_t rows : rows_list) {
    std::vector<float> x(static_cast<size_t>(rows * K), 0.01f), y(static_cast<size_t>(rows * N));
    auto call = [&](size_t copy) {
      ops::WtProduct products[8];
      int64_t col = 0;
      for (size_t i = 0; i < parts.size() && i < 8; ++i) {
        products[i] = ops::WtProduct{
            y.data() + col, N, wb.data() + copy * stride + offset[i], layout[i], parts[i], nullptr};
        col += parts[i];
      }
      if (parts.size() == 1)
        ops::matmul_wt(ctx, y.data(), N, x.data(), rows, K, products[0].w, layout[0], N);
      else
        ops::matmul_wt_group(ctx, x.data(), rows, K, {products, std::min<size_t>(parts.size(), 8)});
    };
    double flops = 0;
    for (size_t i = 0; i < parts.size(); ++i)
      flops += ops::matmul_wt_cost(rows, K, parts[i], layout[i]).flops;
    // Each timed call reads the whole ring, or ~2 GFLOP of it where that is less (the ring's
    // place persists, so the bytes stay cold); prefill's rows read one hot copy.
    const size_t per_call =
        rows > 64 ? 1 : std::clamp<size_t>(static_cast<size_t>(2e9 / flops), 1, copies);
    const double s = median_seconds(rows >= 64 ? 3 : 5, [&] {
      for (size_t i = 0; i<per_call; ++i, cursor = rows> 64 ? 0 : (cursor + 1) % copies)
        call(cursor);
    });
    rate.gflops[rows] = static_cast<double>(per_call) * flops / s * 1e-9;
    rate.hot_gflops[rows] =
        rows > 64 ? rate.gflops[rows] : flops / median_seconds(5, [&] { call(0); }) * 1e-9;
  }
  return true;
}

}  // namespace

double ProductRate::interpolate(const std::map<int64_t, double>& g, int64_t rows) {
  if (g.empty()) return 0;
  auto hi = g.lower_bound(rows);
  if (hi == g.end()) return std::prev(hi)->second;
  if (hi->first == rows || hi == g.begin()) return hi->second;
  auto lo = std::prev(hi);
  const double f =
      (std::log(static_cast<double>(rows)) - std::log(static_cast<double>(lo->first))) /
      (std::log(static_cast<double>(hi->first)) - std::log(static_cast<double>(lo->first)));
  return lo->second + f * (hi->second - lo->second);
}

Machine cpu_machine(const profile::MachinePeaks& peaks, int threads,
                    const model::DecoderModel& model, int64_t prefill_rows, DType kv_type,
                    int64_t context) {
  Machine m;
  m.name = "cpu: " + peaks.cpu + ", " + std::to_string(threads) + " threads";
  m.measured = true;
  m.roofs = cpu_roofs(peaks, threads);
  ThreadPool pool(threads);
  ops::Context ctx;
  ctx.pool = &pool;
  // The fixed cost of a call, measured as the engine pays it at decode: one row through small
  // ops (a residual add, a norm) and a tiny product, each handed to the pool like the real
  // ones; the mean of the three.
  {
    constexpr int64_t C = 576, Kp = 64, Np = 64;
    std::vector<float> x(C, 1.0f), w(C, 1.0f), y(C), rstd(1), wp(Np * Kp, 0.5f), yp(Np);
    const double add_s =
        median_seconds(51, [&] { ops::add(ctx, y.data(), x.data(), x.data(), C); });
    const double norm_s = median_seconds(51, [&] {
      ops::rmsnorm_forward(ctx, y.data(), rstd.data(), x.data(), w.data(), 1, C, 1e-5f);
    });
    const double product_s = median_seconds(51, [&] {
      ops::matmul_wt(ctx, yp.data(), Np, x.data(), 1, Kp, wp.data(), DType::f32, Np);
    });
    m.call_overhead_s = (add_s + norm_s + product_s) / 3;
  }
  // The products' rate at several row counts for each product of a decode step (type, k, n:
  // a grouped product counts as one of all its rows), on a matrix of that shape made of the
  // model's own rows of that type in the layout the engine gives it. A decode step reads every
  // weight once, so for 1..64 rows the matrix is cycled through copies that together are as
  // large as the model's weights (at most twice the L3): the rate then includes reading the
  // weights from where a step finds them (the L3 for a model that fits, memory for one that
  // does not) and however much of that the kernel overlaps with its arithmetic, which the
  // roofline's max() of the two would assume is all of it. Prefill's many rows reuse each
  // weight enough that one hot matrix gives their rate.
  const double ring_cap = peaks.l3_bytes > 0 ? 2.0 * static_cast<double>(peaks.l3_bytes) : 1 << 30;
  const double ring_bytes = std::min(weight_bytes(model), ring_cap);
  std::vector<int64_t> rows_list{1, 4, 16, 64};
  if (prefill_rows > 64) rows_list.push_back(prefill_rows);
  for (const ops::OpTotal& t :
       forward_ops(model, 1, 1, 1, kv_type, std::min<int64_t>(32, model.config.max_ctx))) {
    if (!is_product(t.op)) continue;
    ProductRate rate;
    rate.dtype = plain_name(t.dtype);
    rate.k = shape_extent(t.shape, "k");
    rate.n = shape_extent(t.shape, "n");
    if (machine_rate(m, rate.dtype, rate.k, rate.n) != nullptr) continue;
    if (measure_product(ctx, model, t.op == "matmul_wt_group", ring_bytes, rows_list, rate))
      m.product_rates.push_back(std::move(rate));
  }
  // Decode's attention at the plan's context (at most 4,096 keys a row, to bound the
  // measurement), at 1, 8 and 32 rows.
  const int64_t keys = std::clamp<int64_t>(context, 32, 4096);
  for (int64_t rows : {1, 8, 32})
    m.attention_gbs_at[rows] = measure_attention_gbs(ctx, model.config, kv_type, rows, keys);
  m.attention_gbs = m.attention_gbs_at[8];
  m.prefill_attention_gflops = measure_prefill_attention_gflops(ctx, model.config, kv_type);
  m.rope_kv_append_row_s = measure_rope_kv_append_row_s(ctx, model.config, kv_type);
  m.sample_s = measure_sample_s(model.config.vocab);
  m.memory_bytes = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  return m;
}

Machine gpu_machine(const profile::GpuSpec& spec) {
  Machine m;
  m.name = spec.name + (spec.datasheet ? " (datasheet)" : " (spec file)");
  m.roofs.memory_gbs = spec.hbm_gbs;
  m.roofs.memory_name = "HBM";
  const double bf16 = spec.bf16_dense_tflops * 1e3;
  // Quantized weights are dequantized to bf16 for the tensor cores past a few rows; decode's
  // products are bound by bytes either way.
  m.roofs.compute = [bf16](const ops::OpTotal&) { return ComputePeak{bf16, "bf16 tensor"}; };
  m.call_overhead_s = 5e-6;
  m.memory_bytes = static_cast<double>(spec.memory_bytes);
  m.watts = spec.tdp_watts;
  m.watts_source = "TDP (datasheet)";
  return m;
}

std::vector<ops::OpTotal> forward_ops(const model::DecoderModel& m, int64_t sequences,
                                      int64_t rows_each, int64_t context, DType kv_type,
                                      int64_t block_tokens) {
  TS_CHECK(sequences >= 1 && rows_each >= 1 && rows_each <= context, "[plan] bad step: sequences ",
           sequences, ", rows ", rows_each, ", context ", context);
  const model::DecoderConfig& c = m.config;
  ops::OpTally tally;
  ops::Context ctx;
  ctx.dry_run = true;
  ctx.observer = &tally;
  const int64_t n = sequences * rows_each;
  model::DecoderForward fwd(m, ctx, n, context);
  const int64_t blocks_each = (context + block_tokens - 1) / block_tokens;
  // Every sequence's table names blocks of its own; nothing is read or written through them.
  std::vector<int32_t> tables(static_cast<size_t>(sequences * blocks_each));
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = static_cast<int32_t>(i);
  std::vector<int32_t> tokens(static_cast<size_t>(n), 1), pos(static_cast<size_t>(n));
  std::vector<const int32_t*> row_tables(static_cast<size_t>(n));
  std::vector<uint8_t> want(static_cast<size_t>(n), 0);
  for (int64_t s = 0; s < sequences; ++s)
    for (int64_t r = 0; r < rows_each; ++r) {
      const auto i = static_cast<size_t>(s * rows_each + r);
      pos[i] = static_cast<int32_t>(context - rows_each + r);
      row_tables[i] = tables.data() + s * blocks_each;
      want[i] = r == rows_each - 1;  // the last row of each sequence: its next token
    }
  model::DecoderRows rows;
  rows.n = n;
  rows.tokens = tokens.data();
  rows.pos = pos.data();
  rows.tables = row_tables.data();
  rows.want_logits = want.data();
  model::PagedKv kv;
  // A cache is never touched in a dry run; its layout still sets the ops' shapes and costs.
  static uint8_t no_cache;
  kv.base = &no_cache;
  kv.n_blocks = sequences * blocks_each;
  kv.layout.Hkv = c.n_kv_heads;
  kv.layout.D = c.head_dim;
  kv.layout.kv_type = kv_type;
  kv.layout.block_tokens = block_tokens;
  kv.layout.block_stride = 2 * block_tokens * c.n_kv_heads * c.head_dim;
  kv.layout.v_offset = block_tokens * c.n_kv_heads * c.head_dim;
  kv.layer_stride = kv.layout.block_stride * kv.n_blocks;
  static float no_logits;  // never written in a dry run
  fwd.forward(rows, kv, &no_logits);
  return tally.totals();
}

StepPrediction predict_step(const model::DecoderModel& m, const Machine& machine, int64_t sequences,
                            int64_t rows_each, int64_t context, const PlanInput& in) {
  StepPrediction p =
      price_ops(forward_ops(m, sequences, rows_each, context, in.kv_type, in.block_tokens), machine,
                sequences * rows_each, rows_each);
  // Each sequence's next token picked from its logits: host work beside the ops.
  p.sample_s = static_cast<double>(sequences) * machine.sample_s;
  p.seconds += p.sample_s;
  p.overhead_s += p.sample_s;
  p.tokens_per_s = p.seconds > 0 ? static_cast<double>(p.rows) / p.seconds : 0;
  p.sequences = sequences;
  p.context = context;
  return p;
}

StepPrediction price_ops(const std::vector<ops::OpTotal>& ops, const Machine& machine, int64_t rows,
                         int64_t rows_each) {
  const bool decode = rows_each == 1;
  StepPrediction p;
  p.rows = rows;
  double state = 0;
  for (const ops::OpTotal& t : ops) state += t.state_bytes;
  Roofs roofs = machine.roofs;
  if (machine.op_gflops) {
    const auto base = roofs.compute;
    roofs.compute = [base, &machine, rows](const ops::OpTotal& t) {
      const int64_t m = shape_extent(t.shape, "m");  // the op's rows (the head's: 1 a sequence)
      const double g = is_product(t.op) ? machine.op_gflops(t, m > 0 ? m : rows) : 0;
      return g > 0 ? ComputePeak{g, "kernel"} : base(t);
    };
  }
  for (const ops::OpTotal& t : ops) {
    OpPrediction o;
    o.op = t;
    o.roof = roof_time(roofs, t, state);
    if (rows_each > 1 && t.op == "paged_attention" && machine.prefill_attention_gflops > 0) {
      // Measured with its cache hot, as a prompt's rows find it: the time, not a roof.
      o.roof.compute_s = t.flops / (machine.prefill_attention_gflops * 1e9);
      o.roof.memory_s = 0;
      o.roof.compute_roof = "attention";
    }
    const ProductRate* rate =
        is_product(t.op) ? machine_rate(machine, plain_name(t.dtype), shape_extent(t.shape, "k"),
                                        shape_extent(t.shape, "n"))
                         : nullptr;
    if (rate != nullptr) {
      // The measured time, on the side of whichever binds: the kernel's hot compute time or
      // the weights' bytes at the memory roof.
      const int64_t m = std::max<int64_t>(shape_extent(t.shape, "m"), 1);
      const double measured_s = t.flops / (rate->at(m) * 1e9),
                   hot_s = t.flops / (rate->hot_at(m) * 1e9);
      o.roof.compute_roof = "kernel";
      if (hot_s >= o.roof.memory_s)
        o.roof.compute_s = std::max(measured_s, hot_s);
      else
        o.roof.memory_s = std::max(measured_s, o.roof.memory_s), o.roof.compute_s = hot_s;
    }
    if (decode && t.op == "paged_attention" && machine.attention_gbs > 0 &&
        o.roof.memory_level != "L2") {
      // Measured with its arithmetic running: the time, not a roof to max() with compute.
      const double gbs =
          machine.attention_gbs_at.empty()
              ? machine.attention_gbs
              : ProductRate::interpolate(machine.attention_gbs_at, shape_extent(t.shape, "rows"));
      o.roof.memory_s = t.bytes / (gbs * 1e9);
      o.roof.compute_s = 0;
      o.roof.memory_level = "attention";
    }
    if (decode && t.op == "rope_kv_append" && machine.rope_kv_append_row_s > 0) {
      o.roof.memory_s = static_cast<double>(t.calls * shape_extent(t.shape, "rows")) *
                        machine.rope_kv_append_row_s;
      o.roof.compute_s = 0;
      o.roof.memory_level = "kv append";
    }
    o.overhead_s = static_cast<double>(t.calls) * machine.call_overhead_s;
    const double roof_s = o.roof.seconds();
    p.seconds += o.seconds();
    p.overhead_s += o.overhead_s;
    if (o.overhead_s > roof_s)
      p.overhead_s += roof_s;  // a call too small for its roof to matter
    else if (o.roof.compute_bound())
      p.compute_s += roof_s;
    else if (is_attention(t.op))
      p.kv_s += roof_s;
    else if (t.state_bytes > 0)
      p.weights_s += roof_s;
    else
      p.other_memory_s += roof_s;
    if (is_attention(t.op)) p.attention_s += o.seconds();
    p.ops.push_back(std::move(o));
  }
  p.tokens_per_s = p.seconds > 0 ? static_cast<double>(p.rows) / p.seconds : 0;
  const std::pair<double, const char*> parts[] = {{p.weights_s, "weights"},
                                                  {p.kv_s, "kv-cache"},
                                                  {p.compute_s, "compute"},
                                                  {p.overhead_s, "overhead"}};
  p.bound = std::max_element(std::begin(parts), std::end(parts))->second;
  return p;
}

MemoryPrediction predict_memory(const model::DecoderModel& m, const PlanInput& in,
                                int64_t sequences, int64_t context) {
  MemoryPrediction mp;
  const model::DecoderConfig& c = m.config;
  std::map<std::string, double> by_type;
  std::map<const void*, bool> seen;  // a tied head is the embedding's bytes
  auto add = [&](const model::WeightRef& w) {
    if (!w.present() || seen[w.data]) return;
    seen[w.data] = true;
    by_type[std::string(dtype_name(plain_type(w.type)))] += static_cast<double>(w.bytes());
  };
  add(m.weights.tok_embd);
  add(m.weights.pos_embd);
  for (const model::DecoderLayer& l : m.weights.layers) {
    for (const model::WeightRef* w : l.matrices()) add(*w);
    for (const model::WeightRef* w : l.vectors()) add(*w);
  }
  add(m.weights.out_norm);
  add(m.weights.out_norm_b);
  add(m.weights.output);
  for (const auto& [type, bytes] : by_type) {
    mp.weights_by_dtype.emplace_back(type, bytes);
    mp.weights += bytes;
  }
  mp.kv_per_token = 2.0 * static_cast<double>(c.n_layers * c.n_kv_heads * c.head_dim) *
                    static_cast<double>(dtype_bytes(in.kv_type, 1));
  // The engine's pools for `sequences` contexts (a sliding-window model's windowed layers hold
  // only their windows).
  const int64_t blocks = (context + in.block_tokens - 1) / in.block_tokens;
  infer::EngineOptions eo;
  eo.max_ctx = std::min(context, c.max_ctx);
  eo.kv_tokens = std::max<int64_t>(sequences, 1) * blocks * in.block_tokens;
  eo.block_tokens = in.block_tokens;
  eo.kv_type = in.kv_type;
  eo.max_rows = in.prefill_rows;
  eo.max_sequences = std::max<int64_t>(sequences, 1);
  mp.kv = sequences > 0 ? static_cast<double>(infer::kv_pools(c, eo).bytes()) : 0.0;
  mp.activations = static_cast<double>(model::DecoderForward::activation_bytes(c, in.prefill_rows));
  // The engine's logits: a row of V floats for each sequence decoding.
  mp.logits = 4.0 * static_cast<double>(c.vocab * std::max(sequences, int64_t{1}));
  mp.baseline = in.baseline_bytes;
  return mp;
}

Plan make_plan(const model::DecoderModel& m, const Machine& machine, const PlanInput& in) {
  TS_CHECK(!in.batches.empty(), "[plan] no batch sizes");
  TS_CHECK(in.context >= 1 && in.context <= m.config.max_ctx, "[plan] context ", in.context,
           " outside the model's 1 .. ", m.config.max_ctx);
  Plan plan;
  plan.machine = machine;
  plan.input = in;
  const int64_t biggest = *std::max_element(in.batches.begin(), in.batches.end());
  plan.memory = predict_memory(m, in, biggest, in.context);
  const double cap = machine.memory_bytes;
  plan.fits = cap <= 0 || plan.memory.total() <= cap;
  // The largest batch at the context, and the longest context for one sequence, that fit.
  auto fits = [&](int64_t seqs, int64_t ctx) {
    return cap <= 0 || predict_memory(m, in, seqs, ctx).total() <= cap;
  };
  for (int64_t b = 1; b <= (int64_t{1} << 20) && fits(b, in.context); b *= 2) plan.max_batch = b;
  if (plan.max_batch > 0)  // refine between the last power of two that fits and the next
    for (int64_t step = plan.max_batch / 2; step >= 1; step /= 2)
      if (fits(plan.max_batch + step, in.context)) plan.max_batch += step;
  for (int64_t ctx = 1; ctx <= m.config.max_ctx && fits(1, ctx); ctx *= 2) plan.max_context = ctx;
  if (plan.max_context > 0 && fits(1, m.config.max_ctx)) plan.max_context = m.config.max_ctx;

  // Prefill: the prompt in chunks of prefill_rows, each attending to everything before it.
  const int64_t chunk = std::min(in.prefill_rows, in.context);
  double prompt_s = 0;
  for (int64_t end = chunk; end <= in.context; end += chunk) {
    const StepPrediction s = predict_step(m, machine, 1, chunk, end, in);
    prompt_s += s.seconds;
    if (end + chunk > in.context) plan.prefill = s;
  }
  plan.prefill_tokens_per_s =
      prompt_s > 0 ? static_cast<double>(in.context / chunk * chunk) / prompt_s : 0;
  for (int64_t b : in.batches)
    plan.decode.push_back(predict_step(m, machine, b, 1, in.context, in));
  // The knee: the first batch where doubling it buys less than 10% more tokens per second.
  for (int64_t b = 1; b <= std::max<int64_t>(biggest, 2); b *= 2)
    plan.sweep.push_back(predict_step(m, machine, b, 1, in.context, in));
  for (size_t i = 0; i + 1 < plan.sweep.size(); ++i)
    if (plan.sweep[i + 1].tokens_per_s < 1.10 * plan.sweep[i].tokens_per_s) {
      const StepPrediction& s = plan.sweep[i + 1];
      plan.knee_batch = plan.sweep[i].sequences;
      plan.knee_reason =
          s.bound == "compute"
              ? "the weight products become compute-bound: more rows cost as much as they bring"
          : s.bound == "kv-cache"
              ? "attention reads each sequence's keys and values: the KV cache's bytes grow with "
                "the batch while the weights' do not"
          : s.bound == "overhead" ? "the fixed cost of each op call dominates"
                                  : "the weights' bytes still bind";
      break;
    }
  return plan;
}

}  // namespace tessera::explain
