// LR schedules: linear warmup, cosine endpoints and midpoint, one-cycle shape.
#include "train/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"

namespace tessera::train {
namespace {

// Schedules are evaluated in double; 1e-12 relative covers the few roundings in cos and the
// divisions (each ~1e-16) with a wide margin while still catching any formula error.
constexpr double kRel = 1e-12;

TEST(LrSchedule, WarmupIsLinearThenCosineEndpoints) {
  LrSchedule s;
  s.kind = ScheduleKind::cosine;
  s.max_lr = 1e-3;
  s.min_lr_fraction = 0.1;
  s.warmup_steps = 10;
  s.total_steps = 110;
  for (int64_t i = 0; i < 10; ++i) EXPECT_NEAR(s.at(i), 1e-3 * (i + 1) / 10, 1e-3 * kRel);
  EXPECT_NEAR(s.at(10), 1e-3, 1e-3 * kRel);     // decay starts at max
  EXPECT_NEAR(s.at(60), 0.55e-3, 1e-3 * kRel);  // halfway: (max + min) / 2
  EXPECT_NEAR(s.at(110), 1e-4, 1e-3 * kRel);    // ends at min
  EXPECT_NEAR(s.at(500), 1e-4, 1e-3 * kRel);    // stays there past the end
  for (int64_t i = 11; i <= 110; ++i) EXPECT_LE(s.at(i), s.at(i - 1)) << i;
}

TEST(LrSchedule, ConstantAfterWarmup) {
  LrSchedule s;
  s.kind = ScheduleKind::constant;
  s.max_lr = 2e-3;
  s.warmup_steps = 4;
  s.total_steps = 100;
  EXPECT_NEAR(s.at(0), 0.5e-3, 2e-3 * kRel);
  EXPECT_EQ(s.at(4), 2e-3);
  EXPECT_EQ(s.at(99), 2e-3);
}

TEST(LrSchedule, OneCycleRisesThenFalls) {
  LrSchedule s;
  s.kind = ScheduleKind::onecycle;
  s.max_lr = 1e-2;
  s.total_steps = 100;  // 30 steps up, 70 down
  EXPECT_NEAR(s.at(0), 1e-2 / 25, 1e-2 * kRel);
  EXPECT_NEAR(s.at(30), 1e-2, 1e-2 * kRel);
  EXPECT_NEAR(s.at(100), 1e-6, 1e-2 * kRel);
  for (int64_t i = 1; i <= 30; ++i) EXPECT_GT(s.at(i), s.at(i - 1)) << i;
  for (int64_t i = 31; i <= 100; ++i) EXPECT_LT(s.at(i), s.at(i - 1)) << i;
}

TEST(LrSchedule, UnknownNameThrows) {
  EXPECT_EQ(parse_schedule("cosine"), ScheduleKind::cosine);
  EXPECT_THROW(parse_schedule("linear-ish"), Error);
}

}  // namespace
}  // namespace tessera::train
