// One product of a grouped matmul against stored-type weights (the q/k/v or gate/up projections
// of one layer share their input): the argument block shared by the CPU kernels and ops/.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace tessera::cpu {

// y (M,N) = x (M,K) W^T [+ bias (N)] for the group's shared x; W (N,K) stored as w_type.
struct WtProduct {
  float* y = nullptr;
  int64_t ldy = 0;  // row stride of y (>= N)
  const void* w = nullptr;
  DType w_type = DType::f32;
  int64_t N = 0;
  const float* bias = nullptr;  // optional
};

}  // namespace tessera::cpu
