// Parsing of `tessera train` flags into run options (shared by the command and its tests).
#pragma once

#include <string>
#include <string_view>

#include "apps/cli/args.h"
#include "train/options.h"

namespace tessera::cli {

// Flags that define a run; with --resume they come from the checkpoint and may not be given:
// the model and data (train_model_flags) and the step with its schedule (train_step_flags).
Flags train_run_flags();
Flags train_model_flags();
// With o's values as the defaults (finetune's differ from train's).
Flags train_step_flags(const train::TrainOptions& o = {});
// Flags of one session of a run: --resume and those that may change on it.
Flags train_session_flags(const train::TrainOptions& o = {});
// The whole table of `tessera train`.
Flags train_flags();

// The flag that sets a TrainOptions field, by the field's name in run.json ("grad_accum" ->
// "--grad-accum"): how train::validate_options names options for train and finetune.
std::string train_flag_of(std::string_view field);

// Parses train flags into options; *resume tells whether --resume was given. With --resume the
// run's options come from its checkpoint and only the session flags may be given.
train::TrainOptions parse_train_options(const Args& a, bool* resume);
// The flags of the step and its schedule (--batch ... --seed) into o.
void parse_step_options(const Args& a, train::TrainOptions& o);
// The session flags into o (on a resumed run only those given), then validates o.
void parse_session_options(const Args& a, bool resume, train::TrainOptions& o);
// A run on cuda shows its MFU against the GPU's dense bf16 tensor peak (the CPU's probed peak is
// the trainer's own default): sets o.peak_gflops unless the run is quiet.
void set_device_peak(train::TrainOptions& o);

}  // namespace tessera::cli
