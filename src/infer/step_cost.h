// What an engine step costs, learned from the steps themselves: a line through (work, seconds)
// with older steps forgotten geometrically, so the scheduler can bound how much a long prompt's
// chunk slows the streams decoding beside it on any machine without a table of its speeds.
// Work is counted in row units: a row at position p costs 1 + p / attention_scale, where
// attention_scale is the model's weight FLOPs per token over its attention FLOPs per key (a row
// deep into a long context pays for attention over every key before it).
#pragma once

#include <cstdint>

#include "model/decoder.h"

namespace tessera::infer {

class StepCostFit {
 public:
  // decay: the weight each older step keeps per new one (0.95: about the last 20 steps count).
  explicit StepCostFit(double decay = 0.95) : decay_(decay) {}
  void add(double units, double seconds);
  // A fit exists once enough steps of different sizes were seen, with a positive cost per unit
  // and a non-negative fixed cost.
  bool valid() const;
  double fixed_seconds() const;  // a step's cost whatever its rows (weights read, call overheads)
  double seconds_per_unit() const;

 private:
  double decay_;
  double n_ = 0, sx_ = 0, sy_ = 0, sxx_ = 0, sxy_ = 0;
  int64_t steps_ = 0;
};

// The model's weight FLOPs per token over its attention FLOPs per cached key (both per layer
// summed): how many keys of attention cost as much as one row's products.
double attention_scale(const model::DecoderConfig& c);
// Row units of `rows` consecutive rows at positions pos0 .. pos0 + rows - 1.
double row_units(int64_t pos0, int64_t rows, double scale);

}  // namespace tessera::infer
