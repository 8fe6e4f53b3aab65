// The planner: a dry run of the model's own forward pass for the op list, roofs for the times,
// the model's tensors for the memory.
#include "explain/plan.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "core/arena.h"
#include "core/error.h"
#include "core/interleave.h"
#include "core/thread_pool.h"
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

// The rate (GB/s of cached keys and values) at which paged attention reads a cache that streams
// from memory: 8 decode rows of 512 keys each, the layer's cache cycled through 48 copies (past
// the ~100 MiB of L3 these VMs have, as a decode step's cache reads are between one layer and
// the next), the model's heads and the engine's layout. The kernel's arithmetic (exponentials,
// f16 widening) is in the rate: on these VMs it reaches about half the read roof.
double measure_attention_gbs(const ops::Context& ctx, const model::DecoderConfig& c,
                             DType kv_type) {
  constexpr int64_t kRows = 8, kKeys = 512, kBlock = 32, kCopies = 48;
  ops::PagedAttentionArgs a;
  a.Hkv = c.n_kv_heads;
  a.D = c.head_dim;
  a.kv_type = kv_type;
  a.k_transposed = ops::paged_keys_transposed(ops::Device::cpu);
  a.block_tokens = kBlock;
  a.v_offset = kBlock * a.Hkv * a.D;
  a.block_stride = 2 * a.v_offset;
  const int64_t blocks = kRows * kKeys / kBlock, elems = blocks * a.block_stride;
  const auto layer_bytes = static_cast<size_t>(elems * dtype_bytes(kv_type, 1));
  AlignedBuffer<uint8_t> kv(layer_bytes * kCopies);
  std::memset(kv.data(), 0, kv.size());  // zeros: finite in f32 and f16 alike
  std::vector<int32_t> tables(static_cast<size_t>(blocks)), n_keys(kRows, kKeys);
  for (size_t i = 0; i < tables.size(); ++i) tables[i] = static_cast<int32_t>(i);
  std::vector<float> q(static_cast<size_t>(kRows * c.n_heads * c.head_dim), 0.1f), out(q.size());
  a.out = out.data();
  a.q = q.data();
  a.rows = kRows;
  a.H = c.n_heads;
  a.block_tables = tables.data();
  a.table_stride = kKeys / kBlock;
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

bool is_attention(const std::string& op) {
  return op == "paged_attention" || op == "kv_append";
}

}  // namespace

Machine cpu_machine(const profile::MachinePeaks& peaks, int threads,
                    const model::DecoderModel& model, int64_t prefill_rows, DType kv_type) {
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
  // The products' rate at several row counts, per stored type, on a matrix of the model of that
  // type (at most 4096 of its rows: the head's are many) in the layout the engine gives it, its
  // bytes hot in the caches: the kernels' compute roof at that many rows.
  std::vector<int64_t> rows_list{1, 4, 16, 64};
  if (prefill_rows > 64) rows_list.push_back(prefill_rows);
  std::map<std::string, std::map<int64_t, double>> rates;  // plain type -> rows -> GFLOP/s
  std::vector<const model::WeightRef*> matrices;
  for (const model::WeightRef* w : model.weights.layers.at(0).matrices()) matrices.push_back(w);
  matrices.push_back(model.weights.output.present() ? &model.weights.output
                                                    : &model.weights.tok_embd);
  for (const model::WeightRef* w : matrices) {
    if (!w->present() || w->shape.rank() != 2) continue;
    const std::string plain(dtype_name(plain_type(w->type)));
    if (rates.contains(plain)) continue;
    const int64_t N = std::min<int64_t>(w->rows(), 4096), K = w->cols();
    const DType type = ops::cpu_preferred_layout(plain_type(w->type), N);
    const auto bytes = static_cast<size_t>(dtype_bytes(w->type, N * K));
    AlignedBuffer<uint8_t> wb(bytes);
    if (w->type == type) {
      std::memcpy(wb.data(), w->data, bytes);
    } else {  // the engine rearranges plain matrices once at load; so does this copy
      std::memcpy(wb.data(), w->data, bytes);
      interleave_rows(w->type, wb.data(), N, K);
    }
    for (int64_t rows : rows_list) {
      std::vector<float> x(static_cast<size_t>(rows * K), 0.01f), y(static_cast<size_t>(rows * N));
      const double s = median_seconds(rows >= 64 ? 3 : 7, [&] {
        ops::matmul_wt(ctx, y.data(), N, x.data(), rows, K, wb.data(), type, N);
      });
      rates[plain][rows] = ops::matmul_wt_cost(rows, K, N, type).flops / s * 1e-9;
    }
  }
  m.product_dtype = rates.empty() ? "" : rates.begin()->first;
  // Between measured row counts the rate is interpolated in log(rows); past the last it stays.
  m.product_gflops = [rates](const std::string& d, int64_t rows) {
    auto it = rates.find(d);
    if (it == rates.end()) return 0.0;  // not measured: the probe's peak for it
    const std::map<int64_t, double>& g = it->second;
    auto hi = g.lower_bound(rows);
    if (hi == g.end()) return std::prev(hi)->second;
    if (hi->first == rows || hi == g.begin()) return hi->second;
    auto lo = std::prev(hi);
    const double f =
        (std::log(static_cast<double>(rows)) - std::log(static_cast<double>(lo->first))) /
        (std::log(static_cast<double>(hi->first)) - std::log(static_cast<double>(lo->first)));
    return lo->second + f * (hi->second - lo->second);
  };
  m.attention_gbs = measure_attention_gbs(ctx, model.config, kv_type);
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
                sequences * rows_each);
  p.sequences = sequences;
  p.context = context;
  return p;
}

StepPrediction price_ops(const std::vector<ops::OpTotal>& ops, const Machine& machine,
                         int64_t rows) {
  StepPrediction p;
  p.rows = rows;
  double state = 0;
  for (const ops::OpTotal& t : ops) state += t.state_bytes;
  Roofs roofs = machine.roofs;
  if (machine.product_gflops || machine.op_gflops) {
    const auto base = roofs.compute;
    const auto product = machine.product_gflops;
    const auto by_op = machine.op_gflops;
    roofs.compute = [base, product, by_op, rows](const ops::OpTotal& t) {
      double g = 0;
      if (is_product(t.op)) g = by_op ? by_op(t, rows) : product(plain_name(t.dtype), rows);
      return g > 0 ? ComputePeak{g, "kernel"} : base(t);
    };
  }
  for (const ops::OpTotal& t : ops) {
    OpPrediction o;
    o.op = t;
    o.roof = roof_time(roofs, t, state);
    if (t.op == "paged_attention" && machine.attention_gbs > 0 && o.roof.memory_level != "L2") {
      // Measured with its arithmetic running: the time, not a roof to max() with compute.
      o.roof.memory_s = t.bytes / (machine.attention_gbs * 1e9);
      o.roof.compute_s = 0;
      o.roof.memory_level = "attention";
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
    for (const model::WeightRef* w : {&l.attn_norm, &l.attn_norm_b, &l.ffn_norm, &l.ffn_norm_b,
                                      &l.bq, &l.bk, &l.bv, &l.bo, &l.b_up, &l.b_down})
      add(*w);
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
  const int64_t blocks = (context + in.block_tokens - 1) / in.block_tokens;
  mp.kv = mp.kv_per_token * static_cast<double>(sequences * blocks * in.block_tokens);
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
