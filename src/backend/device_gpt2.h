// GPT-2 training on an accelerator: f32 master parameters, their bf16 copy, f32 gradients, AdamW
// state and bf16 activations all in device memory; a step is forward, backward and AdamW as
// launches on one stream. The description is plain data (tensor offsets into the flat parameter
// buffer that model::Gpt2 lays out), so the backend stays below model/. Implemented by
// backend/cuda; backend/no_cuda's factory says the build has no CUDA.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace tessera::backend {

// Element offsets of one block's tensors in the flat parameter (and gradient) buffer.
struct Gpt2BlockOffsets {
  int64_t ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fcproj_w, fcproj_b;
};

// Which activations the device keeps for backward (model::Recompute's twin: backend/ sits below
// model/). none: every block's; gelu: every block's but the GELU outputs, recomputed in backward
// from the saved c_fc outputs; block: only each block's input (the residual stream), the block
// replayed up to c_fc in backward into one shared set.
enum class DeviceRecompute : uint8_t { none, gelu, block };

struct Gpt2DeviceDesc {
  int64_t L = 0, H = 0, C = 0, V = 0, Vp = 0, max_seq = 0;
  int64_t max_B = 0, max_T = 0;  // activations are sized for (max_B, max_T)
  DeviceRecompute recompute = DeviceRecompute::none;
  int64_t n_params = 0;  // elements of the flat buffer (alignment gaps included)
  int64_t wte = 0, wpe = 0, lnf_w = 0, lnf_b = 0;
  std::vector<Gpt2BlockOffsets> blocks;
};

// A contiguous range of the flat buffer with one weight-decay setting (train::AdamW's runs).
struct AdamRun {
  int64_t offset = 0, n = 0;
  bool decay = false;
};

struct AdamStep {
  float lr = 0, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
  float clip = 1.0f;  // max global gradient norm; 0 disables clipping
  int64_t t = 1;      // step, from 1
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
  // Clips the gradients to s.clip by global norm and applies AdamW to every run. Returns the
  // norm before clipping; throws (leaving the parameters unchanged) when it is not finite.
  virtual double adamw_step(const std::vector<AdamRun>& runs, const AdamStep& s) = 0;
  virtual int64_t device_bytes() const = 0;
};

// Allocates everything on CUDA device `device` (parameters zero until upload_params). Throws
// Error naming what it cannot take (head dim other than 64 or 128, sizes) or saying the build
// has no CUDA or the machine no device.
std::unique_ptr<DeviceGpt2> make_cuda_gpt2(const Gpt2DeviceDesc& desc, int device = 0);

}  // namespace tessera::backend
