// cpu::convert_f32_to_bf16: round-to-nearest-even f32 -> bf16 over the thread pool.
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

}  // namespace tessera::cpu
