// AdamW runs, global-norm clipping and the per-run update.
#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/train_model.h"
#include "ops/ops.h"

namespace tessera::train {

AdamW::AdamW(const TensorTable& table, const AdamWConfig& cfg, const ops::Context& ctx)
    : cfg_(cfg),
      ctx_(ctx),
      n_(table.total_elems()),
      m_(ctx.device, static_cast<size_t>(n_) * sizeof(float)),
      v_(ctx.device, static_cast<size_t>(n_) * sizeof(float)) {
  ops::zero(ctx_, m_.data(), m_.size());
  ops::zero(ctx_, v_.data(), v_.size());
  TS_CHECK(cfg.beta1 >= 0 && cfg.beta1 < 1, "AdamW beta1 must be in [0, 1), got ", cfg.beta1);
  TS_CHECK(cfg.beta2 >= 0 && cfg.beta2 < 1, "AdamW beta2 must be in [0, 1), got ", cfg.beta2);
  TS_CHECK(cfg.eps > 0, "AdamW eps must be positive, got ", cfg.eps);
  TS_CHECK(cfg.weight_decay >= 0, "AdamW weight_decay must be >= 0, got ", cfg.weight_decay);
  TS_CHECK(cfg.clip >= 0, "AdamW clip must be >= 0, got ", cfg.clip);
  std::vector<const TensorInfo*> ts;
  for (const auto& t : table.tensors()) ts.push_back(&t);
  std::sort(ts.begin(), ts.end(), [](auto a, auto b) { return a->offset < b->offset; });
  for (size_t i = 0; i < ts.size(); ++i) {
    const int64_t begin = ts[i]->offset;
    const int64_t end = i + 1 < ts.size() ? ts[i + 1]->offset : n_;
    const bool decay = model::TrainModel::decays(*ts[i]);
    if (!runs_.empty() && runs_.back().decay == decay &&
        runs_.back().offset + runs_.back().n == begin) {
      runs_.back().n += end - begin;
    } else {
      runs_.push_back({begin, end - begin, decay});
    }
  }
}

double AdamW::step(float* params, const float* grads, double lr, int64_t t) {
  TS_CHECK(t >= 1, "AdamW step must count from 1, got ", t);
  const double norm = std::sqrt(ops::sum_squares(ctx_, grads, n_));
  TS_CHECK(std::isfinite(norm), "[train] gradient norm is not finite at step ", t,
           " (training diverged: lower the learning rate (lr) or raise the warm-up (warmup))");
  ops::AdamWArgs a;
  a.lr = static_cast<float>(lr);
  a.beta1 = cfg_.beta1;
  a.beta2 = cfg_.beta2;
  a.eps = cfg_.eps;
  a.t = t;
  a.grad_scale = cfg_.clip > 0 && norm > cfg_.clip ? static_cast<float>(cfg_.clip / norm) : 1.0f;
  for (const AdamWRun& r : runs_) {
    a.weight_decay = r.decay ? cfg_.weight_decay : 0.0f;
    ops::adamw(ctx_, params + r.offset, grads + r.offset, m() + r.offset, v() + r.offset, r.n, a);
  }
  return norm;
}

}  // namespace tessera::train
