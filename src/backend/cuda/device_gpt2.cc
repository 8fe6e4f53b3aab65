// GPT-2 training on CUDA: the CPU model's forward and backward (model/gpt2_step.cc) as launches
// on one stream, with bf16 activations and GEMM inputs (cuBLASLt, f32 accumulation), f32 weight
// gradients, FlashAttention-2 forward/backward, fused residual + LayerNorm, fused softmax +
// cross-entropy, AdamW on f32 master weights that also refreshes their bf16 copy, and the CPU
// model's recompute policies (GELU outputs, or whole blocks, recomputed in backward).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <vector>

#include "backend/cuda/attention.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/dependent_launch.h"
#include "backend/cuda/gemm_lt.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/memory_pool.h"
#include "backend/cuda/runtime.h"
#include "backend/cuda/train_kernels.h"
#include "backend/device.h"
#include "backend/device_gpt2.h"
#include "core/error.h"

namespace tessera::backend {
namespace {

using bf16 = __nv_bfloat16;
using cuda::DeviceBuffer;

constexpr size_t kAlign = 256;

size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

// One block's saved activations (bf16 unless noted), N = B*T rows. With ops::Recompute::block
// every block points at one shared set; with gelu (and block) `gelu` is dbig, the backward's
// (N, 4C) scratch, which is free during the forward.
struct BlockActs {
  bf16 *ln1, *qkv, *atty, *resid_mid, *ln2, *fch, *gelu;
  float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd, *lse;
};

class CudaGpt2 final : public DeviceGpt2 {
 public:
  CudaGpt2(const Gpt2DeviceDesc& d, int device);
  ~CudaGpt2() override { cudaStreamSynchronize(stream_.get()); }

  void upload_params(const float* params) override;
  void download_params(float* params) const override;
  void download_grads(float* grads) const override;
  void upload_adam(const float* m, const float* v) override;
  void download_adam(float* m, float* v) const override;
  void zero_grads() override;
  float forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T) override;
  float forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                         float loss_scale) override;
  double adamw_step(const std::vector<ops::AdamWRun>& runs, const ops::AdamWConfig& cfg, float lr,
                    int64_t t) override;
  int64_t device_bytes() const override {
    return static_cast<int64_t>(state_.size() + acts_.size() + work_.size());
  }

 private:
  // Copies the batch in, runs the forward pass to the logits and the losses (logits become
  // dlogits when dscale != 0). Returns the mean loss over the counted targets.
  float run_forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                    float loss_scale, bool backward);
  void backward(int64_t B, int64_t T);
  // Block l on resid[l] (and, for l > 0, the previous block's MLP output left in scratch_c, whose
  // residual add is fused with ln_1 and writes resid[l]). Leaves the block's MLP output in
  // scratch_c. A replay (backward under ops::Recompute::block) rebuilds the block's saved set
  // from resid[l] alone and stops after c_fc: the backward recomputes GELU itself.
  void block_forward(int64_t l, int64_t B, int64_t T, bool replay);
  // y (n, n_out) = x (n, n_in) W^T [+ b], all bf16; W at parameter offset w_off.
  void linear_forward(bf16* y, const bf16* x, int64_t w_off, int64_t b_off, int64_t n, int64_t n_in,
                      int64_t n_out);
  // dW += dy^T x (f32); db += column sums of dy; then dx = dy W (bf16, skipped if null).
  void linear_backward(bf16* dx, const bf16* dy, const bf16* x, int64_t w_off, int64_t b_off,
                       int64_t n, int64_t n_in, int64_t n_out);
  cuda::FlashAttentionShape attn_shape(int64_t B, int64_t T) const;
  float* p(int64_t off) const { return params_ + off; }
  float* g(int64_t off) const { return grads_ + off; }
  bf16* w16(int64_t off) const { return params16_ + off; }

  Gpt2DeviceDesc d_;
  int device_;
  cuda::DeviceGuard guard_;
  cuda::Stream stream_;
  cuda::MemoryPool& pool_;
  int64_t D_ = 0, N_ = 0;
  DeviceBuffer state_, acts_, work_;
  float *params_ = nullptr, *grads_ = nullptr, *m_ = nullptr, *v_ = nullptr;
  bf16* params16_ = nullptr;
  std::vector<bf16*> resid_;  // L+1 residual streams (N, C)
  std::vector<BlockActs> blocks_;
  bf16 *lnf_ = nullptr, *logits_ = nullptr, *scratch_c_ = nullptr, *dresid_ = nullptr,
       *dbig_ = nullptr;
  float *lnf_mean_ = nullptr, *lnf_rstd_ = nullptr, *losses_ = nullptr, *norm_ws_ = nullptr,
        *bias_ws_ = nullptr;
  double *sumsq_ = nullptr, *sumsq_ws_ = nullptr;
  int32_t *tokens_ = nullptr, *targets_ = nullptr;
  void* attn_ws_ = nullptr;
  std::vector<float> host_losses_;
};

CudaGpt2::CudaGpt2(const Gpt2DeviceDesc& d, int device)
    : d_(d),
      device_(device),
      guard_(device),
      stream_(),
      pool_(cuda::MemoryPool::for_device(device)) {
  const char* op = "[cuda gpt2]";
  TS_CHECK(d_.L > 0 && d_.H > 0 && d_.C > 0 && d_.C % d_.H == 0 && d_.V > 0 && d_.Vp >= d_.V &&
               d_.max_seq > 0 && d_.n_params > 0,
           op, " bad configuration");
  TS_CHECK(static_cast<int64_t>(d_.blocks.size()) == d_.L, op, " ", d_.blocks.size(),
           " block offsets for ", d_.L, " layers");
  D_ = d_.C / d_.H;
  TS_CHECK(D_ == 64 || D_ == 128, op, " head dim ", D_,
           " is not supported on CUDA (the flash attention kernels take 64 or 128)");
  TS_CHECK(d_.max_B > 0 && d_.max_T > 0 && d_.max_T <= d_.max_seq, op, " batch (", d_.max_B, ", ",
           d_.max_T, ") out of range (T <= ", d_.max_seq, ")");
  // Reads TESSERA_CUDA_PDL now (the norm and GELU kernels consult it), failing at set-up.
  (void)cuda::dependent_launch_enabled();
  N_ = d_.max_B * d_.max_T;
  const int64_t C = d_.C, L = d_.L, N = N_, P = d_.n_params;
  cudaStream_t s = stream_.get();

  // Parameters, gradients, AdamW moments (f32) and the bf16 parameter copy.
  const size_t pf = align_up(static_cast<size_t>(P) * 4);
  state_ = DeviceBuffer(pool_, 4 * pf + align_up(static_cast<size_t>(P) * 2), s);
  auto* base = state_.as<uint8_t>();
  params_ = reinterpret_cast<float*>(base);
  grads_ = reinterpret_cast<float*>(base + pf);
  m_ = reinterpret_cast<float*>(base + 2 * pf);
  v_ = reinterpret_cast<float*>(base + 3 * pf);
  params16_ = reinterpret_cast<bf16*>(base + 4 * pf);
  TS_CUDA_CHECK(cudaMemsetAsync(state_.get(), 0, state_.size(), s));

  // Activations: one allocation carved in order (bf16 counts, then f32 counts): a full set per
  // block (none, gelu: without the GELU outputs) or one shared set (block).
  const ops::Recompute rc = d_.recompute;
  TS_CHECK(rc == ops::Recompute::none || rc == ops::Recompute::gelu || rc == ops::Recompute::block,
           op, " unknown recompute policy ", static_cast<int>(rc));
  const int64_t n_sets = rc == ops::Recompute::block ? 1 : L;
  std::vector<std::pair<void**, size_t>> parts;
  auto bf = [&](bf16** ptr, int64_t n) {
    parts.emplace_back(reinterpret_cast<void**>(ptr), static_cast<size_t>(n) * 2);
  };
  auto f32 = [&](float** ptr, int64_t n) {
    parts.emplace_back(reinterpret_cast<void**>(ptr), static_cast<size_t>(n) * 4);
  };
  resid_.assign(static_cast<size_t>(L + 1), nullptr);
  blocks_.assign(static_cast<size_t>(n_sets), BlockActs{});
  for (bf16*& r : resid_) bf(&r, N * C);
  for (BlockActs& a : blocks_) {
    bf(&a.ln1, N * C);
    bf(&a.qkv, N * 3 * C);
    bf(&a.atty, N * C);
    bf(&a.resid_mid, N * C);
    bf(&a.ln2, N * C);
    bf(&a.fch, N * 4 * C);
    if (rc == ops::Recompute::none) bf(&a.gelu, N * 4 * C);
    f32(&a.ln1_mean, N);
    f32(&a.ln1_rstd, N);
    f32(&a.ln2_mean, N);
    f32(&a.ln2_rstd, N);
    f32(&a.lse, N * d_.H);
  }
  bf(&lnf_, N * C);
  bf(&logits_, N * d_.Vp);
  bf(&scratch_c_, N * C);
  bf(&dresid_, N * C);
  bf(&dbig_, N * 4 * C);
  f32(&lnf_mean_, N);
  f32(&lnf_rstd_, N);
  f32(&losses_, N);
  f32(&norm_ws_, cuda::norm_backward_workspace_floats(N, C));
  f32(&bias_ws_, cuda::bias_grad_workspace_floats(N, 4 * C));  // the widest bias is c_fc's
  acts_ = cuda::carve(pool_, s, parts);
  if (rc != ops::Recompute::none)
    for (BlockActs& a : blocks_) a.gelu = dbig_;
  // Every block names its set (the shared one under block), so the passes index blocks_[l].
  if (rc == ops::Recompute::block) blocks_.resize(static_cast<size_t>(L), blocks_[0]);

  // Small work buffers: token ids, the norm reduction, the attention backward workspace.
  const int64_t sizes[] = {P};
  const size_t ids = align_up(static_cast<size_t>(N) * 4);
  const size_t ss = align_up(static_cast<size_t>(cuda::global_sum_squares_workspace(sizes, 1)) * 8);
  const size_t attn =
      align_up(cuda::flash_attention_backward_workspace_bytes(attn_shape(d_.max_B, d_.max_T)));
  work_ = DeviceBuffer(pool_, 2 * ids + kAlign + ss + attn, s);
  auto* w = work_.as<uint8_t>();
  tokens_ = reinterpret_cast<int32_t*>(w);
  targets_ = reinterpret_cast<int32_t*>(w + ids);
  sumsq_ = reinterpret_cast<double*>(w + 2 * ids);
  sumsq_ws_ = reinterpret_cast<double*>(w + 2 * ids + kAlign);
  attn_ws_ = w + 2 * ids + kAlign + ss;
  host_losses_.resize(static_cast<size_t>(N));
  stream_.synchronize();
}

cuda::FlashAttentionShape CudaGpt2::attn_shape(int64_t B, int64_t T) const {
  cuda::FlashAttentionShape a;
  a.B = B;
  a.T = T;
  a.Hq = a.Hkv = d_.H;
  a.D = D_;
  a.scale = 1.0f / std::sqrt(static_cast<float>(D_));
  a.causal = true;
  a.dtype = DType::bf16;
  return a;
}

void CudaGpt2::upload_params(const float* params) {
  const cuda::DeviceGuard guard(device_);
  cuda::copy_to_device(params_, params, static_cast<size_t>(d_.n_params) * 4);
  cuda::convert_f32_to_bf16(params16_, params_, d_.n_params, stream_.get());
  stream_.synchronize();
}

void CudaGpt2::download_params(float* params) const {
  const cuda::DeviceGuard guard(device_);
  stream_.synchronize();
  cuda::copy_to_host(params, params_, static_cast<size_t>(d_.n_params) * 4);
}

void CudaGpt2::download_grads(float* grads) const {
  const cuda::DeviceGuard guard(device_);
  stream_.synchronize();
  cuda::copy_to_host(grads, grads_, static_cast<size_t>(d_.n_params) * 4);
}

void CudaGpt2::upload_adam(const float* m, const float* v) {
  const cuda::DeviceGuard guard(device_);
  stream_.synchronize();
  cuda::copy_to_device(m_, m, static_cast<size_t>(d_.n_params) * 4);
  cuda::copy_to_device(v_, v, static_cast<size_t>(d_.n_params) * 4);
}

void CudaGpt2::download_adam(float* m, float* v) const {
  const cuda::DeviceGuard guard(device_);
  stream_.synchronize();
  cuda::copy_to_host(m, m_, static_cast<size_t>(d_.n_params) * 4);
  cuda::copy_to_host(v, v_, static_cast<size_t>(d_.n_params) * 4);
}

void CudaGpt2::zero_grads() {
  const cuda::DeviceGuard guard(device_);
  TS_CUDA_CHECK(cudaMemsetAsync(grads_, 0, static_cast<size_t>(d_.n_params) * 4, stream_.get()));
}

void CudaGpt2::linear_forward(bf16* y, const bf16* x, int64_t w_off, int64_t b_off, int64_t n,
                              int64_t n_in, int64_t n_out) {
  // The bias has the output's type: the bf16 copy.
  cuda::gemm_lt(cuda::lt_linear(y, cuda::LtType::bf16, x, w16(w_off), cuda::LtType::bf16, n, n_out,
                                n_in, b_off >= 0 ? w16(b_off) : nullptr),
                stream_.get());
}

void CudaGpt2::linear_backward(bf16* dx, const bf16* dy, const bf16* x, int64_t w_off,
                               int64_t b_off, int64_t n, int64_t n_in, int64_t n_out) {
  cudaStream_t s = stream_.get();
  // dW (n_out, n_in) += dy^T x, accumulated in f32 into the gradients.
  cuda::gemm_lt(cuda::lt_linear_weight_grad(g(w_off), dy, x, cuda::LtType::bf16, n, n_out, n_in),
                s);
  if (b_off >= 0) cuda::bias_grad_accumulate(g(b_off), dy, n, n_out, bias_ws_, s);
  if (dx)  // dx (n, n_in) = dy W
    cuda::gemm_lt(cuda::lt_linear_input_grad(dx, cuda::LtType::bf16, dy, w16(w_off),
                                             cuda::LtType::bf16, n, n_out, n_in),
                  s);
}

void CudaGpt2::block_forward(int64_t l, int64_t B, int64_t T, bool replay) {
  cudaStream_t s = stream_.get();
  const int64_t N = B * T, C = d_.C;
  const Gpt2BlockOffsets& o = d_.blocks[static_cast<size_t>(l)];
  const BlockActs& a = blocks_[static_cast<size_t>(l)];
  bf16* in = resid_[static_cast<size_t>(l)];
  // resid[l] = resid_mid[l-1] + MLP output (in scratch_c), fused with ln_1; a replay reads the
  // saved resid[l] instead. The fused kernel normalizes the bf16-rounded sum, so both give the
  // same ln_1 bits.
  if (l == 0 || replay)
    cuda::layernorm_forward<bf16>(a.ln1, a.ln1_mean, a.ln1_rstd, in, p(o.ln1_w), p(o.ln1_b), N, C,
                                  s);
  else
    cuda::layernorm_residual_forward<bf16>(in, a.ln1, a.ln1_mean, a.ln1_rstd,
                                           blocks_[static_cast<size_t>(l - 1)].resid_mid,
                                           scratch_c_, p(o.ln1_w), p(o.ln1_b), N, C, s);
  linear_forward(a.qkv, a.ln1, o.qkv_w, o.qkv_b, N, C, 3 * C);
  const cuda::AttnLayout packed = cuda::packed_qkv_layout(T, d_.H, D_);
  cuda::FlashForwardArgs f;
  f.shape = attn_shape(B, T);
  f.q = {a.qkv, packed};
  f.k = {a.qkv + C, packed};
  f.v = {a.qkv + 2 * C, packed};
  f.out = {a.atty, cuda::contiguous_layout(T, d_.H, D_)};
  f.lse = a.lse;
  cuda::flash_attention_forward(f, s);
  linear_forward(scratch_c_, a.atty, o.proj_w, o.proj_b, N, C, C);
  cuda::layernorm_residual_forward<bf16>(a.resid_mid, a.ln2, a.ln2_mean, a.ln2_rstd, in, scratch_c_,
                                         p(o.ln2_w), p(o.ln2_b), N, C, s);
  linear_forward(a.fch, a.ln2, o.fc_w, o.fc_b, N, C, 4 * C);
  if (replay) return;
  cuda::gelu_forward<bf16>(a.gelu, a.fch, N * 4 * C, s);
  linear_forward(scratch_c_, a.gelu, o.fcproj_w, o.fcproj_b, N, 4 * C, C);
}

float CudaGpt2::run_forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T,
                            float loss_scale, bool backward) {
  TS_CHECK(B > 0 && T > 0 && B <= d_.max_B && T <= d_.max_T && B * T <= N_, "[cuda gpt2] batch (",
           B, ", ", T, ") exceeds the planned (", d_.max_B, ", ", d_.max_T, ")");
  TS_CHECK(tokens && targets, "[cuda gpt2] tokens and targets must be set");
  const int64_t N = B * T, C = d_.C, L = d_.L;
  int64_t count = 0;
  for (int64_t i = 0; i < N; ++i) {
    TS_CHECK(tokens[i] >= 0 && tokens[i] < d_.V, "[cuda gpt2] tokens[", i, "] = ", tokens[i],
             " is outside the vocabulary [0, ", d_.V, ")");
    TS_CHECK(targets[i] < d_.V, "[cuda gpt2] targets[", i, "] = ", targets[i],
             " is outside the vocabulary [0, ", d_.V, ")");
    count += targets[i] >= 0;
  }
  const cuda::DeviceGuard guard(device_);
  cudaStream_t s = stream_.get();
  cuda::copy_to_device_async(tokens_, tokens, static_cast<size_t>(N) * 4, s);
  cuda::copy_to_device_async(targets_, targets, static_cast<size_t>(N) * 4, s);

  cuda::embedding_forward<bf16>(resid_[0], tokens_, w16(d_.wte), w16(d_.wpe), B, T, C, d_.V, s);
  for (int64_t l = 0; l < L; ++l) block_forward(l, B, T, /*replay=*/false);
  cuda::layernorm_residual_forward<bf16>(resid_[static_cast<size_t>(L)], lnf_, lnf_mean_, lnf_rstd_,
                                         blocks_[static_cast<size_t>(L - 1)].resid_mid, scratch_c_,
                                         p(d_.lnf_w), p(d_.lnf_b), N, C, s);
  // Tied head: logits (N, Vp) = lnf wte^T.
  linear_forward(logits_, lnf_, d_.wte, -1, N, C, d_.Vp);
  const float dscale = backward && count ? loss_scale / static_cast<float>(count) : 0.0f;
  cuda::softmax_xent<bf16>(losses_, logits_, targets_, N, d_.V, d_.Vp, dscale, s);
  if (dscale != 0.0f) this->backward(B, T);
  cuda::copy_to_host_async(host_losses_.data(), losses_, static_cast<size_t>(N) * 4, s);
  stream_.synchronize();
  double sum = 0;
  for (int64_t i = 0; i < N; ++i)
    if (targets[i] >= 0) sum += host_losses_[static_cast<size_t>(i)];
  return count ? static_cast<float>(sum / static_cast<double>(count)) : 0.0f;
}

void CudaGpt2::backward(int64_t B, int64_t T) {
  cudaStream_t s = stream_.get();
  const int64_t N = B * T, C = d_.C, L = d_.L;
  // lm head: dlnf = dlogits wte; dwte += dlogits^T lnf.
  linear_backward(scratch_c_, logits_, lnf_, d_.wte, -1, N, C, d_.Vp);
  TS_CUDA_CHECK(cudaMemsetAsync(dresid_, 0, static_cast<size_t>(N * C) * 2, s));
  cuda::layernorm_backward<bf16>(dresid_, g(d_.lnf_w), g(d_.lnf_b), scratch_c_,
                                 resid_[static_cast<size_t>(L)], p(d_.lnf_w), lnf_mean_, lnf_rstd_,
                                 N, C, norm_ws_, s);
  const cuda::FlashAttentionShape shape = attn_shape(B, T);
  const cuda::AttnLayout packed = cuda::packed_qkv_layout(T, d_.H, D_);
  const cuda::AttnLayout plain = cuda::contiguous_layout(T, d_.H, D_);
  for (int64_t l = L - 1; l >= 0; --l) {
    const Gpt2BlockOffsets& o = d_.blocks[static_cast<size_t>(l)];
    const BlockActs& a = blocks_[static_cast<size_t>(l)];
    // scratch_c is free here (the previous norm backward consumed it): the replay may use it.
    if (d_.recompute == ops::Recompute::block) block_forward(l, B, T, /*replay=*/true);
    // GELU outputs: kept per block under none, else recomputed into dbig (a.gelu == dbig).
    if (d_.recompute != ops::Recompute::none) cuda::gelu_forward<bf16>(a.gelu, a.fch, N * 4 * C, s);
    // MLP branch. a.gelu may be dbig itself: the dW GEMM reads it before the dx GEMM writes dbig
    // (one stream, in order).
    linear_backward(dbig_, dresid_, a.gelu, o.fcproj_w, o.fcproj_b, N, 4 * C, C);
    cuda::gelu_backward<bf16>(dbig_, a.fch, dbig_, N * 4 * C, s);
    linear_backward(scratch_c_, dbig_, a.ln2, o.fc_w, o.fc_b, N, C, 4 * C);
    cuda::layernorm_backward<bf16>(dresid_, g(o.ln2_w), g(o.ln2_b), scratch_c_, a.resid_mid,
                                   p(o.ln2_w), a.ln2_mean, a.ln2_rstd, N, C, norm_ws_, s);
    // Attention branch: d atty into scratch_c, then dq/dk/dv packed into dbig (N, 3C).
    linear_backward(scratch_c_, dresid_, a.atty, o.proj_w, o.proj_b, N, C, C);
    cuda::FlashBackwardArgs f;
    f.shape = shape;
    f.q = {a.qkv, packed};
    f.k = {a.qkv + C, packed};
    f.v = {a.qkv + 2 * C, packed};
    f.out = {a.atty, plain};
    f.dout = {scratch_c_, plain};
    f.lse = a.lse;
    f.dq = {dbig_, packed};
    f.dk = {dbig_ + C, packed};
    f.dv = {dbig_ + 2 * C, packed};
    f.workspace = attn_ws_;
    cuda::flash_attention_backward(f, s);
    linear_backward(scratch_c_, dbig_, a.ln1, o.qkv_w, o.qkv_b, N, C, 3 * C);
    cuda::layernorm_backward<bf16>(dresid_, g(o.ln1_w), g(o.ln1_b), scratch_c_,
                                   resid_[static_cast<size_t>(l)], p(o.ln1_w), a.ln1_mean,
                                   a.ln1_rstd, N, C, norm_ws_, s);
  }
  cuda::embedding_backward<bf16>(g(d_.wte), g(d_.wpe), dresid_, tokens_, B, T, C, d_.V, s);
  // Padding rows of wte get no gradient by construction; keep them exactly zero regardless.
  if (d_.Vp > d_.V)
    TS_CUDA_CHECK(
        cudaMemsetAsync(g(d_.wte) + d_.V * C, 0, static_cast<size_t>((d_.Vp - d_.V) * C) * 4, s));
}

float CudaGpt2::forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T) {
  return run_forward(tokens, targets, B, T, 1.0f, false);
}

float CudaGpt2::forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B,
                                 int64_t T, float loss_scale) {
  return run_forward(tokens, targets, B, T, loss_scale, true);
}

double CudaGpt2::adamw_step(const std::vector<ops::AdamWRun>& runs, const ops::AdamWConfig& cfg,
                            float lr, int64_t t) {
  const cuda::DeviceGuard guard(device_);
  cudaStream_t s = stream_.get();
  const float* ptrs[] = {grads_};
  const int64_t sizes[] = {d_.n_params};
  cuda::global_sum_squares<float>(sumsq_, ptrs, sizes, 1, sumsq_ws_, s);
  double sumsq = 0;
  cuda::copy_to_host_async(&sumsq, sumsq_, sizeof(double), s);
  stream_.synchronize();
  const double norm = std::sqrt(sumsq);
  TS_CHECK(std::isfinite(norm), "[cuda gpt2] gradient norm is ", norm, " at step ", t,
           " (diverged; lower the learning rate)");
  const float scale = cfg.clip > 0 && norm > cfg.clip ? static_cast<float>(cfg.clip / norm) : 1.0f;
  for (const ops::AdamWRun& r : runs) {
    TS_CHECK(r.offset >= 0 && r.n >= 0 && r.offset + r.n <= d_.n_params, "[cuda gpt2] AdamW run [",
             r.offset, ", +", r.n, ") outside the parameters");
    ops::AdamWArgs a;
    a.lr = lr;
    a.beta1 = cfg.beta1;
    a.beta2 = cfg.beta2;
    a.eps = cfg.eps;
    a.weight_decay = r.decay ? cfg.weight_decay : 0.0f;
    a.t = t;
    a.grad_scale = scale;
    cuda::adamw<float>(params_ + r.offset, params16_ + r.offset, grads_ + r.offset, m_ + r.offset,
                       v_ + r.offset, r.n, a, s);
  }
  return norm;
}

}  // namespace

std::unique_ptr<DeviceGpt2> make_cuda_gpt2(const Gpt2DeviceDesc& desc, int device) {
  cuda::require_device(device, "the CUDA GPT-2 step");
  return std::make_unique<CudaGpt2>(desc, device);
}

}  // namespace tessera::backend
