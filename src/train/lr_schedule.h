// Learning-rate schedules: constant, linear warmup + cosine decay, and one-cycle.
#pragma once

#include <cstdint>
#include <string>

namespace tessera::train {

enum class ScheduleKind { constant, cosine, onecycle };
// Throws naming the schedule as `what` (a command line: its flag) on an unknown name.
ScheduleKind parse_schedule(const std::string& s, const std::string& what = "schedule");

struct LrSchedule {
  ScheduleKind kind = ScheduleKind::cosine;
  double max_lr = 6e-4;
  double min_lr_fraction = 0.1;  // cosine decays to max_lr * this
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  // Learning rate for optimizer step `step` (0-based).
  double at(int64_t step) const;
};

}  // namespace tessera::train
