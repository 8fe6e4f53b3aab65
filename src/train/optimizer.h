// AdamW over the model's flat parameter buffer: m and v share the parameter layout, weight decay
// applies per tensor (TrainModel::decays), and the global gradient norm is clipped before the
// update.
#pragma once

#include <cstdint>
#include <vector>

#include "core/arena.h"
#include "core/tensor.h"
#include "ops/context.h"
#include "ops/memory.h"
#include "ops/ops.h"

namespace tessera::train {

// A training run's AdamW settings; each step adds its learning rate, step count and clipping
// scale (ops::AdamWArgs).
struct AdamWConfig {
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.1f;
  float clip = 1.0f;  // max global gradient norm; 0 disables clipping
};
// A contiguous range of a flat parameter buffer with one weight-decay setting.
struct AdamWRun {
  int64_t offset = 0, n = 0;
  bool decay = false;
};

class AdamW {
 public:
  // Groups the table's tensors into contiguous runs with the same decay flag, so a step is a few
  // ops::adamw calls rather than one per tensor. Alignment gaps join the run before them (their
  // params and grads are zero and stay zero).
  AdamW(const TensorTable& table, const AdamWConfig& cfg, const ops::Context& ctx);

  // One update with learning rate lr at step t (1-based). Returns the gradient norm measured
  // before clipping; grads are scaled by min(1, clip / norm). Throws on a non-finite norm.
  double step(float* params, const float* grads, double lr, int64_t t);

  // The moments, in the memory of the context's device (ops::HostMirror from the host).
  float* m() { return m_.as<float>(); }
  float* v() { return v_.as<float>(); }
  const float* m() const { return m_.as<float>(); }
  const float* v() const { return v_.as<float>(); }
  const ops::Context& context() const { return ctx_; }
  int64_t size() const { return n_; }
  const AdamWConfig& config() const { return cfg_; }

  const std::vector<AdamWRun>& runs() const { return runs_; }

 private:
  AdamWConfig cfg_;
  ops::Context ctx_;
  int64_t n_;
  ops::Buffer m_, v_;  // on the context's device
  std::vector<AdamWRun> runs_;
};

}  // namespace tessera::train
