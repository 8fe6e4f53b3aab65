// The CUDA device decoder: weights uploaded once in their stored types, activations and the paged
// KV cache in device memory, and a forward pass of launches on one stream. Matrices go through
// the quantized matrix-vector kernels (up to kMatvecMaxRows rows at a time, so each weight byte is
// read once per 8 rows), through an f16 tensor-core GEMM for prefill-sized chunks (the weight
// widened to f16 first), or, for f32 weights, through cuBLASLt in f32; attention through the
// paged decode kernel (prefill rows are causal decode rows of the same sequence).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <tuple>
#include <unordered_map>

#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/decoder_kernels.h"
#include "backend/cuda/gemm_lt.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/memory_pool.h"
#include "backend/cuda/quant_matvec.h"
#include "backend/cuda/runtime.h"
#include "backend/device.h"
#include "backend/device_decoder.h"
#include "core/error.h"

namespace tessera::backend {
namespace {

using cuda::DeviceBuffer;

constexpr size_t kAlign = 256;
// Logit rows computed per head call (bounds the device logits buffer at large vocabularies).
constexpr int64_t kHeadRows = 64;
// The decode attention's split workspace covers this many rows with up to kAttnSplits splits.
constexpr int64_t kAttnRows = 16, kAttnSplits = 32;
// CUDA graphs: chunks of up to kGraphMaxRows rows; attention bounds rounded to kGraphKeysRound
// keys (the split size of the decode kernel); at most kMaxGraphs shapes kept.
constexpr int64_t kGraphMaxRows = 64, kGraphKeysRound = 256;
constexpr size_t kMaxGraphs = 256;
// Chunks of at least this many rows take the f16 GEMM route for non-f32 weights. Below it the
// matvec route reads fewer bytes: it passes over the weight once per 8 rows (a q4_0 weight is
// 0.56 bytes per element, so 8 passes are 4.5), while the GEMM route reads the stored weight,
// writes and reads its f16 copy (4.5 bytes per element plus the GEMM's own traffic).
constexpr int64_t kGemmMinRows = 65;
// Stage timing's parts (DeviceStageTimes), in infer::Stage's order; kDeviceStageOther the rest.
constexpr int kQkv = 0, kAttnOut = 1, kMlpIn = 2, kMlpDown = 3, kHead = 4, kAttention = 5;

size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

bool matrix_type_supported(DType t) {
  switch (t) {
    case DType::f32:
    case DType::f16:
    case DType::bf16:
    case DType::q8_0:
    case DType::q4_0:
    case DType::q4_1:
    case DType::q5_0:
    case DType::q5_1:
    case DType::q4_k:
    case DType::q5_k:
    case DType::q6_k:
      return true;
    default:
      return false;
  }
}

// Pinned host memory: the chunk's inputs are staged here so one asynchronous copy moves them.
class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t bytes) : bytes_(bytes) {
    TS_CUDA_CHECK(cudaHostAlloc(&p_, bytes ? bytes : 1, cudaHostAllocDefault));
  }
  ~PinnedBuffer() { cudaFreeHost(p_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  uint8_t* get() const { return static_cast<uint8_t*>(p_); }
  size_t size() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// A weight on the device.
struct DevWeight {
  const void* p = nullptr;
  DType type = DType::f32;
  int64_t rows = 0, cols = 0;
  const float* f() const { return static_cast<const float*>(p); }
};

struct DevLayer {
  DevWeight attn_norm, attn_norm_b, wq, wk, wv, wo, bq, bk, bv, bo;
  DevWeight ffn_norm, ffn_norm_b, w_gate, w_up, w_down, b_up, b_down;
  // wq|wk|wv (and bq|bk|bv) and w_gate|w_up stored back to back, as one matrix each, when their
  // types match (null otherwise): a one-row step then reads each input once and launches one
  // product instead of three (two), and its outputs are q, k, v (gate, up) side by side.
  DevWeight wqkv, bqkv, w_gate_up;
};

class CudaDecoder final : public DeviceDecoder {
 public:
  CudaDecoder(const DecoderDesc& d, int device);
  ~CudaDecoder() override {
    // Pending work may still read the buffers the members free.
    cudaStreamSynchronize(stream_.get());
    for (auto& [key, exec] : graphs_)
      if (exec) cudaGraphExecDestroy(exec);
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  void forward(const DecoderChunk& chunk) override;
  void set_stage_timing(bool on) override { timing_ = on; }
  const DeviceStageTimes& stage_times() const override { return times_; }
  void reset_stage_times() override { times_ = {}; }
  std::string describe() const override;
  int64_t device_bytes() const override {
    return static_cast<int64_t>(weights_.size() + cache_.size() + acts_.size() + ints_.size() +
                                attn_ws_.size() + matvec_ws_.size() + rope_.size() + w16_.size() +
                                x16_.size());
  }

 private:
  void validate() const;
  void upload_weights();
  void linear(float* y, const float* x, int64_t n, const DevWeight& w, const DevWeight& bias);
  // out = norm(inp) with layer weights w, b (b gpt2 only). With quant_block > 0 (out is xn_)
  // the rows are also quantized in those blocks into matvec_ws_ for the products that read xn_
  // next (see quant_): one launch instead of a norm and a quantizer per product.
  void norm(float* out, const float* inp, int64_t n, const DevWeight& w, const DevWeight& b,
            int64_t quant_block = 0);
  // x += r, then out = norm(x) (quant_block as for norm).
  void residual_norm(float* x, float* out, const float* r, int64_t n, const DevWeight& w,
                     const DevWeight& b, int64_t quant_block = 0);
  // The activation block every one of `next` (the products about to read xn_) quantizes x in,
  // when they all are block types with one block size and n rows take the matvec route; else 0.
  int64_t shared_act_block(int64_t n, std::initializer_list<const DevWeight*> next) const;
  // The quantizing form of both (res_out and r null for norm): runs it and returns true when
  // quant_block > 0 and out is xn_; else only clears quant_ and returns false.
  bool quantizing_norm(float* res_out, float* out, const float* a, const float* r, int64_t n,
                       const DevWeight& w, const DevWeight& b, int64_t quant_block);
  int64_t attn_norm_block(size_t l, int64_t n) const;  // for layer l's q/k/v products
  int64_t ffn_norm_block(size_t l, int64_t n) const;   // for layer l's MLP input products
  // out (ff_a_) = silu(gate) * up, quantized for `down` as a norm is (quant_) when it is a block
  // type and n rows take the matvecs.
  void swiglu(float* out, const float* gate, const float* up, int64_t n, const DevWeight& down);
  void layer(size_t l, int64_t n, int64_t max_keys);
  // Stage timing: from here on the stream's work belongs to `stage` (an event marks the switch;
  // nothing happens while timing is off). collect_stage_times adds the finished chunk's
  // intervals to times_ once the stream has synchronized.
  void mark(int stage);
  void collect_stage_times();
  // The whole forward pass of n rows on the stream, ending with the first head piece in logits_.
  void run_layers(int64_t n, int64_t max_keys);
  struct GraphKey {
    int64_t n, n_logits, max_keys;
    bool operator<(const GraphKey& o) const {
      return std::tie(n, n_logits, max_keys) < std::tie(o.n, o.n_logits, o.max_keys);
    }
  };
  // Runs run_layers for this shape: eagerly the first time, captured into a CUDA graph the
  // second, replaying the graph from then on.
  void run_graph(const GraphKey& key);

  DecoderDesc d_;
  int device_;
  cuda::DeviceGuard guard_;
  cuda::Stream stream_;
  cuda::MemoryPool& pool_;
  std::string device_name_;
  int64_t Q_ = 0, KV_ = 0, half_block_ = 0, block_stride_ = 0, elem_bytes_ = 0;

  DeviceBuffer weights_;
  std::vector<DevLayer> layers_;
  DevWeight out_norm_, out_norm_b_, output_;
  DeviceBuffer rope_, cache_, acts_, ints_, attn_ws_, matvec_ws_;
  // f16 scratch of the GEMM route: one widened layer matrix, and the chunk's input rows.
  DeviceBuffer w16_, x16_;
  int64_t w16_elems_ = 0;
  float *x_ = nullptr, *xn_ = nullptr, *tmp_ = nullptr, *q_ = nullptr, *k_ = nullptr, *v_ = nullptr,
        *att_ = nullptr, *ff_a_ = nullptr, *ff_b_ = nullptr, *gathered_ = nullptr,
        *logits_ = nullptr, *qkv_ = nullptr, *gate_up_ = nullptr;  // one-row fused outputs
  // Device int arrays inside ints_ (same layout as the pinned staging after x).
  int32_t *pos_ = nullptr, *slot_ = nullptr, *n_keys_ = nullptr, *tables_ = nullptr,
          *logit_rows_ = nullptr;
  // Staging layout: x_bytes_ of x, then the int arrays row_ints_ apart (tables last).
  size_t x_bytes_ = 0, row_ints_ = 0;
  std::unique_ptr<PinnedBuffer> staging_;
  int64_t n_logits_ = 0;
  // Which activations matvec_ws_ holds quantized, for the products that read them next: xn_
  // after a quantizing norm, ff_a_ after a quantizing SwiGLU (null when none). Cleared when
  // anything else writes the workspace or those rows.
  struct QuantState {
    const float* x = nullptr;
    int64_t rows = 0, K = 0, block = 0;
  } quant_;
  bool graphs_enabled_ = true;
  std::map<GraphKey, cudaGraphExec_t> graphs_;  // null until captured
  // Stage timing (off by default): events_[i] starts an interval of stage marked_[i].
  bool timing_ = false;
  DeviceStageTimes times_;
  std::vector<cudaEvent_t> events_;
  std::vector<int> marked_;
  size_t n_marks_ = 0;
  int stage_ = kDeviceStageOther;
};

CudaDecoder::CudaDecoder(const DecoderDesc& d, int device)
    : d_(d),
      device_(device),
      guard_(device),
      stream_(),
      pool_(cuda::MemoryPool::for_device(device)) {
  validate();
  // TESSERA_CUDA_GRAPHS=0 runs every step eagerly (to measure what the graphs save).
  if (const char* g = std::getenv("TESSERA_CUDA_GRAPHS")) graphs_enabled_ = std::string(g) != "0";
  const cuda::DeviceInfo info = cuda::device_info(device);
  device_name_ = cat(info.name, " (sm_", info.sm_major, info.sm_minor, ")");
  Q_ = d_.H * d_.D;
  KV_ = d_.Hkv * d_.D;
  half_block_ = d_.Hkv * d_.block_tokens * d_.D;
  block_stride_ = static_cast<int64_t>(d_.layers.size()) * 2 * half_block_;
  elem_bytes_ = d_.kv_type == DType::f16 ? 2 : 4;
  cudaStream_t s = stream_.get();

  upload_weights();
  if (!d_.gpt2) {
    const size_t table = static_cast<size_t>(d_.rope_max_pos * (d_.rope_dim / 2)) * sizeof(float);
    rope_ = DeviceBuffer(pool_, 2 * table, s);
    cuda::copy_to_device(rope_.get(), d_.rope_cos, table);
    cuda::copy_to_device(rope_.as<uint8_t>() + table, d_.rope_sin, table);
  }
  const size_t cache_bytes =
      static_cast<size_t>(d_.n_blocks) * static_cast<size_t>(block_stride_ * elem_bytes_);
  cache_ = DeviceBuffer(pool_, cache_bytes, s);
  // Zeroed so a bug that reads a slot never written reads zeros, not another run's values.
  TS_CUDA_CHECK(cudaMemsetAsync(cache_.get(), 0, cache_bytes, s));

  // Activations, one allocation carved into aligned pieces.
  const int64_t R = d_.max_rows;
  const int64_t head_rows = std::min(R, kHeadRows);
  std::vector<std::pair<void**, size_t>> parts;
  auto f32 = [&](float** ptr, int64_t n) {
    parts.emplace_back(reinterpret_cast<void**>(ptr), static_cast<size_t>(n) * sizeof(float));
  };
  for (float** p : {&x_, &xn_, &tmp_, &gathered_}) f32(p, R * d_.C);
  for (float** p : {&q_, &att_}) f32(p, R * Q_);
  for (float** p : {&k_, &v_}) f32(p, R * KV_);
  for (float** p : {&ff_a_, &ff_b_}) f32(p, R * d_.F);
  f32(&logits_, head_rows * d_.V);
  f32(&qkv_, Q_ + 2 * KV_);
  f32(&gate_up_, 2 * d_.F);
  acts_ = cuda::carve(pool_, s, parts);

  // Per-chunk inputs, staged in pinned memory as x (R, C) f32 then the int32 arrays pos, slot,
  // n_keys, logit_rows (R each) and tables (R, S); on the device x goes to x_, the ints to ints_.
  x_bytes_ = align_up(static_cast<size_t>(R * d_.C) * sizeof(float));
  row_ints_ = align_up(static_cast<size_t>(R) * sizeof(int32_t));
  const size_t ints_bytes =
      4 * row_ints_ + align_up(static_cast<size_t>(R * d_.max_seq_blocks) * sizeof(int32_t));
  ints_ = DeviceBuffer(pool_, ints_bytes, s);
  uint8_t* base = ints_.as<uint8_t>();
  pos_ = reinterpret_cast<int32_t*>(base);
  slot_ = reinterpret_cast<int32_t*>(base + row_ints_);
  n_keys_ = reinterpret_cast<int32_t*>(base + 2 * row_ints_);
  logit_rows_ = reinterpret_cast<int32_t*>(base + 3 * row_ints_);
  tables_ = reinterpret_cast<int32_t*>(base + 4 * row_ints_);
  staging_ = std::make_unique<PinnedBuffer>(x_bytes_ + ints_bytes);

  const int64_t attn_floats =
      cuda::paged_decode_workspace_floats(kAttnRows, d_.H, d_.D, kAttnSplits);
  attn_ws_ = DeviceBuffer(pool_, static_cast<size_t>(attn_floats) * sizeof(float), s);
  size_t mv = 0;
  for (const int64_t K : {d_.C, Q_, d_.F})
    for (const DType t : {DType::q8_0, DType::q4_0, DType::q4_1, DType::q5_0, DType::q5_1,
                          DType::q4_k, DType::q5_k, DType::q6_k})
      mv = std::max(mv, cuda::matmul_wt_workspace_bytes(cuda::kMatvecMaxRows, K, t));
  matvec_ws_ = DeviceBuffer(pool_, std::max<size_t>(mv, 1), s);
  if (R >= kGemmMinRows) {
    // Layer matrices only: the output head is (V, C), which can be larger than all of them
    // together, and its rows are few (the logit rows), so it stays on the matvec route.
    w16_elems_ = std::max({Q_ * d_.C, KV_ * d_.C, d_.F * d_.C});
    w16_ = DeviceBuffer(pool_, static_cast<size_t>(w16_elems_) * 2, s);
    x16_ = DeviceBuffer(pool_, static_cast<size_t>(R * std::max({d_.C, Q_, d_.F})) * 2, s);
  }
  stream_.synchronize();
}

void CudaDecoder::validate() const {
  const char* op = "[cuda decoder]";
  TS_CHECK(d_.C > 0 && d_.H > 0 && d_.Hkv > 0 && d_.H % d_.Hkv == 0 && d_.F > 0 && d_.V > 0, op,
           " bad shape C=", d_.C, " H=", d_.H, " Hkv=", d_.Hkv, " F=", d_.F, " V=", d_.V);
  TS_CHECK(d_.D == 64 || d_.D == 128, op, " head dim ", d_.D,
           " is not supported on CUDA (the paged attention kernel takes 64 or 128)");
  TS_CHECK(!d_.layers.empty(), op, " the model has no layers");
  TS_CHECK(d_.kv_type == DType::f32 || d_.kv_type == DType::f16, op, " --kv-type ",
           dtype_name(d_.kv_type), " must be f16 or f32");
  TS_CHECK(d_.block_tokens > 0 && d_.n_blocks > 0 && d_.max_rows > 0 && d_.max_seq_blocks > 0, op,
           " block_tokens, n_blocks, max_rows and max_seq_blocks must be positive");
  TS_CHECK(d_.gpt2 || (d_.rope_cos && d_.rope_sin && d_.rope_dim > 0 && d_.rope_dim <= d_.D &&
                       d_.rope_max_pos > 0),
           op, " the RoPE table is missing");
  auto check_matrix = [&](const HostWeight& w, const std::string& name, int64_t rows,
                          int64_t cols) {
    TS_CHECK(w.present(), op, " ", name, " is missing");
    TS_CHECK(matrix_type_supported(w.type), op, " ", name, " has type ", dtype_name(w.type),
             ", which the CUDA kernels do not take (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, "
             "q4_k, q5_k, q6_k)");
    TS_CHECK(w.rows == rows && w.cols == cols, op, " ", name, " is (", w.rows, ", ", w.cols,
             "), expected (", rows, ", ", cols, ")");
  };
  auto check_vector = [&](const HostWeight& w, const std::string& name, int64_t n, bool needed) {
    if (!w.present()) {
      TS_CHECK(!needed, op, " ", name, " is missing");
      return;
    }
    TS_CHECK(w.type == DType::f32 && w.rows * w.cols == n, op, " ", name, " must be ", n,
             " f32 values");
  };
  const int64_t Q = d_.H * d_.D, KV = d_.Hkv * d_.D;
  for (size_t l = 0; l < d_.layers.size(); ++l) {
    const DecoderLayerWeights& w = d_.layers[l];
    const std::string p = cat("layer ", l, " ");
    check_vector(w.attn_norm, p + "attn_norm", d_.C, true);
    check_vector(w.ffn_norm, p + "ffn_norm", d_.C, true);
    check_vector(w.attn_norm_b, p + "attn_norm_b", d_.C, d_.gpt2);
    check_vector(w.ffn_norm_b, p + "ffn_norm_b", d_.C, d_.gpt2);
    check_matrix(w.wq, p + "wq", Q, d_.C);
    check_matrix(w.wk, p + "wk", KV, d_.C);
    check_matrix(w.wv, p + "wv", KV, d_.C);
    check_matrix(w.wo, p + "wo", d_.C, Q);
    check_vector(w.bq, p + "bq", Q, false);
    check_vector(w.bk, p + "bk", KV, false);
    check_vector(w.bv, p + "bv", KV, false);
    check_vector(w.bo, p + "bo", d_.C, false);
    check_matrix(w.w_up, p + "w_up", d_.F, d_.C);
    check_matrix(w.w_down, p + "w_down", d_.C, d_.F);
    if (!d_.gpt2) check_matrix(w.w_gate, p + "w_gate", d_.F, d_.C);
    check_vector(w.b_up, p + "b_up", d_.F, false);
    check_vector(w.b_down, p + "b_down", d_.C, false);
  }
  check_vector(d_.out_norm, "out_norm", d_.C, true);
  check_vector(d_.out_norm_b, "out_norm_b", d_.C, d_.gpt2);
  check_matrix(d_.output, "output", d_.V, d_.C);
}

void CudaDecoder::upload_weights() {
  // Every distinct host tensor once (a tied output head shares the embedding's bytes), packed
  // into one allocation at 256-byte offsets.
  // Entries marked `glued` go right after the previous one (no alignment gap), so fusable
  // groups form one matrix; the matvec kernels take any alignment.
  struct Entry {
    const HostWeight* h;
    DevWeight* dw;
    bool glued;
  };
  std::vector<Entry> all;
  auto add = [&](const HostWeight& h, DevWeight& dw, bool glued = false) {
    if (h.present()) all.push_back({&h, &dw, glued});
  };
  auto same = [](std::initializer_list<const HostWeight*> ws) {
    for (const HostWeight* w : ws)
      if (!w->present() || w->type != (*ws.begin())->type || w->cols != (*ws.begin())->cols)
        return false;
    return true;
  };
  layers_.resize(d_.layers.size());
  std::vector<char> fuse_qkv(d_.layers.size()), fuse_bias(d_.layers.size()),
      fuse_gu(d_.layers.size());
  for (size_t l = 0; l < d_.layers.size(); ++l) {
    const DecoderLayerWeights& h = d_.layers[l];
    DevLayer& w = layers_[l];
    fuse_qkv[l] = same({&h.wq, &h.wk, &h.wv});
    fuse_bias[l] = h.bq.present() && h.bk.present() && h.bv.present();
    const bool no_bias = !h.bq.present() && !h.bk.present() && !h.bv.present();
    fuse_qkv[l] = fuse_qkv[l] && (fuse_bias[l] || no_bias);
    fuse_gu[l] = !d_.gpt2 && same({&h.w_gate, &h.w_up});
    add(h.wq, w.wq);
    add(h.wk, w.wk, fuse_qkv[l]);
    add(h.wv, w.wv, fuse_qkv[l]);
    add(h.bq, w.bq);
    add(h.bk, w.bk, fuse_qkv[l] && fuse_bias[l]);
    add(h.bv, w.bv, fuse_qkv[l] && fuse_bias[l]);
    add(h.w_gate, w.w_gate);
    add(h.w_up, w.w_up, fuse_gu[l]);
    for (auto [hw, dw] : {std::pair{&h.attn_norm, &w.attn_norm},
                          {&h.attn_norm_b, &w.attn_norm_b},
                          {&h.wo, &w.wo},
                          {&h.bo, &w.bo},
                          {&h.ffn_norm, &w.ffn_norm},
                          {&h.ffn_norm_b, &w.ffn_norm_b},
                          {&h.w_down, &w.w_down},
                          {&h.b_up, &w.b_up},
                          {&h.b_down, &w.b_down}})
      add(*hw, *dw);
  }
  add(d_.out_norm, out_norm_);
  add(d_.out_norm_b, out_norm_b_);
  add(d_.output, output_);

  auto bytes_of = [](const HostWeight* h) {
    return static_cast<size_t>(dtype_bytes(h->type, h->rows * h->cols));
  };
  std::unordered_map<const void*, size_t> offset_of;
  size_t total = 0;
  for (const Entry& e : all) {
    if (offset_of.count(e.h->data)) continue;  // a tied head: the same bytes once
    if (!e.glued) total = align_up(total);
    offset_of[e.h->data] = total;
    total += bytes_of(e.h);
  }
  weights_ = DeviceBuffer(pool_, align_up(total), stream_.get());
  std::unordered_map<const void*, bool> copied;
  for (const Entry& e : all) {
    const size_t off = offset_of[e.h->data];
    if (!copied[e.h->data]) {
      cuda::copy_to_device(weights_.as<uint8_t>() + off, e.h->data, bytes_of(e.h));
      copied[e.h->data] = true;
    }
    *e.dw = DevWeight{weights_.as<uint8_t>() + off, e.h->type, e.h->rows, e.h->cols};
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    DevLayer& w = layers_[l];
    if (fuse_qkv[l]) {
      w.wqkv = DevWeight{w.wq.p, w.wq.type, w.wq.rows + w.wk.rows + w.wv.rows, w.wq.cols};
      if (fuse_bias[l])
        w.bqkv = DevWeight{w.bq.p, DType::f32, 1, w.bq.cols + w.bk.cols + w.bv.cols};
    }
    if (fuse_gu[l])
      w.w_gate_up =
          DevWeight{w.w_gate.p, w.w_gate.type, w.w_gate.rows + w.w_up.rows, w.w_gate.cols};
  }
}

std::string CudaDecoder::describe() const {
  auto gb = [](size_t b) { return static_cast<double>(b) / 1e9; };
  return cat(device_name_, ": weights ", gb(weights_.size()), " GB, KV cache ", gb(cache_.size()),
             " GB, activations ", gb(acts_.size() + ints_.size() + attn_ws_.size()), " GB");
}

void CudaDecoder::mark(int stage) {
  if (!timing_) return;
  if (n_marks_ == events_.size()) {
    cudaEvent_t e = nullptr;
    TS_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
    marked_.push_back(0);
  }
  TS_CUDA_CHECK(cudaEventRecord(events_[n_marks_], stream_.get()));
  marked_[n_marks_++] = stage;
  stage_ = stage;
}

void CudaDecoder::collect_stage_times() {
  for (size_t i = 0; i + 1 < n_marks_; ++i) {
    float ms = 0;
    TS_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i], events_[i + 1]));
    times_.seconds[marked_[i]] += 1e-3 * ms;
  }
  n_marks_ = 0;
  stage_ = kDeviceStageOther;
}

void CudaDecoder::linear(float* y, const float* x, int64_t n, const DevWeight& w,
                         const DevWeight& bias) {
  cudaStream_t s = stream_.get();
  if (timing_) times_.weight_bytes[stage_] += dtype_bytes(w.type, w.rows * w.cols);
  const float* b = bias.p ? bias.f() : nullptr;
  void* bias_arg = const_cast<float*>(b);
  if (w.type == DType::f32) {
    cuda::gemm_lt(cuda::lt_linear(y, cuda::LtType::f32, x, w.p, cuda::LtType::f32, n, w.rows,
                                  w.cols, bias_arg),
                  s);
    return;
  }
  if (n >= kGemmMinRows && w.rows * w.cols <= w16_elems_) {
    // Prefill-sized chunk: widen W and x to f16 and run one tensor-core GEMM with f32
    // accumulation and output (the bias fused), instead of a weight pass per 8 rows.
    auto* w16 = w16_.as<uint16_t>();
    auto* x16 = x16_.as<uint16_t>();
    const void* wp = w.p;
    if (w.type != DType::f16) {
      cuda::dequantize_to_f16(w16, w.p, w.type, w.rows, w.cols, s);
      wp = w16;
    }
    cuda::convert_f32_to_f16(x16, x, n * w.cols, s);
    cuda::gemm_lt(cuda::lt_linear(y, cuda::LtType::f32, x16, wp, cuda::LtType::f16, n, w.rows,
                                  w.cols, bias_arg),
                  s);
    return;
  }
  const int64_t block = act_block_elems(w.type);
  if (block > 0 && x == quant_.x && n == quant_.rows && w.cols == quant_.K &&
      block == quant_.block) {
    // The norm or SwiGLU that wrote x quantized it already.
    const cuda::QuantizedActs q =
        cuda::quantized_acts_view(matvec_ws_.get(), matvec_ws_.size(), n, w.cols, w.type);
    cuda::matmul_wt_quantized(y, w.rows, q, w.p, w.type, w.rows, b, s);
    if (y == quant_.x) quant_ = {};
    return;
  }
  // The calls below quantize x into matvec_ws_, over whatever was left there; and y may be the
  // quantized rows' own buffer.
  if (block > 0 || y == quant_.x) quant_ = {};
  // At most kMatvecMaxRows rows per call: each call reads the weight once for its rows.
  for (int64_t r0 = 0; r0 < n; r0 += cuda::kMatvecMaxRows) {
    const int64_t m = std::min(cuda::kMatvecMaxRows, n - r0);
    cuda::matmul_wt(y + r0 * w.rows, w.rows, x + r0 * w.cols, m, w.cols, w.p, w.type, w.rows, b,
                    matvec_ws_.get(), matvec_ws_.size(), s);
  }
}

int64_t CudaDecoder::shared_act_block(int64_t n,
                                      std::initializer_list<const DevWeight*> next) const {
  if (n > cuda::kMatvecMaxRows) return 0;
  int64_t block = 0;
  for (const DevWeight* w : next) {
    if (!w->p) continue;
    const int64_t b = act_block_elems(w->type);
    if (b == 0 || w->cols != d_.C || (block != 0 && b != block)) return 0;
    block = b;
  }
  return block;
}

int64_t CudaDecoder::attn_norm_block(size_t l, int64_t n) const {
  const DevLayer& w = layers_[l];
  if (n == 1 && w.wqkv.p) return shared_act_block(n, {&w.wqkv});
  return shared_act_block(n, {&w.wq, &w.wk, &w.wv});
}

int64_t CudaDecoder::ffn_norm_block(size_t l, int64_t n) const {
  const DevLayer& w = layers_[l];
  if (d_.gpt2) return shared_act_block(n, {&w.w_up});
  if (n == 1 && w.w_gate_up.p) return shared_act_block(n, {&w.w_gate_up});
  return shared_act_block(n, {&w.w_gate, &w.w_up});
}

bool CudaDecoder::quantizing_norm(float* res_out, float* out, const float* a, const float* r,
                                  int64_t n, const DevWeight& w, const DevWeight& b,
                                  int64_t quant_block) {
  quant_ = {};  // xn_ and (when quantizing) the workspace are about to change either way
  if (quant_block == 0 || out != xn_) return false;
  // Any block type with this activation block gives the same workspace layout.
  const DType t = quant_block == 32 ? DType::q8_0 : DType::q4_k;
  const cuda::QuantizedActs q =
      cuda::quantized_acts_view(matvec_ws_.get(), matvec_ws_.size(), n, d_.C, t);
  cuda::norm_quantize_f32(d_.gpt2, res_out, out, a, r, w.f(), d_.gpt2 ? b.f() : nullptr, n, d_.C,
                          d_.norm_eps, q, stream_.get());
  quant_ = QuantState{out, n, d_.C, quant_block};
  return true;
}

void CudaDecoder::swiglu(float* out, const float* gate, const float* up, int64_t n,
                         const DevWeight& down) {
  quant_ = {};  // out and (when quantizing) the workspace are about to change either way
  const int64_t block = act_block_elems(down.type);
  if (n <= cuda::kMatvecMaxRows && block > 0 && down.cols == d_.F && out == ff_a_) {
    const cuda::QuantizedActs q =
        cuda::quantized_acts_view(matvec_ws_.get(), matvec_ws_.size(), n, d_.F, down.type);
    cuda::swiglu_quantize_f32(out, gate, up, n, d_.F, q, stream_.get());
    quant_ = QuantState{out, n, d_.F, block};
    return;
  }
  cuda::swiglu_forward<float>(out, gate, up, n, d_.F, stream_.get());
}

void CudaDecoder::norm(float* out, const float* inp, int64_t n, const DevWeight& w,
                       const DevWeight& b, int64_t quant_block) {
  if (quantizing_norm(nullptr, out, inp, nullptr, n, w, b, quant_block)) return;
  if (d_.gpt2)
    cuda::layernorm_forward<float>(out, nullptr, nullptr, inp, w.f(), b.f(), n, d_.C,
                                   stream_.get());
  else
    cuda::rmsnorm_forward<float>(out, nullptr, inp, w.f(), n, d_.C, d_.norm_eps, stream_.get());
}

void CudaDecoder::residual_norm(float* x, float* out, const float* r, int64_t n, const DevWeight& w,
                                const DevWeight& b, int64_t quant_block) {
  if (quantizing_norm(x, out, x, r, n, w, b, quant_block)) return;
  if (d_.gpt2)
    cuda::layernorm_residual_forward<float>(x, out, nullptr, nullptr, x, r, w.f(), b.f(), n, d_.C,
                                            stream_.get());
  else
    cuda::rmsnorm_residual_forward<float>(x, out, nullptr, x, r, w.f(), n, d_.C, d_.norm_eps,
                                          stream_.get());
}

void CudaDecoder::layer(size_t l, int64_t n, int64_t max_keys) {
  const DevLayer& w = layers_[l];
  cudaStream_t s = stream_.get();
  mark(kQkv);
  float *q = q_, *k = k_, *v = v_;
  if (n == 1 && w.wqkv.p) {  // one row: q, k, v side by side are each contiguous
    linear(qkv_, xn_, 1, w.wqkv, w.bqkv);
    q = qkv_;
    k = qkv_ + Q_;
    v = k + KV_;
  } else {
    linear(q_, xn_, n, w.wq, w.bq);
    linear(k_, xn_, n, w.wk, w.bk);
    linear(v_, xn_, n, w.wv, w.bv);
  }
  mark(kDeviceStageOther);
  if (!d_.gpt2) {
    cuda::RopeTableView t;
    t.cos = rope_.as<float>();
    t.sin = rope_.as<float>() + d_.rope_max_pos * (d_.rope_dim / 2);
    t.max_pos = d_.rope_max_pos;
    t.rotary_dim = d_.rope_dim;
    const auto layout =
        d_.rope_interleaved ? cuda::RopeLayout::interleaved : cuda::RopeLayout::half;
    if (n == 1 && k == q + Q_) {  // one row, k right after q: one rotation over H + Hkv heads
      cuda::rope_forward<float>(q, q, t, pos_, 0, 1, 1, d_.H + d_.Hkv, d_.D, layout, s);
    } else {
      cuda::rope_forward<float>(q, q, t, pos_, 0, 1, n, d_.H, d_.D, layout, s);
      cuda::rope_forward<float>(k, k, t, pos_, 0, 1, n, d_.Hkv, d_.D, layout, s);
    }
  }
  // Layer l's keys start at element l * 2 * half_block_ of each block; values half_block_ later.
  void* layer_kv = cache_.as<uint8_t>() + static_cast<size_t>(l) * 2 * half_block_ * elem_bytes_;
  cuda::kv_cache_append(layer_kv, d_.kv_type, k, v, slot_, n, d_.Hkv, d_.D, d_.block_tokens,
                        block_stride_, half_block_, s);
  mark(kAttention);
  cuda::PagedDecodeArgs a;
  a.out = att_;
  a.q = q;
  a.rows = n;
  a.H = d_.H;
  a.Hkv = d_.Hkv;
  a.D = d_.D;
  a.kv = layer_kv;
  a.kv_dtype = d_.kv_type;
  a.block_tokens = d_.block_tokens;
  a.block_stride = block_stride_;
  a.v_offset = half_block_;
  a.block_tables = tables_;
  a.table_stride = d_.max_seq_blocks;
  a.n_keys = n_keys_;
  a.max_keys = max_keys;
  a.scale = 1.0f / std::sqrt(static_cast<float>(d_.D));
  a.workspace = attn_ws_.as<float>();
  a.workspace_floats = static_cast<int64_t>(attn_ws_.size() / sizeof(float));
  cuda::paged_decode_attention(a, s);

  mark(kAttnOut);
  linear(tmp_, att_, n, w.wo, w.bo);
  mark(kDeviceStageOther);
  residual_norm(x_, xn_, tmp_, n, w.ffn_norm, w.ffn_norm_b, ffn_norm_block(l, n));
  if (d_.gpt2) {
    mark(kMlpIn);
    linear(ff_a_, xn_, n, w.w_up, w.b_up);
    mark(kDeviceStageOther);
    cuda::gelu_forward<float>(ff_a_, ff_a_, n * d_.F, s);
  } else {
    if (n == 1 && w.w_gate_up.p) {
      mark(kMlpIn);
      linear(gate_up_, xn_, 1, w.w_gate_up, {});
      mark(kDeviceStageOther);
      swiglu(ff_a_, gate_up_, gate_up_ + d_.F, 1, w.w_down);
    } else {
      mark(kMlpIn);
      linear(ff_a_, xn_, n, w.w_gate, {});
      linear(ff_b_, xn_, n, w.w_up, {});
      mark(kDeviceStageOther);
      swiglu(ff_a_, ff_a_, ff_b_, n, w.w_down);
    }
  }
  mark(kMlpDown);
  linear(tmp_, ff_a_, n, w.w_down, w.b_down);
  mark(kDeviceStageOther);
  // The residual add, fused with the next norm: the next layer's attention norm, or the output
  // norm after the last layer.
  const bool last = l + 1 == layers_.size();
  // (The output head reads gathered rows, not xn_: its norm quantizes nothing.)
  residual_norm(x_, xn_, tmp_, n, last ? out_norm_ : layers_[l + 1].attn_norm,
                last ? out_norm_b_ : layers_[l + 1].attn_norm_b,
                last ? 0 : attn_norm_block(l + 1, n));
}

void CudaDecoder::forward(const DecoderChunk& c) {
  TS_CHECK(c.n >= 1 && c.n <= d_.max_rows, "[cuda decoder] chunk of ", c.n, " rows (max ",
           d_.max_rows, ")");
  TS_CHECK(c.n_logits >= 0 && c.n_logits <= c.n && (c.n_logits == 0 || c.logits),
           "[cuda decoder] n_logits=", c.n_logits, " out of range");
  const cuda::DeviceGuard guard(device_);
  cudaStream_t s = stream_.get();
  const int64_t n = c.n, S = d_.max_seq_blocks;
  const size_t x_bytes = x_bytes_, row_ints = row_ints_;
  // Stage the inputs in the pinned buffer in the device layout, then one copy.
  uint8_t* st = staging_->get();
  std::memcpy(st, c.x, static_cast<size_t>(n * d_.C) * sizeof(float));
  auto* pos = reinterpret_cast<int32_t*>(st + x_bytes);
  auto* slot = reinterpret_cast<int32_t*>(st + x_bytes + row_ints);
  auto* n_keys = reinterpret_cast<int32_t*>(st + x_bytes + 2 * row_ints);
  auto* logit_rows = reinterpret_cast<int32_t*>(st + x_bytes + 3 * row_ints);
  auto* tables = reinterpret_cast<int32_t*>(st + x_bytes + 4 * row_ints);
  int64_t max_keys = 1;
  for (int64_t r = 0; r < n; ++r) {
    TS_CHECK(
        c.pos[r] >= 0 && (d_.gpt2 || c.pos[r] < d_.rope_max_pos) && c.pos[r] < S * d_.block_tokens,
        "[cuda decoder] row ", r, " position ", c.pos[r], " out of range");
    TS_CHECK(c.slot[r] >= 0 && c.slot[r] < d_.n_blocks * d_.block_tokens, "[cuda decoder] row ", r,
             " cache slot ", c.slot[r], " out of range");
    pos[r] = c.pos[r];
    slot[r] = c.slot[r];
    n_keys[r] = c.pos[r] + 1;
    max_keys = std::max<int64_t>(max_keys, c.pos[r] + 1);
  }
  for (int64_t i = 0; i < n * S; ++i) {
    TS_CHECK(c.tables[i] >= 0 && c.tables[i] < d_.n_blocks, "[cuda decoder] block table entry ",
             c.tables[i], " out of range");
    tables[i] = c.tables[i];
  }
  for (int64_t i = 0; i < c.n_logits; ++i) {
    TS_CHECK(c.logit_rows[i] >= 0 && c.logit_rows[i] < n, "[cuda decoder] logit row ",
             c.logit_rows[i], " out of range");
    logit_rows[i] = c.logit_rows[i];
  }
  n_logits_ = c.n_logits;
  // x, then the int arrays up to the tables actually used (n rows of S entries).
  n_marks_ = 0;  // a chunk that threw may have left marks behind
  mark(kDeviceStageOther);
  cuda::copy_to_device_async(x_, st, static_cast<size_t>(n * d_.C) * sizeof(float), s);
  cuda::copy_to_device_async(pos_, st + x_bytes,
                             4 * row_ints + static_cast<size_t>(n * S) * sizeof(int32_t), s);

  // Small chunks (decode steps) with one head piece run as a CUDA graph once their shape has
  // been seen before: a decode step is ~10 launches per layer of a few microseconds each, and
  // launch gaps would otherwise cost more than reading the weights. The key's attention bound
  // is rounded up so a growing sequence reuses its graph for kGraphKeysRound tokens (the
  // kernel reads each row's own n_keys from the device; extra splits stay empty).
  // Stage timing records events between launches: eager launches only.
  const bool graphable =
      graphs_enabled_ && !timing_ && n <= kGraphMaxRows && c.n_logits <= kHeadRows;
  if (graphable) {
    const int64_t bound = std::min(
        S * d_.block_tokens, (max_keys + kGraphKeysRound - 1) / kGraphKeysRound * kGraphKeysRound);
    run_graph(GraphKey{n, c.n_logits, bound});
  } else {
    run_layers(n, max_keys);
  }
  if (c.n_logits > 0) {
    // run_layers leaves the first head piece in logits_; larger requests (never graphed) compute
    // the other pieces here.
    const int64_t piece = std::min(d_.max_rows, kHeadRows);
    for (int64_t r0 = 0; r0 < c.n_logits; r0 += piece) {
      const int64_t m = std::min(piece, c.n_logits - r0);
      if (r0 > 0) {
        mark(kHead);
        linear(logits_, gathered_ + r0 * d_.C, m, output_, {});
        mark(kDeviceStageOther);
      }
      cuda::copy_to_host_async(c.logits + r0 * d_.V, logits_,
                               static_cast<size_t>(m * d_.V) * sizeof(float), s);
    }
  }
  mark(kDeviceStageOther);  // closes the last interval
  // The staging buffer and the host logits must not be touched before the stream is done.
  stream_.synchronize();
  if (timing_) collect_stage_times();
}

void CudaDecoder::run_layers(int64_t n, int64_t max_keys) {
  cudaStream_t s = stream_.get();
  norm(xn_, x_, n, layers_[0].attn_norm, layers_[0].attn_norm_b, attn_norm_block(0, n));
  for (size_t l = 0; l < layers_.size(); ++l) layer(l, n, max_keys);
  // xn_ holds the output norm of every row: gather the wanted rows, then the first head piece.
  if (n_logits_ > 0) {
    cuda::gather_rows(gathered_, xn_, logit_rows_, n_logits_, d_.C, s);
    mark(kHead);
    linear(logits_, gathered_, std::min({n_logits_, d_.max_rows, kHeadRows}), output_, {});
    mark(kDeviceStageOther);
  }
}

void CudaDecoder::run_graph(const GraphKey& key) {
  cudaStream_t s = stream_.get();
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    // First sighting: run eagerly (which also makes cuBLASLt pick and cache its algorithms and
    // allocate its workspace, neither of which may happen during capture). Remember the shape.
    if (graphs_.size() < kMaxGraphs) graphs_.emplace(key, nullptr);
    run_layers(key.n, key.max_keys);
    return;
  }
  if (!it->second) {
    cudaGraph_t graph = nullptr;
    TS_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    try {
      run_layers(key.n, key.max_keys);
    } catch (...) {
      cudaStreamEndCapture(s, &graph);  // leave the stream usable
      if (graph) cudaGraphDestroy(graph);
      throw;
    }
    TS_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    TS_CUDA_CHECK(e);
    it->second = exec;
  }
  TS_CUDA_CHECK(cudaGraphLaunch(it->second, s));
}

}  // namespace

std::unique_ptr<DeviceDecoder> make_cuda_decoder(const DecoderDesc& desc, int device) {
  cuda::require_device(device, "--device cuda");
  return std::make_unique<CudaDecoder>(desc, device);
}

}  // namespace tessera::backend
