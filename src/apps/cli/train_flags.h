// Parsing of `tessera train` flags into run options (shared by the command and its tests).
#pragma once

#include "apps/cli/args.h"
#include "train/options.h"

namespace tessera::cli {

// Parses train flags into options; *resume tells whether --resume was given. With --resume the
// run's options come from its checkpoint and only --steps, --stop-at, --threads, --log-every and
// --quiet may be given.
train::TrainOptions parse_train_options(Args& a, bool* resume);

}  // namespace tessera::cli
