// The CUDA device decoder's internals, shared by its two files: the constants of its routes,
// the device weights, and the CudaDecoder class (device_decoder_setup.cc builds it: checks,
// weight upload, buffers; device_decoder.cc runs it: the forward pass, graphs, stage timing).
// Not for use outside backend/cuda.
#pragma once

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

namespace tessera::backend::cuda_decoder {

using cuda::DeviceBuffer;

constexpr size_t kAlign = 256;
// Logit rows computed per head call (bounds the device logits buffer at large vocabularies).
constexpr int64_t kHeadRows = 64;
// The decode attention's split workspace covers this many rows with up to kAttnSplits splits.
constexpr int64_t kAttnRows = 16, kAttnSplits = 32;
// With an f16 cache, runs of at least this many rows of one sequence (a prompt) take the
// tensor-core prefill attention in tiles of 64 rows; shorter runs (decode rows) the decode
// kernel, which splits long contexts over the GPU where a lone row's tile could not.
constexpr int64_t kPrefillMinRows = 16;
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

inline size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

inline bool matrix_type_supported(DType t) {
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
  void copy_cache_block(int32_t dst, int32_t src) override;
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
  // A graph bakes in its grids, so the attention's tile and decode-row counts are part of the
  // shape (the lists themselves are read from the device).
  struct GraphKey {
    int64_t n, n_logits, max_keys, prefill_tiles, decode_rows;
    bool operator<(const GraphKey& o) const {
      return std::tie(n, n_logits, max_keys, prefill_tiles, decode_rows) <
             std::tie(o.n, o.n_logits, o.max_keys, o.prefill_tiles, o.decode_rows);
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
          *logit_rows_ = nullptr, *decode_rows_ = nullptr, *first_key_ = nullptr;
  cuda::PagedPrefillTile* prefill_tiles_ = nullptr;
  // Staging layout: x_bytes_ of x, then the kRowArrays row arrays row_ints_ apart (pos, slot,
  // n_keys, logit_rows, decode_rows, first_key), the prefill tiles (tile_bytes_), the tables.
  static constexpr size_t kRowArrays = 6;
  size_t x_bytes_ = 0, row_ints_ = 0, tile_bytes_ = 0;
  // This chunk's attention plan (cuda::plan_paged_prefill); no tiles: every row decodes.
  int64_t n_prefill_tiles_ = 0, n_decode_rows_ = 0;
  bool prefill_enabled_ = false;  // f16 cache and not TESSERA_CUDA_PAGED_PREFILL=0
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

}  // namespace tessera::backend::cuda_decoder
