// Comparing two float arrays for the tests.
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

}  // namespace tessera::test
