// The training step.
#include "train/step.h"

#include <cmath>

#include "core/error.h"
#include "ops/observe.h"

namespace tessera::train {

StepResult train_step(model::TrainModel& m, AdamW& opt, int64_t B, int64_t T, int64_t grad_accum,
                      double lr, int64_t t,
                      const std::function<void(int32_t* inputs, int32_t* targets)>& next_batch,
                      int32_t* inputs, int32_t* targets) {
  StepResult r;
  const double inv_ga = 1.0 / static_cast<double>(grad_accum);
  m.zero_grads();
  for (int64_t micro = 0; micro < grad_accum; ++micro) {
    next_batch(inputs, targets);
    r.loss += m.forward_backward(inputs, targets, B, T, static_cast<float>(inv_ga));
  }
  r.loss *= inv_ga;
  TS_CHECK(std::isfinite(r.loss), "[train] loss is not finite at step ", t,
           " (training diverged: lower the learning rate (lr) or raise the warm-up (warmup))");
  const ops::Scope scope(opt.context(), "optimizer");
  r.grad_norm = opt.step(m.params(), m.grads(), lr, t);
  m.params_updated();
  return r;
}

}  // namespace tessera::train
