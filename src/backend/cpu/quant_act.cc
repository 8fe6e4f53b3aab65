// On-the-fly 8-bit quantization of activation rows for the quantized matmul, and the bf16
// rounding of activation rows for products against bf16 weights.
#include "backend/cpu/quant_act.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"

namespace tessera::cpu {

QuantizedActs act_buffer(int64_t M, int64_t K, int64_t block) {
  TS_CHECK(block > 0 && K % block == 0 && block % 32 == 0, "[matmul_wt] K=", K,
           " is not a multiple of the activation block ", block);
  // One 64-byte aligned region per array; sized in int64 units to keep that alignment.
  auto words = [](int64_t bytes) { return (bytes + 63) / 64 * 8; };
  const int64_t wq = words(M * K * 2), wd = words(M * (K / block) * 4),
                ws = words(M * (K / 32) * 4);
  thread_local std::vector<int64_t> storage;
  const size_t need = static_cast<size_t>(wq + wd + ws + 8);
  if (storage.size() < need) storage.resize(need);
  auto* base = reinterpret_cast<char*>(storage.data());
  base += (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64;
  QuantizedActs qa;
  qa.M = M, qa.K = K, qa.block = block;
  qa.q = reinterpret_cast<int16_t*>(base);
  qa.d = reinterpret_cast<float*>(base + wq * 8);
  qa.sum32 = reinterpret_cast<int32_t*>(base + (wq + wd) * 8);
  return qa;
}

ActsQ8 acts_q8_buffer(int64_t M, int64_t K, int64_t block) {
  TS_CHECK(block > 0 && K % block == 0 && block % 32 == 0, "[matmul_wt] K=", K,
           " is not a multiple of the activation block ", block);
  // Every array starts on a 64-byte boundary; K is a multiple of 32, so rows of q stay 32-byte
  // aligned for the kernels' loads.
  auto words = [](int64_t bytes) { return (bytes + 63) / 64 * 8; };
  const int64_t wq = words(M * K), wd = words(M * (K / block) * 4), wds = words(M * (K / 32) * 4),
                w16 = words(M * (K / 16) * 2), w32 = words(M * (K / 32) * 2);
  thread_local std::vector<int64_t> storage;
  const size_t need = static_cast<size_t>(wq + wd + wds + w16 + w32 + 8);
  if (storage.size() < need) storage.resize(need);
  auto* base = reinterpret_cast<char*>(storage.data());
  base += (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64;
  ActsQ8 a;
  a.M = M, a.K = K, a.block = block;
  a.q = reinterpret_cast<int8_t*>(base);
  a.d = reinterpret_cast<float*>(base + wq * 8);
  a.dsum = reinterpret_cast<float*>(base + (wq + wd) * 8);
  a.sum16 = reinterpret_cast<int16_t*>(base + (wq + wd + wds) * 8);
  a.sum32 = reinterpret_cast<int16_t*>(base + (wq + wd + wds + w16) * 8);
  return a;
}

void quantize_act_rows(const float* x, const QuantizedActs& qa, int64_t m0, int64_t m1) {
  const int64_t K = qa.K, nb = K / qa.block;
  for (int64_t m = m0; m < m1; ++m) {
    const float* xr = x + m * K;
    int16_t* q = qa.q + m * K;
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = xr + b * qa.block;
      float amax = 0;
      bool finite = true;
      for (int64_t j = 0; j < qa.block; ++j) {
        amax = std::max(amax, std::fabs(xb[j]));
        finite = finite && std::isfinite(xb[j]);
      }
      // A non-finite input makes the block's scale NaN, so it shows in the output as it would
      // in a float matmul (and the int16 casts below never see NaN or infinity).
      const float d = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
      const float id = finite && d > 0 ? 1.0f / d : 0.0f;
      qa.d[m * nb + b] = d;
      for (int64_t j = 0; j < qa.block; ++j)
        q[b * qa.block + j] =
            finite ? static_cast<int16_t>(std::clamp(std::nearbyint(xb[j] * id), -127.0f, 127.0f))
                   : int16_t{0};
    }
    for (int64_t g = 0; g < K / 32; ++g) {
      int32_t s = 0;
      for (int j = 0; j < 32; ++j) s += q[g * 32 + j];
      qa.sum32[m * (K / 32) + g] = s;
    }
  }
}

const float* bf16_rounded_acts(const float* x, int64_t M, int64_t K) {
  thread_local std::vector<float> storage;
  const size_t n = static_cast<size_t>(M * K);
  if (storage.size() < n) storage.resize(n);
  float* out = storage.data();
  // f32_to_bf16 then bf16_to_f32, written without the call's early return so that the loop
  // vectorizes: a row of 2048 values took 0.8 us on one Xeon core, against ~350 us for the
  // 2048 x 2048 bf16 matvec that reads it (576 values: 0.4 us against ~21 us).
  for (size_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, x + i, 4);
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    const uint32_t quiet_nan = (u | 0x00400000u) & 0xffff0000u;
    const uint32_t r = (u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
    std::memcpy(out + i, &r, 4);
  }
  return out;
}

}  // namespace tessera::cpu
