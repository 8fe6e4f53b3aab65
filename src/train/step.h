// One optimizer step of the training model: what `tessera train` runs each step and what
// `bench train` times, one function for both.
#pragma once

#include <cstdint>
#include <functional>

#include "model/train_model.h"
#include "train/optimizer.h"

namespace tessera::train {

struct StepResult {
  double loss = 0;       // the micro-batches' mean loss
  double grad_norm = 0;  // before clipping
};

// Gradients zeroed, `grad_accum` micro-batches (inputs and targets (B,T), each filled by
// next_batch) through forward and backward with the loss scaled by 1/grad_accum, then AdamW at
// `lr` for step t (1-based, in the "optimizer" scope) and the bf16 copy refreshed. Throws naming
// step t when the loss is not finite (the optimizer is then not run).
StepResult train_step(model::TrainModel& m, AdamW& opt, int64_t B, int64_t T, int64_t grad_accum,
                      double lr, int64_t t,
                      const std::function<void(int32_t* inputs, int32_t* targets)>& next_batch,
                      int32_t* inputs, int32_t* targets);

}  // namespace tessera::train
