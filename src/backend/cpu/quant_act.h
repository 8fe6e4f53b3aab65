// Activations quantized on the fly for the int8 dot products of the quantized matmul: one scale
// per weight block (32 or 256 elements), values kept as int16 (Highway kernels, reference) or as
// int8 with per-16/32 sums (AVX2 kernels: vpmaddubsw takes 8-bit operands).
#pragma once

#include <cstdint>
#include <cstring>

#include "core/dtype.h"

namespace tessera::cpu {

// Rows of x quantized as x ~ d * q, q in [-127, 127], one d per `block` elements.
struct QuantizedActs {
  int64_t M = 0, K = 0, block = 0;
  int16_t* q = nullptr;      // (M, K)
  float* d = nullptr;        // (M, K / block)
  int32_t* sum32 = nullptr;  // (M, K / 32): sum of q over each 32 elements (for the min terms)
  const int16_t* row_q(int64_t m) const { return q + m * K; }
  const float* row_d(int64_t m) const { return d + m * (K / block); }
  const int32_t* row_sum32(int64_t m) const { return sum32 + m * (K / 32); }
};

// The same integers and scales as QuantizedActs, as int8, with the sums the weight offsets and
// mins need (q4_0's -8, q4_1's and Q4_K's mins, Q6_K's -32). Rows are 64-byte aligned.
struct ActsQ8 {
  int64_t M = 0, K = 0, block = 0;
  int8_t* q = nullptr;       // (M, K)
  float* d = nullptr;        // (M, K / block)
  float* dsum = nullptr;     // (M, K / 32): d * sum of q over each 32 elements (q4_1's min term)
  int16_t* sum16 = nullptr;  // (M, K / 16): sum of q over each 16 elements (|sum| <= 2032)
  int16_t* sum32 = nullptr;  // (M, K / 32): sum of q over each 32 elements (|sum| <= 4064)
  const int8_t* row_q(int64_t m) const { return q + m * K; }
  const float* row_d(int64_t m) const { return d + m * (K / block); }
  const float* row_dsum(int64_t m) const { return dsum + m * (K / 32); }
  const int16_t* row_sum16(int64_t m) const { return sum16 + m * (K / 16); }
  const int16_t* row_sum32(int64_t m) const { return sum32 + m * (K / 32); }
};

// Views M x K quantized activations in a per-calling-thread buffer that grows when needed and is
// reused across calls (no allocation per call once warm). Valid until the next call on the same
// thread.
QuantizedActs act_buffer(int64_t M, int64_t K, int64_t block);

// As act_buffer, for int8 activations (a separate per-thread buffer).
ActsQ8 acts_q8_buffer(int64_t M, int64_t K, int64_t block);

// Quantizes rows [m0, m1) of x (M, K) into qa: d = max|x| / 127 per block, q = round(x / d).
// Plain scalar code shared by the reference and SIMD paths, so both see identical integers.
void quantize_act_rows(const float* x, const QuantizedActs& qa, int64_t m0, int64_t m1);

// x (M, K) as a product against bf16 weights takes it (ops::matmul_wt): every value rounded to
// bf16 (nearest even, NaN kept: core's f32_to_bf16) and widened back to f32. Returns a
// per-calling-thread buffer that grows when needed and is reused (valid until the next call on
// the same thread), so the float kernels read it in place of x and their loops stay as they are.
// The SIMD paths' (the reference rounds with core's function, so each checks the other).
const float* bf16_rounded_acts(const float* x, int64_t M, int64_t K);

// f16 bits to f32 with integer ops and one multiply (exact, like f16_to_f32, including
// subnormals, infinities and NaN); used on block scales in the inner loops, where
// f16_to_f32's branches and ldexp would cost too much. No calls, so accumulators stay in
// registers around it.
inline float f16_scale_to_f32(uint16_t h) {
  const uint32_t magnitude = static_cast<uint32_t>(h & 0x7fffu) << 13;
  float f;
  std::memcpy(&f, &magnitude, 4);
  f *= 0x1p112f;  // rebias the exponent from 15 to 127 (subnormals become normal, exactly)
  if ((h & 0x7c00u) == 0x7c00u) {  // inf / NaN: all-ones exponent, mantissa kept
    const uint32_t special = 0x7f800000u | magnitude;
    std::memcpy(&f, &special, 4);
  }
  return (h & 0x8000u) ? -f : f;
}

}  // namespace tessera::cpu
