// Training checkpoints: <out>/checkpoint.safetensors holds params, adam_m and adam_v as flat f32
// tensors plus metadata (step, loader position, rng, early-stopping state, model config and the
// run options as JSON). Written atomically; read back with every field validated.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "model/train_model.h"
#include "train/data.h"
#include "train/optimizer.h"

namespace tessera::train {

struct TrainState {
  int64_t step = 0;  // optimizer steps completed
  LoaderPosition loader;
  uint64_t rng[4] = {0, 0, 0, 0};
  double best_val = 0;    // meaningful when evals > 0
  int64_t evals = 0;      // scheduled evaluations so far (counted for early stopping)
  int64_t bad_evals = 0;  // consecutive scheduled evaluations without improvement
  bool early_stopped = false;
};

std::string checkpoint_path(const std::string& dir);  // <dir>/checkpoint.safetensors

void save_checkpoint(const std::string& dir, const model::TrainModel& m, const AdamW& opt,
                     const TrainState& st, const std::string& options_json);

// Reads only the metadata: the run options JSON and the model config. Throws naming the file.
struct CheckpointInfo {
  std::string options_json;
  model::TrainConfig config;
};
CheckpointInfo read_checkpoint_info(const std::string& dir);

// Restores params (then calls params_updated()), m, v and the state. The model and optimizer must
// have the checkpoint's layout; throws naming the file and the tensor or field otherwise.
TrainState load_checkpoint(const std::string& dir, model::TrainModel& m, AdamW& opt);

// Builds a model from a checkpoint's config and params alone (for `sample` without model/).
std::unique_ptr<model::TrainModel> load_model_from_checkpoint(const std::string& dir,
                                                              const ops::Context& ctx);

}  // namespace tessera::train
