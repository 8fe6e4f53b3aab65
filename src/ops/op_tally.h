// An OpObserver that sums what it observes per op: calls, wall time, FLOPs and bytes. Put one in
// a context (ops::Context::observer) for the calls to profile, then read totals(): the share of
// a run each op took, and where each sits against the machine's compute and memory roofs.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "ops/observe.h"

namespace tessera::ops {

struct OpTotal {
  std::string op;
  int64_t calls = 0;
  double seconds = 0, flops = 0, bytes = 0;
};

class OpTally final : public OpObserver {
 public:
  void on_op(const OpRecord& r) override;
  // Per op, largest time first (ties by name).
  std::vector<OpTotal> totals() const;
  void reset();

 private:
  mutable std::mutex mu_;  // ops may be called from several threads of one program
  std::vector<OpTotal> by_op_;
};

}  // namespace tessera::ops
