// `tessera plan`'s two halves share the device it plans for; --train plans a GPT-2 training
// step (plan_train.cc), the rest an inference run (cmd_plan.cc).
#pragma once

#include <optional>
#include <string>

#include "apps/cli/args.h"
#include "profile/gpu_specs.h"

namespace tessera::cli {

// --device: nullopt for cpu, else a GPU from the datasheet table or a spec .json; throws naming
// the flag, or the file and field.
std::optional<profile::GpuSpec> plan_device(const std::string& device);

// `tessera plan --train ...`.
int run_train_plan(const Args& a, const std::optional<profile::GpuSpec>& gpu, int threads,
                   double baseline_bytes);

}  // namespace tessera::cli
