// The bf16 conversions over the thread pool: f32 -> bf16 (round to nearest even), bf16 -> f32,
// and f32 rounded to bf16 in place.
#include <cstdint>

#include "backend/cpu/cpu_kernels.h"
#include "core/dtype.h"

namespace tessera::cpu {

// dst (n) = f32_to_bf16(src (n)). The scalar conversion is a few integer ops that the compiler
// vectorizes; the op is memory bound, so threads matter more than SIMD width here. Results are
// identical to core/dtype.h (same function), including NaN quieting.
void convert_f32_to_bf16(ThreadPool& pool, uint16_t* dst, const float* src, int64_t n) {
  constexpr int64_t kGrain = 1 << 16;  // 256 KiB of input per chunk: amortizes the hand-off
  pool.parallel_for(n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) dst[i] = f32_to_bf16(src[i]);
  });
}

void convert_bf16_to_f32(ThreadPool& pool, float* dst, const uint16_t* src, int64_t n) {
  constexpr int64_t kGrain = 1 << 16;
  pool.parallel_for(n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) dst[i] = bf16_to_f32(src[i]);
  });
}

// x (n) = bf16_to_f32(f32_to_bf16(x)); keep (n) = the bits, unless null. Two loops, so that each
// vectorizes without a branch inside.
void round_to_bf16(ThreadPool& pool, float* x, uint16_t* keep, int64_t n) {
  constexpr int64_t kGrain = 1 << 16;
  pool.parallel_for(n, kGrain, [&](int64_t begin, int64_t end) {
    if (keep != nullptr) {
      for (int64_t i = begin; i < end; ++i) {
        keep[i] = f32_to_bf16(x[i]);
        x[i] = bf16_to_f32(keep[i]);
      }
    } else {
      for (int64_t i = begin; i < end; ++i) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
    }
  });
}

}  // namespace tessera::cpu
