// The CUDA device decoder's forward pass: launches on one stream over the uploaded weights
// (device_decoder_setup.cc) and the paged KV cache. Matrices go through the quantized
// matrix-vector kernels (up to kMatvecMaxRows rows at a time, so each weight byte is read once
// per 8 rows), through an f16 tensor-core GEMM for prefill-sized chunks (the weight widened to
// f16 first), or, for f32 weights, through cuBLASLt in f32; attention through the paged decode
// kernel (prefill rows are causal decode rows of the same sequence). Decode-sized chunks replay
// CUDA graphs; stage timing records events between the parts.
#include "backend/cuda/device_decoder_impl.h"

namespace tessera::backend::cuda_decoder {

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
  // Layer l's keys start at element l * 2 * half_block_ of each block; values half_block_ later.
  void* layer_kv = cache_.as<uint8_t>() + static_cast<size_t>(l) * 2 * half_block_ * elem_bytes_;
  if (d_.gpt2) {
    cuda::kv_cache_append(layer_kv, d_.kv_type, k, v, slot_, n, d_.Hkv, d_.D, d_.block_tokens,
                          block_stride_, half_block_, s);
  } else {
    // RoPE on q and k and the cache append in one launch.
    cuda::RopeAppendArgs ra;
    ra.q = ra.q_out = q, ra.k = k, ra.v = v;
    ra.rows = n, ra.H = d_.H, ra.Hkv = d_.Hkv, ra.D = d_.D;
    ra.table.cos = rope_.as<float>();
    ra.table.sin = rope_.as<float>() + d_.rope_max_pos * (d_.rope_dim / 2);
    ra.table.max_pos = d_.rope_max_pos;
    ra.table.rotary_dim = d_.rope_dim;
    ra.layout = d_.rope_interleaved ? cuda::RopeLayout::interleaved : cuda::RopeLayout::half;
    ra.positions = pos_;
    ra.layer_kv = layer_kv, ra.kv_type = d_.kv_type, ra.slot = slot_;
    ra.block_tokens = d_.block_tokens, ra.block_stride = block_stride_, ra.v_offset = half_block_;
    cuda::rope_kv_append(ra, s);
  }
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
  if (d_.sliding_window > 0) {
    a.first_key = first_key_;
    a.max_span = std::min(max_keys, d_.sliding_window);
  }
  a.scale = 1.0f / std::sqrt(static_cast<float>(d_.D));
  a.workspace = attn_ws_.as<float>();
  a.workspace_floats = static_cast<int64_t>(attn_ws_.size() / sizeof(float));
  if (n_prefill_tiles_ > 0) {
    a.prefill_tiles = prefill_tiles_;
    a.n_prefill_tiles = n_prefill_tiles_;
    a.decode_rows = decode_rows_;
    a.n_decode_rows = n_decode_rows_;
  }
  // A matvec-sized chunk in front of a 32-block attention output product: the attention
  // quantizes its own output (the matvec workspace's xn_ rows were used by q/k/v already).
  const int64_t HD = d_.H * d_.D;
  cuda::QuantizedActs att_q;
  if (n_prefill_tiles_ == 0 && n <= cuda::kMatvecMaxRows && act_block_elems(w.wo.type) == 32 &&
      w.wo.cols == HD && cuda::matmul_wt_workspace_bytes(n, HD, w.wo.type) <= matvec_ws_.size()) {
    att_q = cuda::quantized_acts_view(matvec_ws_.get(), matvec_ws_.size(), n, HD, w.wo.type);
    a.quantize_out = &att_q;
  }
  quant_ = {};
  cuda::paged_decode_attention(a, s);
  if (a.quantize_out) quant_ = QuantState{att_, n, HD, 32};

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
  auto* decode_rows = reinterpret_cast<int32_t*>(st + x_bytes + 4 * row_ints);
  auto* first_key = reinterpret_cast<int32_t*>(st + x_bytes + 5 * row_ints);
  auto* tiles = reinterpret_cast<cuda::PagedPrefillTile*>(st + x_bytes + kRowArrays * row_ints);
  auto* tables = reinterpret_cast<int32_t*>(st + x_bytes + kRowArrays * row_ints + tile_bytes_);
  const int64_t W = d_.sliding_window;
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
    first_key[r] = static_cast<int32_t>(W > 0 ? std::max<int64_t>(0, c.pos[r] + 1 - W) : 0);
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
  // Prompt rows to the tensor-core tiles, the rest to the decode kernel (or all of them there).
  n_prefill_tiles_ = n_decode_rows_ = 0;
  if (prefill_enabled_) {
    const cuda::PagedPrefillPlan plan = cuda::plan_paged_prefill(
        n, n_keys, W > 0 ? first_key : nullptr, tables, S, kPrefillMinRows);
    n_prefill_tiles_ = static_cast<int64_t>(plan.tiles.size());
    n_decode_rows_ = static_cast<int64_t>(plan.decode_rows.size());
    std::copy(plan.tiles.begin(), plan.tiles.end(), tiles);
    std::copy(plan.decode_rows.begin(), plan.decode_rows.end(), decode_rows);
  }
  // x, then the int arrays up to the tables actually used (n rows of S entries).
  n_marks_ = 0;  // a chunk that threw may have left marks behind
  mark(kDeviceStageOther);
  cuda::copy_to_device_async(x_, st, static_cast<size_t>(n * d_.C) * sizeof(float), s);
  cuda::copy_to_device_async(
      pos_, st + x_bytes,
      kRowArrays * row_ints + tile_bytes_ + static_cast<size_t>(n * S) * sizeof(int32_t), s);

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
    run_graph(GraphKey{n, c.n_logits, bound, n_prefill_tiles_, n_decode_rows_});
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

}  // namespace tessera::backend::cuda_decoder
