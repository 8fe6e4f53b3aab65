// A decoder-only transformer forward pass that lives on an accelerator: weights, activations and
// the paged KV cache stay in device memory, and each call runs one chunk of token rows through
// every layer. The description is plain data (no model/ types: the backend sits below model/);
// infer::Engine builds it from a model::DecoderModel and keeps the sequence bookkeeping on the
// host. Implemented by backend/cuda; backend/no_cuda's factory says the build has no CUDA.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace tessera::backend {

// A weight in host memory, in its stored type: a matrix (rows, cols) with cols the input
// dimension (y = x W^T), or a vector (rows = 1). Absent when data is null.
struct HostWeight {
  const void* data = nullptr;
  DType type = DType::f32;
  int64_t rows = 0, cols = 0;
  bool present() const { return data != nullptr; }
};

// Norm weights and biases must be f32 (the engine widens them once); matrices may be f32, f16,
// bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k or q6_k.
struct DecoderLayerWeights {
  HostWeight attn_norm, attn_norm_b;  // (C); _b gpt2 only
  HostWeight wq, wk, wv, wo;          // (Q,C) (KV,C) (KV,C) (C,Q)
  HostWeight bq, bk, bv, bo;          // optional
  HostWeight ffn_norm, ffn_norm_b;    // (C)
  HostWeight w_gate, w_up, w_down;    // (F,C) (F,C) (C,F); gate absent for gpt2
  HostWeight b_up, b_down;            // gpt2
};

struct DecoderDesc {
  // gpt2: LayerNorm with bias (eps 1e-5), GELU MLP, no RoPE; otherwise (llama family):
  // RMSNorm (norm_eps), RoPE, SwiGLU.
  bool gpt2 = false;
  int64_t C = 0, H = 0, Hkv = 0, D = 0, F = 0, V = 0;
  float norm_eps = 1e-5f;
  // RoPE table (llama): cos, sin (rope_max_pos, rope_dim / 2), as ops::RopeTable's.
  const float* rope_cos = nullptr;
  const float* rope_sin = nullptr;
  int64_t rope_max_pos = 0, rope_dim = 0;
  bool rope_interleaved = false;  // pairs (2i, 2i+1) instead of (i, i + R/2)
  std::vector<DecoderLayerWeights> layers;
  HostWeight out_norm, out_norm_b, output;  // output (V, C)
  // KV cache: n_blocks blocks of block_tokens tokens, kv_type f32 or f16.
  DType kv_type = DType::f16;
  int64_t block_tokens = 32, n_blocks = 0;
  int64_t max_rows = 512;      // rows per chunk (sizes the activation buffers)
  int64_t max_seq_blocks = 0;  // longest block table a row can have (max_ctx / block_tokens)
  // Sliding window (0: none): a row at position p attends to keys max(0, p + 1 - W) .. p.
  int64_t sliding_window = 0;
};

// One chunk of token rows (host arrays). Row r's token embedding (plus position embedding for
// gpt2) is already in x; its key and value go to cache slot slot[r] (block * block_tokens +
// offset) and it attends to keys 0 .. pos[r] of its sequence (the window's last ones, if the
// model has one), through table row r of
// `tables` (n, max_seq_blocks), unused entries 0.
struct DecoderChunk {
  int64_t n = 0;
  const float* x = nullptr;  // (n, C)
  const int32_t* pos = nullptr;
  const int32_t* slot = nullptr;
  const int32_t* tables = nullptr;
  // Logits are computed for rows logit_rows[0 .. n_logits) (increasing) into logits (n_logits, V).
  const int32_t* logit_rows = nullptr;
  int64_t n_logits = 0;
  float* logits = nullptr;
};

// Device time of forward calls by part, summed while stage timing is on: the weight products by
// the matrices they read, in infer::Stage's order (q/k/v, attention output, MLP in, MLP down,
// output head), attention over the cache, and the rest (norms, RoPE, cache appends, activation
// quantization, element-wise ops, the chunk's copies in and out). Events are recorded between
// parts on the stream, so each part's time includes the gaps between its own launches.
inline constexpr int kDeviceStages = 7;
inline constexpr int kDeviceStageOther = 6;
struct DeviceStageTimes {
  double seconds[kDeviceStages] = {};
  int64_t weight_bytes[kDeviceStages] = {};  // stored bytes of the weights each part's calls read
};

class DeviceDecoder {
 public:
  virtual ~DeviceDecoder() = default;
  // Runs the chunk and returns when its logits are in host memory.
  virtual void forward(const DecoderChunk& chunk) = 0;
  // On: every chunk runs as eager launches (no CUDA graphs) with an event between parts, and the
  // parts' times add up in stage_times(). Off (the default): no events.
  virtual void set_stage_timing(bool on) = 0;
  virtual const DeviceStageTimes& stage_times() const = 0;
  virtual void reset_stage_times() = 0;
  // "NVIDIA H200 (sm_90): weights 0.62 GB, KV cache 0.05 GB, activations 0.02 GB"
  virtual std::string describe() const = 0;
  // Device memory in use by this decoder, bytes.
  virtual int64_t device_bytes() const = 0;
  // Copies cache block src (every layer's keys and values) into block dst, ordered after the
  // forward calls issued before it: a sequence's copy of a block it shared (copy-on-write).
  virtual void copy_cache_block(int32_t dst, int32_t src) = 0;
};

// Uploads the weights and allocates the cache and activations on CUDA device `device`. Throws
// Error naming the tensor or parameter it cannot take (a type the kernels lack, a head dim other
// than 64 or 128), or saying the build has no CUDA or the machine no device.
std::unique_ptr<DeviceDecoder> make_cuda_decoder(const DecoderDesc& desc, int device = 0);

}  // namespace tessera::backend
