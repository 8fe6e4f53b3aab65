// Schedule formulas. One-cycle follows Smith: warm up from max/25 to max over the first 30% (or
// the given warmup), then cosine down to max/1e4.
#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tessera::train {

ScheduleKind parse_schedule(const std::string& s, const std::string& what) {
  if (s == "constant") return ScheduleKind::constant;
  if (s == "cosine") return ScheduleKind::cosine;
  if (s == "onecycle" || s == "one-cycle") return ScheduleKind::onecycle;
  fail(what, " must be constant, cosine or onecycle, got '", s, "'");
}

double LrSchedule::at(int64_t step) const {
  constexpr double kPi = 3.14159265358979323846;
  const int64_t total = std::max<int64_t>(total_steps, 1);
  switch (kind) {
    case ScheduleKind::constant:
      if (warmup_steps > 0 && step < warmup_steps) return max_lr * (step + 1) / warmup_steps;
      return max_lr;
    case ScheduleKind::cosine: {
      if (warmup_steps > 0 && step < warmup_steps) return max_lr * (step + 1) / warmup_steps;
      const double min_lr = max_lr * min_lr_fraction;
      const int64_t span = std::max<int64_t>(total - warmup_steps, 1);
      const double p = std::clamp(static_cast<double>(step - warmup_steps) / span, 0.0, 1.0);
      return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + std::cos(kPi * p));
    }
    case ScheduleKind::onecycle: {
      const int64_t up = warmup_steps > 0 ? warmup_steps : std::max<int64_t>(total * 3 / 10, 1);
      const double start = max_lr / 25.0, end = max_lr / 1e4;
      if (step < up) {
        const double p = static_cast<double>(step) / up;
        return start + (max_lr - start) * 0.5 * (1.0 - std::cos(kPi * p));
      }
      const int64_t span = std::max<int64_t>(total - up, 1);
      const double p = std::clamp(static_cast<double>(step - up) / span, 0.0, 1.0);
      return end + (max_lr - end) * 0.5 * (1.0 + std::cos(kPi * p));
    }
  }
  return max_lr;
}

}  // namespace tessera::train
