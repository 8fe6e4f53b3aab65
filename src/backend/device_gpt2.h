// GPT-2 training on an accelerator: f32 master parameters, their bf16 copy, f32 gradients, AdamW
// state and bf16 activations all in device memory; a step is forward, backward and AdamW as
// launches on one stream. The description is plain data (tensor offsets into the flat parameter
// buffer that model::TrainModel lays out), so the backend stays below model/. Implemented by
// backend/cuda; backend/no_cuda's factory says the build has no CUDA.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ops/ops.h"

namespace tessera::backend {

// Element offsets of one block's tensors in the flat parameter (and gradient) buffer.
struct Gpt2BlockOffsets {
  int64_t ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
};

struct Gpt2DeviceDesc {
  int64_t L = 0, H = 0, C = 0, V = 0, Vp = 0, max_seq = 0;
  int64_t max_B = 0, max_T = 0;                     // activations are sized for (max_B, max_T)
  ops::Recompute recompute = ops::Recompute::none;  // which activations it keeps for backward
  int64_t n_params = 0;  // elements of the flat buffer (alignment gaps included)
  int64_t wte = 0, wpe = 0, lnf_w = 0, lnf_b = 0;
  std::vector<Gpt2BlockOffsets> blocks;
};

class DeviceGpt2 {
 public:
  virtual ~DeviceGpt2() = default;
  // Host <-> device copies of the flat buffers (n_params floats each).
  virtual void upload_params(const float* params) = 0;
  virtual void download_params(float* params) const = 0;
  virtual void download_grads(float* grads) const = 0;
  virtual void upload_adam(const float* m, const float* v) = 0;
  virtual void download_adam(float* m, float* v) const = 0;
  virtual void zero_grads() = 0;
  // tokens, targets (B*T) host arrays, targets < 0 ignored. forward returns the mean loss;
  // forward_backward also accumulates d(mean loss * loss_scale) into the gradients.
  virtual float forward(const int32_t* tokens, const int32_t* targets, int64_t B, int64_t T) = 0;
  virtual float forward_backward(const int32_t* tokens, const int32_t* targets, int64_t B,
                                 int64_t T, float loss_scale) = 0;
  // Clips the gradients to cfg.clip by global norm and applies AdamW with learning rate lr at
  // step t (from 1) to every run. Returns the norm before clipping; throws (leaving the
  // parameters unchanged) when it is not finite.
  virtual double adamw_step(const std::vector<ops::AdamWRun>& runs, const ops::AdamWConfig& cfg,
                            float lr, int64_t t) = 0;
  virtual int64_t device_bytes() const = 0;
};

// Allocates everything on CUDA device `device` (parameters zero until upload_params). Throws
// Error naming what it cannot take (head dim other than 64 or 128, sizes) or saying the build
// has no CUDA or the machine no device.
std::unique_ptr<DeviceGpt2> make_cuda_gpt2(const Gpt2DeviceDesc& desc, int device = 0);

}  // namespace tessera::backend
