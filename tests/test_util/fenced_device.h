// A stand-in device for tests of the shared model code: an ops::Backend registered as
// Device::cuda whose memory the host cannot touch (its pages are PROT_NONE except while one of
// its ops or copies runs) and whose ops run the CPU backend's kernels. A model step on it gives
// the CPU's results bit for bit where the ops see the same layouts, and any host read or write of
// device memory outside ops/ faults, failing the test. With graphs on it records ops as a GPU's
// stream capture does (arguments kept as given, run at replay) and refuses what a capture
// cannot hold: allocations, copies, zeroing, results returned to the host.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "core/error.h"
#include "ops/backend.h"

namespace tessera::test {

class FencedDevice final : public ops::Backend {
 public:
  explicit FencedDevice(bool keys_transposed, bool graphs = false)
      : transposed_(keys_transposed), graphs_(graphs) {}
  ~FencedDevice() override {
    for (auto& [p, bytes] : blocks_) munmap(p, bytes);
  }

  std::string_view name() const override { return "fenced"; }

  void* allocate(size_t bytes) override {
    not_recording("allocate");
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t n = (bytes + page - 1) / page * page;
    void* p = mmap(nullptr, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TS_CHECK(p != MAP_FAILED, "[fenced] cannot map ", n, " bytes");
    blocks_[p] = n;
    return p;
  }
  void release(void* p) noexcept override {
    auto it = blocks_.find(p);
    if (it == blocks_.end()) return;
    munmap(p, it->second);
    blocks_.erase(it);
  }
  void copy(const ops::Context&, void* dst, const void* src, size_t bytes, ops::CopyKind) override {
    not_recording("copy");
    const Open open(*this);
    std::memcpy(dst, src, bytes);
  }
  // Waiting for the device inside a recording is an error on CUDA (a stream capture): refused.
  void synchronize(const ops::Context&) override {
    not_recording("synchronize");
    ++syncs_;
  }
  void zero(const ops::Context&, void* p, size_t bytes) override {
    not_recording("zero");
    const Open open(*this);
    std::memset(p, 0, bytes);
  }
  int64_t ops_run() const { return ops_; }
  int64_t replays() const { return replays_; }
  int64_t syncs() const { return syncs_; }
  // The products matmul_wt_group was given, over all its calls (a grouped call of three counts 3).
  int64_t group_products() const { return group_products_; }

  using Recording = std::vector<std::function<void()>>;
  bool records_graphs() const override { return graphs_; }
  void begin_graph(const ops::Context&) override {
    TS_CHECK(!recording_, "[fenced] a recording is already open");
    recording_ = std::make_unique<Recording>();
  }
  void* end_graph(const ops::Context&) override { return recording_.release(); }
  void replay_graph(const ops::Context&, void* g) override {
    ++replays_;
    for (const auto& f : *static_cast<Recording*>(g)) f();
  }
  void destroy_graph(void* g) noexcept override { delete static_cast<Recording*>(g); }

  // Each op: its arguments copied into a call that opens the fence and runs the CPU kernel, run
  // now or kept for replay.
#define TS_FENCED(name, params, ...)                                      \
  void name params override {                                             \
    run([=, this] { cpu().name(host(ctx) __VA_OPT__(, ) __VA_ARGS__); }); \
  }
  TS_FENCED(gemm, (const ops::Context& ctx, const ops::GemmArgs& g), g)
  TS_FENCED(embedding_forward,
            (const ops::Context& ctx, float* out, const int32_t* tokens, const float* wte,
             const float* wpe, int64_t B, int64_t T, int64_t C, int64_t V),
            out, tokens, wte, wpe, B, T, C, V)
  TS_FENCED(embedding_backward,
            (const ops::Context& ctx, float* dwte, float* dwpe, const float* dout,
             const int32_t* tokens, int64_t B, int64_t T, int64_t C, int64_t V),
            dwte, dwpe, dout, tokens, B, T, C, V)
  TS_FENCED(layernorm_forward,
            (const ops::Context& ctx, float* out, float* mean, float* rstd, const float* inp,
             const float* w, const float* b, int64_t N, int64_t C),
            out, mean, rstd, inp, w, b, N, C)
  TS_FENCED(layernorm_backward, (const ops::Context& ctx, const ops::NormBackwardArgs& a), a)
  TS_FENCED(gelu_forward, (const ops::Context& ctx, float* out, const float* inp, int64_t n), out,
            inp, n)
  TS_FENCED(gelu_backward,
            (const ops::Context& ctx, float* dinp, const float* inp, const float* dout, int64_t n),
            dinp, inp, dout, n)
  TS_FENCED(add, (const ops::Context& ctx, float* out, const float* a, const float* b, int64_t n),
            out, a, b, n)
  TS_FENCED(attention_forward,
            (const ops::Context& ctx, float* out, float* lse, const float* qkv,
             const ops::AttentionArgs& a),
            out, lse, qkv, a)
  TS_FENCED(attention_backward,
            (const ops::Context& ctx, float* dqkv, const float* dout, const float* qkv,
             const float* out, const float* lse, const ops::AttentionArgs& a),
            dqkv, dout, qkv, out, lse, a)
  TS_FENCED(softmax_xent,
            (const ops::Context& ctx, float* losses, float* logits, const int32_t* targets,
             int64_t N, int64_t V, int64_t Vp, float dlogits_scale),
            losses, logits, targets, N, V, Vp, dlogits_scale)
  TS_FENCED(adamw,
            (const ops::Context& ctx, float* params, const float* grads, float* m, float* v,
             int64_t n, const ops::AdamWArgs& a),
            params, grads, m, v, n, a)
  TS_FENCED(scale, (const ops::Context& ctx, float* x, int64_t n, float s), x, n, s)
  TS_FENCED(convert_f32_to_bf16,
            (const ops::Context& ctx, uint16_t* dst, const float* src, int64_t n), dst, src, n)
  TS_FENCED(convert_bf16_to_f32,
            (const ops::Context& ctx, float* dst, const uint16_t* src, int64_t n), dst, src, n)
  TS_FENCED(round_to_bf16, (const ops::Context& ctx, float* x, uint16_t* keep, int64_t n), x, keep,
            n)
  // A quantized activation format of its own for block-typed weights at up to 4 rows: an f32
  // copy of the rows. The producing ops write it after their kernel; matmul_wt_group checks, at
  // each call or replay, that it holds x's present values. So the model's plumbing of quantized
  // rows (which op writes them, which product reads them) is tested where no GPU runs it.
  int64_t quantized_rows_bytes(int64_t rows, int64_t cols, DType t) const override {
    const bool block = t != DType::f32 && t != DType::f16 && t != DType::bf16;
    return block && rows >= 1 && rows <= 4 ? rows * cols * 4 : 0;
  }
  int64_t quantized_reads() const {
    return quantized_reads_;
  }
  void residual_norm(const ops::Context& ctx, const ops::ResidualNormArgs& a) override {
    run([=, this] {
      cpu().residual_norm(host(ctx), a);
      write_quantized(a.q_out, a.out);
    });
  }
  TS_FENCED(rmsnorm_forward,
            (const ops::Context& ctx, float* out, float* rstd, const float* inp, const float* w,
             int64_t N, int64_t C, float eps),
            out, rstd, inp, w, N, C, eps)
  TS_FENCED(rmsnorm_backward, (const ops::Context& ctx, const ops::NormBackwardArgs& a), a)
  TS_FENCED(head_rmsnorm,
            (const ops::Context& ctx, float* x, int64_t ld, int64_t n, int64_t heads, int64_t D,
             const float* w, float eps),
            x, ld, n, heads, D, w, eps)
  TS_FENCED(head_rmsnorm_backward, (const ops::Context& ctx, const ops::HeadNormBackwardArgs& a), a)
  TS_FENCED(rope_forward,
            (const ops::Context& ctx, float* out, const float* inp, const ops::RopeTable& table,
             const int32_t* positions, int64_t pos0, int64_t B, int64_t T, int64_t H, int64_t D,
             ops::RopeLayout layout),
            out, inp, host_table(table), positions, pos0, B, T, H, D, layout)
  TS_FENCED(rope_backward,
            (const ops::Context& ctx, float* dinp, const float* dout, const ops::RopeTable& table,
             const int32_t* positions, int64_t pos0, int64_t B, int64_t T, int64_t H, int64_t D,
             ops::RopeLayout layout),
            dinp, dout, host_table(table), positions, pos0, B, T, H, D, layout)
  void glu_forward(const ops::Context& ctx, float* out, const float* gate, const float* up,
                   int64_t N, int64_t F, ops::GluAct act, const ops::QuantizedRows* q) override {
    run([=, this] {
      cpu().glu_forward(host(ctx), out, gate, up, N, F, act, nullptr);
      write_quantized(q, out);
    });
  }
  TS_FENCED(glu_backward,
            (const ops::Context& ctx, float* dgate, float* dup, const float* dout,
             const float* gate, const float* up, int64_t N, int64_t F, ops::GluAct act),
            dgate, dup, dout, gate, up, N, F, act)
  TS_FENCED(matmul_wt,
            (const ops::Context& ctx, float* y, int64_t ldy, const float* x, int64_t M, int64_t K,
             const void* w, DType w_type, int64_t N, const float* bias),
            y, ldy, x, M, K, w, w_type, N, bias)
  TS_FENCED(matmul_w,
            (const ops::Context& ctx, float* dx, int64_t ldx, const float* dy, int64_t M, int64_t N,
             const void* w, DType w_type, int64_t K, bool accumulate),
            dx, ldx, dy, M, N, w, w_type, K, accumulate)
  void matmul_wt_group(const ops::Context& ctx, const float* x, int64_t M, int64_t K,
                       std::span<const ops::WtProduct> products,
                       const ops::QuantizedRows* xq) override {
    const std::vector<ops::WtProduct> p(products.begin(), products.end());  // outlives the call
    group_products_ += static_cast<int64_t>(p.size());
    run([=, this] {
      if (xq) {
        TS_CHECK(std::memcmp(xq->data, x, static_cast<size_t>(M * K) * sizeof(float)) == 0,
                 "[fenced] the quantized rows a product reads are not its x's present values");
        ++quantized_reads_;
      }
      cpu().matmul_wt_group(host(ctx), x, M, K, p, nullptr);
    });
  }
  TS_FENCED(bias_grad, (const ops::Context& ctx, float* db, const float* dy, int64_t m, int64_t n),
            db, dy, m, n)
  // Plans as CUDA's contract asks (ops::plan_paged_attention): a run of adjacent rows with equal
  // tables, as the device's tiles would take it. The plan is each row's run's first row (rows,
  // then one int32 per row); the key, the number of runs. At the call it checks that the staged
  // plan is this call's and that every row's keys sit in its run's first table, as a tile reads
  // them: so the model's staging and tables are tested where no GPU runs them.
  int64_t paged_attention_plan_bytes(int64_t rows) const override {
    return 4 * (rows + 1);
  }
  int64_t plan_paged_attention(const ops::PagedAttentionArgs& a, void* plan) const override {
    auto* p = static_cast<int32_t*>(plan);
    p[0] = static_cast<int32_t>(a.rows);
    int64_t runs = 0;
    for (int64_t r = 0; r < a.rows; ++r) {
      const int32_t* t = a.block_tables + r * a.table_stride;
      const bool joins = r > 0 && std::equal(t, t + a.table_stride, t - a.table_stride);
      p[r + 1] = joins ? p[r] : static_cast<int32_t>(r);
      runs += !joins;
    }
    return runs;
  }
  void paged_attention(const ops::Context& ctx, const ops::PagedAttentionArgs& a) override {
    run([=, this] {
      ++attention_calls_;
      if (a.plan) {
        const auto* p = static_cast<const int32_t*>(a.plan);
        TS_CHECK(p[0] == a.rows, "[fenced] a plan of ", p[0], " rows for ", a.rows);
        int64_t runs = 0;
        for (int64_t r = 0; r < a.rows; ++r) {
          runs += p[r + 1] == r;
          const int32_t* first = a.block_tables + p[r + 1] * a.table_stride;
          const int32_t* own = a.block_tables + r * a.table_stride;
          const int64_t blocks = (a.n_keys[r] + a.block_tokens - 1) / a.block_tokens;
          TS_CHECK(std::equal(own, own + blocks, first), "[fenced] row ", r,
                   "'s keys are not in its run's first table");
        }
        TS_CHECK(runs == a.plan_key, "[fenced] the plan's key ", a.plan_key, " is not its ", runs,
                 " runs");
        ++plans_checked_;
      }
      cpu().paged_attention(host(ctx), a);
      write_quantized(a.q_out, a.out);
    });
  }
  int64_t plans_checked() const {
    return plans_checked_;
  }
  int64_t attention_calls() const {
    return attention_calls_;
  }
  TS_FENCED(kv_append, (const ops::Context& ctx, const ops::KvAppendArgs& a), a)
  void rope_kv_append(const ops::Context& ctx, const ops::RopeKvAppendArgs& a) override {
    if (a.rope) host_table(*a.rope);
    run([=, this] { cpu().rope_kv_append(host(ctx), a); });
  }
  TS_FENCED(copy_rows,
            (const ops::Context& ctx, float* dst, int64_t ld_dst, const float* src, int64_t ld_src,
             int64_t rows, int64_t cols),
            dst, ld_dst, src, ld_src, rows, cols)
  TS_FENCED(gather_rows,
            (const ops::Context& ctx, float* dst, const float* src, const int32_t* index, int64_t n,
             int64_t C),
            dst, src, index, n, C)
  TS_FENCED(scatter_add_rows,
            (const ops::Context& ctx, float* dst, const float* src, const int32_t* index,
             const float* weight, int64_t n, int64_t C),
            dst, src, index, weight, n, C)
  TS_FENCED(moe_route,
            (const ops::Context& ctx, int32_t* ids, float* weights, const float* logits, int64_t n,
             int64_t E, int64_t k, bool normalize),
            ids, weights, logits, n, E, k, normalize)
  TS_FENCED(moe_route_backward,
            (const ops::Context& ctx, float* dlogits, const float* dweights, const int32_t* ids,
             const float* logits, int64_t n, int64_t E, int64_t k, bool normalize),
            dlogits, dweights, ids, logits, n, E, k, normalize)
  TS_FENCED(scatter_add_rows_backward,
            (const ops::Context& ctx, float* dsrc, float* dweight, const float* dy,
             const float* src, const int32_t* index, const float* weight, int64_t n, int64_t C),
            dsrc, dweight, dy, src, index, weight, n, C)
#undef TS_FENCED
  double sum_squares(const ops::Context& ctx, const float* x, int64_t n) override {
    not_recording("sum_squares");
    const Open open(*this);
    return cpu().sum_squares(host(ctx), x, n);
  }

  int64_t matmul_wt_saturating_rows(DType t) const override {
    return cpu().matmul_wt_saturating_rows(t);
  }
  // Plain layouts, as a GPU takes them.
  DType preferred_layout(DType t, int64_t) const override {
    return t;
  }
  bool paged_keys_transposed() const override {
    return transposed_;
  }

 private:
  // Opens every block for the duration of one op, and closes them again.
  struct Open {
    explicit Open(FencedDevice& d) : d_(d) {
      ++d.ops_;
      for (auto& [p, n] : d_.blocks_) mprotect(p, n, PROT_READ | PROT_WRITE);
    }
    ~Open() {
      for (auto& [p, n] : d_.blocks_) mprotect(p, n, PROT_NONE);
    }
    FencedDevice& d_;
  };
  static ops::Backend& cpu() {
    return ops::backend(ops::Device::cpu);
  }
  void run(std::function<void()> f) {
    auto fenced = [this, f = std::move(f)] {
      const Open open(*this);
      f();
    };
    if (recording_)
      recording_->push_back(std::move(fenced));
    else
      fenced();
  }
  static void write_quantized(const ops::QuantizedRows* q, const float* x) {
    if (q) std::memcpy(q->data, x, static_cast<size_t>(q->rows * q->cols) * sizeof(float));
  }
  void not_recording(const char* what) const {
    TS_CHECK(!recording_, "[fenced] ", what, " while a graph is recorded");
  }
  static ops::Context host(const ops::Context& ctx) {
    ops::Context c = ctx;
    c.device = ops::Device::cpu;
    return c;
  }
  // The CPU kernels read the host's cos and sin; the device copy must be there too.
  static const ops::RopeTable& host_table(const ops::RopeTable& t) {
    TS_CHECK(t.device != nullptr, "[fenced] rope table without its device copy");
    return t;
  }

  bool transposed_, graphs_;
  std::unique_ptr<Recording> recording_;
  int64_t replays_ = 0;
  int64_t group_products_ = 0;
  int64_t syncs_ = 0;
  int64_t plans_checked_ = 0, attention_calls_ = 0, quantized_reads_ = 0;
  std::map<void*, size_t> blocks_;
  int64_t ops_ = 0;
};

}  // namespace tessera::test
