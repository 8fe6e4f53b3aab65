// Comparing float arrays, and gradients with central differences, for the tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace tessera::test {

// max |a - b| over max |b|: a relative error that a few large values set, as logits compare.
inline double max_rel_diff(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num = std::max(num, std::fabs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::fabs(static_cast<double>(b[i])));
  }
  return num / den;
}

// (f() with p + h - f() with p - h) / 2h: f's central difference in the parameter p, which is
// left as it was.
template <typename F>
double central_difference(float& p, float h, F&& f) {
  const float keep = p;
  p = keep + h;
  const double up = f();
  p = keep - h;
  const double down = f();
  p = keep;
  return (up - down) / (2.0 * h);
}

}  // namespace tessera::test
