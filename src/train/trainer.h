// The training loop: gradient accumulation, clipping, LR schedule, AdamW, periodic validation
// with early stopping, checkpoints, CSV log, loss plot and the final HF-layout model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/train_model.h"
#include "train/checkpoint.h"
#include "train/data.h"
#include "train/lr_schedule.h"
#include "train/optimizer.h"
#include "train/options.h"

namespace tessera::train {

struct TrainResult {
  int64_t steps_done = 0;  // total optimizer steps after this run
  double last_loss = 0;    // training loss of the last step run (NaN if none ran)
  double last_val = 0;     // validation loss at the end
  double best_val = 0;
  bool early_stopped = false;
  double joules = -1;          // energy this run used (RAPL / NVML); -1: not readable here
  int64_t tokens_trained = 0;  // tokens this run's steps trained on (a resumed run: its own)
};

class Trainer {
 public:
  // Loads the data, builds (or loads, with init_from) the model and optimizer. With resume, the
  // model config, params, AdamW state, step, loader position and early-stopping state come from
  // <out_dir>/checkpoint.safetensors; opts.steps is the new total, so the cosine schedule is
  // stretched (or shortened) to end at it from the resumed step on. Errors name options as
  // `namer` calls them (validate_options; null: their run.json names).
  Trainer(const TrainOptions& opts, bool resume, OptionNamer namer = nullptr);
  ~Trainer();

  TrainResult run();
  // Mean validation loss over the fixed windows (min(eval_batches, windows/B rounded up) batches).
  double evaluate();

  model::TrainModel& model() { return *model_; }
  const TrainState& state() const { return st_; }
  const TrainOptions& options() const { return opts_; }

 private:
  void write_csv_row(int64_t step, double loss, double val, double lr, double tps, double gflops,
                     double norm, double elapsed);
  void finish_outputs(bool finished);  // finished: write model/ too

  TrainOptions opts_;
  std::unique_ptr<ThreadPool> pool_;  // threads > 0; otherwise the context's default pool
  TokenData train_data_, val_data_;
  std::unique_ptr<model::TrainModel> model_;
  std::unique_ptr<AdamW> opt_;
  std::unique_ptr<BatchLoader> loader_;
  std::unique_ptr<ValLoader> val_loader_;
  LrSchedule sched_;
  TrainState st_;
  std::vector<int32_t> inputs_, targets_;
};

// Options to resume the run in DIR: the run options stored in DIR's checkpoint with out_dir = DIR.
TrainOptions resume_options(const std::string& dir);

}  // namespace tessera::train
