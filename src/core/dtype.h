// Runtime element types: one traits table (name, block size, bytes), bf16/f16 conversions, and
// the quantized block structs laid out exactly as GGUF's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace tessera {

// Values are stable ids (appended only): i32 predates the k-quants, and the 5-bit formats came
// after the CPU layouts. q4_0x8, q4_1x8 and q8_0x8 are in-memory CPU layouts of q4_0/q4_1/q8_0
// matrices with 8 rows interleaved block by block, f16x16 of f16 matrices with 16 rows
// interleaved element by element, and q4_kx8 / q5_kx8 / q6_kx8 of q4_K / Q5_K / Q6_K matrices with
// 8 rows interleaved super-block by super-block (see core/interleave.h); no file stores them and
// parse_dtype does not accept their names.
enum class DType : uint8_t {
  f32,
  bf16,
  f16,
  q8_0,
  q4_0,
  q4_1,
  i32,
  q4_k,
  q6_k,
  q4_0x8,
  q4_1x8,
  q8_0x8,
  f16x16,
  q5_0,
  q5_1,
  q5_k,
  q2_k,
  q3_k,
  q4_kx8,
  q5_kx8,
  q6_kx8
};

struct DTypeTraits {
  std::string_view name;
  int64_t block_elems;      // elements per block (1 for scalar types)
  int64_t block_bytes;      // bytes per block
  int64_t interleave_rows;  // rows stored interleaved (8 for the x8 layouts, 16 for f16x16, else 1)
};

const DTypeTraits& traits(DType t);
inline std::string_view dtype_name(DType t) {
  return traits(t).name;
}
// Parses "f32", "bf16", ...; throws Error naming `what` on an unknown name or an in-memory
// layout (q4_0x8, q4_1x8, q8_0x8).
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

// 5-bit blocks: element j (< 16) is the low nibble of qs[j] with bit j of qh (a little-endian
// 32-bit word) as its fifth bit; element j + 16 the high nibble with bit j + 16. q5_0 stores
// d * (q - 16), q5_1 d * q + m.
constexpr int kQK5_0 = 32;
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[kQK5_0 / 2];
};
static_assert(sizeof(BlockQ5_0) == 22);

constexpr int kQK5_1 = 32;
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[kQK5_1 / 2];
};
static_assert(sizeof(BlockQ5_1) == 24);

// The fifth bits of a q5_0 / q5_1 block as one word (bit j belongs to element j).
inline uint32_t q5_high_bits(const uint8_t* qh) {
  return static_cast<uint32_t>(qh[0]) | static_cast<uint32_t>(qh[1]) << 8 |
         static_cast<uint32_t>(qh[2]) << 16 | static_cast<uint32_t>(qh[3]) << 24;
}

// k-quant super-blocks of 256 elements.
constexpr int kQK_K = 256;
// Q4_K: 8 sub-blocks of 32; x = d * sc_j * q - dmin * m_j, q 4-bit, sc_j and m_j 6-bit.
struct BlockQ4K {
  uint16_t d;             // f16 scale of the sub-block scales
  uint16_t dmin;          // f16 scale of the sub-block mins
  uint8_t scales[12];     // 8 six-bit scales and 8 six-bit mins, packed (see q4_k_scale_min)
  uint8_t qs[kQK_K / 2];  // 4-bit quants, 64 elements per 32 bytes (low nibbles then high)
};
static_assert(sizeof(BlockQ4K) == 144);
// Q6_K: 16 groups of 16; x = d * scales[g] * (q - 32), q 6-bit.
struct BlockQ6K {
  uint8_t ql[kQK_K / 2];  // low 4 bits of the quants
  uint8_t qh[kQK_K / 4];  // high 2 bits of the quants
  int8_t scales[16];      // one scale per 16 elements
  uint16_t d;             // f16 super-block scale
};
static_assert(sizeof(BlockQ6K) == 210);
// Q5_K: as Q4_K (same scales and nibble layout) with a fifth bit per element: element l of
// sub-block j (0..7) takes bit j of qh[l] as 16. x = d * sc_j * q - dmin * m_j, q in 0..31.
struct BlockQ5K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[kQK_K / 8];  // bit j of byte l: the fifth bit of element 32 j + l
  uint8_t qs[kQK_K / 2];  // low 4 bits, laid out as Q4_K's
};
static_assert(sizeof(BlockQ5K) == 176);

// Q2_K: 16 groups of 16; x = d * (scales[g] & 15) * q - dmin * (scales[g] >> 4), q 2-bit.
// Element e = 128 h + 32 j + l (h 0..1, j 0..3, l 0..31) is bits 2j..2j+1 of qs[32 h + l].
struct BlockQ2K {
  uint8_t scales[kQK_K / 16];  // per group: 4-bit scale (low nibble), 4-bit min (high)
  uint8_t qs[kQK_K / 4];
  uint16_t d;
  uint16_t dmin;
};
static_assert(sizeof(BlockQ2K) == 84);
// Q3_K: 16 groups of 16; x = d * s_g * q with s_g a 6-bit scale less 32 and q in -4..3: element
// e = 128 h + 32 j + l takes bits 2j..2j+1 of qs[32 h + l], less 4 unless bit 4h + j of
// hmask[l] is set.
struct BlockQ3K {
  uint8_t hmask[kQK_K / 8];
  uint8_t qs[kQK_K / 4];
  uint8_t scales[12];  // 16 six-bit scales, packed (see q3_k_scales)
  uint16_t d;
};
static_assert(sizeof(BlockQ3K) == 110);

// The 16 scales of a Q3_K block, less their bias of 32. Bytes 0-7 hold the low 4 bits (scale g
// in the low nibble of byte g % 8 for g < 8, the high nibble for g >= 8), bytes 8-11 the top 2
// bits (scale g in bits 2 (g / 4) and 2 (g / 4) + 1 of byte 8 + g % 4).
inline void q3_k_scales(const uint8_t* s, int* out) {
  for (int g = 0; g < 16; ++g) {
    const int low = (s[g % 8] >> (g < 8 ? 0 : 4)) & 0x0f;
    const int high = (s[8 + g % 4] >> (2 * (g / 4))) & 3;
    out[g] = (low | (high << 4)) - 32;
  }
}

// Sub-block j (0..7) of a Q4_K block: its 6-bit scale and min from the 12 packed bytes.
// Bytes 0-3 hold sc_0..3 in bits 0-5, bytes 4-7 hold m_0..3 in bits 0-5; bytes 8-11 hold
// sc_4..7 (low nibble) and m_4..7 (high nibble), whose top 2 bits are bits 6-7 of bytes 0-3
// (scales) and 4-7 (mins).
inline void q4_k_scale_min(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// k-quant (de)quantizers for n_blocks super-blocks (dtype_kquant.cc); to_f32/from_f32 call them.
// Quantization searches each sub-block's scale (and min) for the least squared error.
void dequantize_q4_k_blocks(const BlockQ4K* src, float* dst, int64_t n_blocks);
void dequantize_q5_k_blocks(const BlockQ5K* src, float* dst, int64_t n_blocks);
void dequantize_q6_k_blocks(const BlockQ6K* src, float* dst, int64_t n_blocks);
void quantize_q4_k_blocks(const float* src, BlockQ4K* dst, int64_t n_blocks);
void quantize_q5_k_blocks(const float* src, BlockQ5K* dst, int64_t n_blocks);
void quantize_q6_k_blocks(const float* src, BlockQ6K* dst, int64_t n_blocks);
void dequantize_q2_k_blocks(const BlockQ2K* src, float* dst, int64_t n_blocks);
void dequantize_q3_k_blocks(const BlockQ3K* src, float* dst, int64_t n_blocks);
void quantize_q2_k_blocks(const float* src, BlockQ2K* dst, int64_t n_blocks);
void quantize_q3_k_blocks(const float* src, BlockQ3K* dst, int64_t n_blocks);

// Elements per activation scale when x is quantized to 8 bits for a product with weights of
// type t (32 for q8_0/q4_0/q4_1/q5_0/q5_1, 256 for the k-quants); 0 for float types, which take x
// unquantized. Shared by the CPU and CUDA kernels so both quantize x the same way.
inline int64_t act_block_elems(DType t) {
  switch (t) {
    case DType::q8_0:
    case DType::q4_0:
    case DType::q4_1:
    case DType::q5_0:
    case DType::q5_1:
    case DType::q4_0x8:
    case DType::q4_1x8:
    case DType::q8_0x8:
      return 32;
    case DType::q2_k:
    case DType::q3_k:
    case DType::q4_k:
    case DType::q5_k:
    case DType::q6_k:
    case DType::q4_kx8:
    case DType::q5_kx8:
    case DType::q6_kx8:
      return kQK_K;
    default:
      return 0;
  }
}

// Converts n elements of type `t` at src to f32 (dequantizes block types). The interleaved
// layouts have no flat element order: they throw (core/interleave.h converts their rows).
void to_f32(DType t, const void* src, float* dst, int64_t n);
// Converts n f32 values to type `t` (quantizes block types; n a multiple of the block size).
void from_f32(DType t, const float* src, void* dst, int64_t n);

}  // namespace tessera
