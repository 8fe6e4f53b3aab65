// A decayed least-squares line through the steps' (row units, seconds).
#include "infer/step_cost.h"

namespace tessera::infer {

void StepCostFit::add(double units, double seconds) {
  n_ = n_ * decay_ + 1;
  sx_ = sx_ * decay_ + units;
  sy_ = sy_ * decay_ + seconds;
  sxx_ = sxx_ * decay_ + units * units;
  sxy_ = sxy_ * decay_ + units * seconds;
  ++steps_;
}

bool StepCostFit::valid() const {
  // Eight steps at least, and sizes that differ: a spread (variance of units) of at least one
  // row unit, else the slope is noise.
  if (steps_ < 8 || n_ <= 0) return false;
  const double var = sxx_ / n_ - (sx_ / n_) * (sx_ / n_);
  return var >= 1.0 && seconds_per_unit() > 0 && fixed_seconds() >= 0;
}

double StepCostFit::seconds_per_unit() const {
  const double d = n_ * sxx_ - sx_ * sx_;
  return d > 0 ? (n_ * sxy_ - sx_ * sy_) / d : 0;
}

double StepCostFit::fixed_seconds() const {
  return n_ > 0 ? (sy_ - seconds_per_unit() * sx_) / n_ : 0;
}

double attention_scale(const model::DecoderConfig& c) {
  // Per layer and token: 2 FLOPs per weight of q, k, v, o and the MLP's matrices; per key:
  // q.k and p.v, 2 FLOPs each per query dimension.
  const double mlp_matrices = c.arch == model::DecoderArch::llama ? 3 : 2;
  const double weights =
      static_cast<double>(c.d_model) * (2.0 * c.q_dim() + 2.0 * c.kv_dim() + mlp_matrices * c.d_ff);
  return 2.0 * weights / (4.0 * static_cast<double>(c.q_dim()));
}

double row_units(int64_t pos0, int64_t rows, double scale) {
  if (rows <= 0) return 0;
  const double r = static_cast<double>(rows);
  const double mean_pos = static_cast<double>(pos0) + (r - 1) / 2;
  return r * (1 + mean_pos / scale);
}

}  // namespace tessera::infer
