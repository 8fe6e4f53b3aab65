// The observer `tessera profile` lends the command it wraps: each command that builds an
// ops::Context (through engine_options, the trainer's options, ...) puts wrapped_observer() in
// it. Set only by `profile` around the one command it runs, before that command starts any
// thread; null otherwise, so commands run unobserved.
#pragma once

#include "ops/observe.h"

namespace tessera::cli {

ops::OpObserver* wrapped_observer();

// Lends `o` for its lifetime to the command run inside it.
class LendObserver {
 public:
  explicit LendObserver(ops::OpObserver* o);
  ~LendObserver();
  LendObserver(const LendObserver&) = delete;
  LendObserver& operator=(const LendObserver&) = delete;
};

}  // namespace tessera::cli
