// Runtime element types: one traits table (name, block size, bytes), bf16/f16 conversions, and
// the quantized block structs laid out exactly as GGUF's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace tessera {

enum class DType : uint8_t { f32, bf16, f16, q8_0, q4_0, q4_1, i32 };

struct DTypeTraits {
  std::string_view name;
  int64_t block_elems;  // elements per block (1 for scalar types)
  int64_t block_bytes;  // bytes per block
};

const DTypeTraits& traits(DType t);
inline std::string_view dtype_name(DType t) {
  return traits(t).name;
}
// Parses "f32", "bf16", ...; throws Error naming `what` on an unknown name.
DType parse_dtype(std::string_view name, std::string_view what);
// Bytes taken by n elements; n must be a multiple of the block size (throws otherwise).
int64_t dtype_bytes(DType t, int64_t n);

// bf16: the top 16 bits of an f32. Conversion rounds to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE binary16, round to nearest even, with subnormals, infinities and NaN.
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

// GGUF block layouts. d (and m) are f16 scales; sizes are part of the file format.
constexpr int kQK8_0 = 32;
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK8_0];
};
static_assert(sizeof(BlockQ8_0) == 34);

constexpr int kQK4_0 = 32;
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK4_0 / 2];  // element j in low nibble of qs[j], element j+16 in the high nibble
};
static_assert(sizeof(BlockQ4_0) == 18);

constexpr int kQK4_1 = 32;
struct BlockQ4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[kQK4_1 / 2];
};
static_assert(sizeof(BlockQ4_1) == 20);

// Converts n elements of type `t` at src to f32 (dequantizes block types).
void to_f32(DType t, const void* src, float* dst, int64_t n);
// Converts n f32 values to type `t` (quantizes block types; n a multiple of the block size).
void from_f32(DType t, const float* src, void* dst, int64_t n);

}  // namespace tessera
