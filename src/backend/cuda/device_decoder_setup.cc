// The CUDA device decoder, set up: the description checked, the weights uploaded once in their
// stored types (q/k/v and gate/up back to back when their types match), and the KV cache,
// activation and scratch buffers allocated for the largest chunk.
#include "backend/cuda/dependent_launch.h"
#include "backend/cuda/device_decoder_impl.h"

namespace tessera::backend {
namespace cuda_decoder {

CudaDecoder::CudaDecoder(const DecoderDesc& d, int device)
    : d_(d),
      device_(device),
      guard_(device),
      stream_(),
      pool_(cuda::MemoryPool::for_device(device)) {
  validate();
  // TESSERA_CUDA_GRAPHS=0 runs every step eagerly (to measure what the graphs save).
  if (const char* g = std::getenv("TESSERA_CUDA_GRAPHS")) graphs_enabled_ = std::string(g) != "0";
  // TESSERA_CUDA_PAGED_PREFILL=0 keeps prompts on the decode kernel (to measure the tiles, or to
  // rule them out).
  prefill_enabled_ = d_.kv_type == DType::f16;
  if (const char* v = std::getenv("TESSERA_CUDA_PAGED_PREFILL")) {
    const std::string s(v);
    TS_CHECK(s == "0" || s == "1", "[cuda decoder] TESSERA_CUDA_PAGED_PREFILL=", s,
             " must be 0 or 1");
    prefill_enabled_ = prefill_enabled_ && s == "1";
  }
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
  // n_keys, logit_rows, decode_rows, first_key (R each), the prefill tiles (up to R) and tables
  // (R, S); on the device x goes to x_, the rest to ints_.
  x_bytes_ = align_up(static_cast<size_t>(R * d_.C) * sizeof(float));
  row_ints_ = align_up(static_cast<size_t>(R) * sizeof(int32_t));
  tile_bytes_ = align_up(static_cast<size_t>(R) * sizeof(cuda::PagedPrefillTile));
  const size_t ints_bytes = kRowArrays * row_ints_ + tile_bytes_ +
                            align_up(static_cast<size_t>(R * d_.max_seq_blocks) * sizeof(int32_t));
  ints_ = DeviceBuffer(pool_, ints_bytes, s);
  uint8_t* base = ints_.as<uint8_t>();
  pos_ = reinterpret_cast<int32_t*>(base);
  slot_ = reinterpret_cast<int32_t*>(base + row_ints_);
  n_keys_ = reinterpret_cast<int32_t*>(base + 2 * row_ints_);
  logit_rows_ = reinterpret_cast<int32_t*>(base + 3 * row_ints_);
  decode_rows_ = reinterpret_cast<int32_t*>(base + 4 * row_ints_);
  first_key_ = reinterpret_cast<int32_t*>(base + 5 * row_ints_);
  prefill_tiles_ = reinterpret_cast<cuda::PagedPrefillTile*>(base + kRowArrays * row_ints_);
  tables_ = reinterpret_cast<int32_t*>(base + kRowArrays * row_ints_ + tile_bytes_);
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
  // Reads TESSERA_CUDA_PDL now, so a bad value fails at set-up rather than inside a forward.
  (void)cuda::dependent_launch_enabled();
  TS_CHECK(d_.kv_type == DType::f32 || d_.kv_type == DType::f16, op, " kv_type ",
           dtype_name(d_.kv_type), " must be f16 or f32");
  TS_CHECK(d_.block_tokens > 0 && d_.n_blocks > 0 && d_.max_rows > 0 && d_.max_seq_blocks > 0, op,
           " block_tokens, n_blocks, max_rows and max_seq_blocks must be positive");
  TS_CHECK(d_.sliding_window >= 0 && d_.sliding_window <= (int64_t{1} << 31) - 1, op,
           " sliding window ", d_.sliding_window, " out of range");
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

void CudaDecoder::copy_cache_block(int32_t dst, int32_t src) {
  TS_CHECK(dst >= 0 && dst < d_.n_blocks && src >= 0 && src < d_.n_blocks,
           "[cuda] cache block copy ", src, " -> ", dst, " outside [0, ", d_.n_blocks, ")");
  const auto bytes = static_cast<size_t>(block_stride_ * elem_bytes_);
  TS_CUDA_CHECK(cudaMemcpyAsync(cache_.as<uint8_t>() + static_cast<size_t>(dst) * bytes,
                                cache_.as<uint8_t>() + static_cast<size_t>(src) * bytes, bytes,
                                cudaMemcpyDeviceToDevice, stream_.get()));
}

}  // namespace cuda_decoder

std::unique_ptr<DeviceDecoder> make_cuda_decoder(const DecoderDesc& desc, int device) {
  cuda::require_device(device, "the CUDA device decoder");
  return std::make_unique<cuda_decoder::CudaDecoder>(desc, device);
}

}  // namespace tessera::backend
