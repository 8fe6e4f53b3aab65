// RoPE cos/sin tables: host math shared by every backend (built once per model and context).
#include <cmath>
#include <vector>

#include "core/error.h"
#include "ops/ops.h"

namespace tessera::ops {

RopeTable make_rope_table(int64_t max_pos, int64_t rotary_dim, double theta) {
  TS_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0, "[rope] rotary_dim=", rotary_dim,
           " must be positive and even");
  TS_CHECK(theta > 0 && std::isfinite(theta), "[rope] theta=", theta, " must be positive");
  std::vector<double> inv_freqs(static_cast<size_t>(rotary_dim / 2));
  for (size_t i = 0; i < inv_freqs.size(); ++i)
    inv_freqs[i] = std::pow(theta, -2.0 * static_cast<double>(i) / rotary_dim);
  RopeTable t = make_rope_table(max_pos, inv_freqs);
  t.theta = theta;
  return t;
}

RopeTable make_rope_table(int64_t max_pos, const std::vector<double>& inv_freqs, double scale) {
  TS_CHECK(!inv_freqs.empty(), "[rope] no frequencies");
  TS_CHECK(std::isfinite(scale) && scale > 0, "[rope] scale=", scale, " must be positive");
  TS_CHECK(max_pos >= 0, "[rope] max_pos=", max_pos, " must be >= 0");
  for (double f : inv_freqs)
    TS_CHECK(std::isfinite(f) && f > 0, "[rope] inverse frequency ", f, " must be positive");
  const auto half = static_cast<int64_t>(inv_freqs.size());
  RopeTable t;
  t.max_pos = max_pos;
  t.rotary_dim = 2 * half;
  t.inv_freq = inv_freqs;
  t.scale = scale;
  t.cos.resize(static_cast<size_t>(max_pos * half));
  t.sin.resize(t.cos.size());
  // Angles in double: in f32, pos * inv_freq would lose ~pos * 2^-24 radians (0.006 at 10^5).
  for (int64_t i = 0; i < half; ++i) {
    const double inv_freq = inv_freqs[static_cast<size_t>(i)];
    for (int64_t p = 0; p < max_pos; ++p) {
      const double angle = static_cast<double>(p) * inv_freq;
      t.cos[static_cast<size_t>(p * half + i)] = static_cast<float>(scale * std::cos(angle));
      t.sin[static_cast<size_t>(p * half + i)] = static_cast<float>(scale * std::sin(angle));
    }
  }
  return t;
}

}  // namespace tessera::ops
