// The observer lent to a wrapped command (apps/cli/profiling.h).
#include "apps/cli/profiling.h"

namespace tessera::cli {

namespace {
ops::OpObserver* g_lent = nullptr;
}

ops::OpObserver* wrapped_observer() {
  return g_lent;
}

LendObserver::LendObserver(ops::OpObserver* o) {
  g_lent = o;
}

LendObserver::~LendObserver() {
  g_lent = nullptr;
}

}  // namespace tessera::cli
