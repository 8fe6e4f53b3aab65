// DType traits table, f16 conversion and the reference (de)quantizers for the 32-element block
// formats (q8_0, q4_0, q4_1, q5_0, q5_1; k-quants in dtype_kquant.cc and dtype_kquant_low.cc).
#include "core/dtype.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "core/error.h"

namespace tessera {

namespace {
constexpr DTypeTraits kTraits[] = {
    {"f32", 1, 4, 1},
    {"bf16", 1, 2, 1},
    {"f16", 1, 2, 1},
    {"q8_0", kQK8_0, sizeof(BlockQ8_0), 1},
    {"q4_0", kQK4_0, sizeof(BlockQ4_0), 1},
    {"q4_1", kQK4_1, sizeof(BlockQ4_1), 1},
    {"i32", 1, 4, 1},
    {"q4_k", kQK_K, sizeof(BlockQ4K), 1},
    {"q6_k", kQK_K, sizeof(BlockQ6K), 1},
    {"q4_0x8", kQK4_0, sizeof(BlockQ4_0), 8},
    {"q4_1x8", kQK4_1, sizeof(BlockQ4_1), 8},
    {"q8_0x8", kQK8_0, sizeof(BlockQ8_0), 8},
    {"f16x16", 1, 2, 16},
    {"q5_0", kQK5_0, sizeof(BlockQ5_0), 1},
    {"q5_1", kQK5_1, sizeof(BlockQ5_1), 1},
    {"q5_k", kQK_K, sizeof(BlockQ5K), 1},
    {"q2_k", kQK_K, sizeof(BlockQ2K), 1},
    {"q3_k", kQK_K, sizeof(BlockQ3K), 1},
    {"q4_kx8", kQK_K, sizeof(BlockQ4K), 8},
    {"q5_kx8", kQK_K, sizeof(BlockQ5K), 8},
    {"q6_kx8", kQK_K, sizeof(BlockQ6K), 8},
};
constexpr int kNumTypes = sizeof(kTraits) / sizeof(kTraits[0]);

// q5_0 stores d (q - 16), q5_1 d q + m; both keep 32 five-bit quants as q4's nibbles plus the
// qh word of fifth bits (core/dtype.h).
template <class Block>
constexpr bool kQ5HasMin = std::is_same_v<Block, BlockQ5_1>;

template <class Block>
void dequantize_q5(const Block* b, float* dst, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i, dst += 32) {
    const float d = f16_to_f32(b[i].d);
    float m = 0;
    if constexpr (kQ5HasMin<Block>) m = f16_to_f32(b[i].m);
    const uint32_t qh = q5_high_bits(b[i].qh);
    for (int j = 0; j < 16; ++j) {
      const int q0 = (b[i].qs[j] & 0x0f) | static_cast<int>((qh >> j) & 1) << 4;
      const int q1 = (b[i].qs[j] >> 4) | static_cast<int>((qh >> (j + 16)) & 1) << 4;
      if constexpr (kQ5HasMin<Block>) {
        dst[j] = d * q0 + m, dst[j + 16] = d * q1 + m;
      } else {
        dst[j] = d * (q0 - 16), dst[j + 16] = d * (q1 - 16);
      }
    }
  }
}

// As q4_0 / q4_1 with 32 levels: q5_0 maps the value of largest magnitude to -16, q5_1 spans
// [min, max] in 31 steps.
template <class Block>
void quantize_q5(const float* src, Block* b, int64_t n_blocks) {
  for (int64_t i = 0; i < n_blocks; ++i) {
    const float* x = src + i * 32;
    float d, lo = 0;
    if constexpr (kQ5HasMin<Block>) {
      float hi = x[0];
      lo = x[0];
      for (int j = 1; j < 32; ++j) lo = std::min(lo, x[j]), hi = std::max(hi, x[j]);
      d = (hi - lo) / 31.0f;
      b[i].m = f32_to_f16(lo);
    } else {
      float amax = 0, maxv = 0;
      for (int j = 0; j < 32; ++j)
        if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]), maxv = x[j];
      d = maxv / -16.0f;
    }
    const float id = (kQ5HasMin<Block> ? d > 0 : d != 0) ? 1.0f / d : 0.0f;
    b[i].d = f32_to_f16(d);
    auto quant = [&](float v) {
      const float r = kQ5HasMin<Block> ? (v - lo) * id + 0.5f : v * id + 16.5f;
      return std::min(31, static_cast<int>(r));
    };
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      const int q0 = quant(x[j]), q1 = quant(x[j + 16]);
      b[i].qs[j] = static_cast<uint8_t>((q0 & 0x0f) | ((q1 & 0x0f) << 4));
      qh |= static_cast<uint32_t>(q0 >> 4) << j | static_cast<uint32_t>(q1 >> 4) << (j + 16);
    }
    for (int k = 0; k < 4; ++k) b[i].qh[k] = static_cast<uint8_t>(qh >> (8 * k));
  }
}

}  // namespace

const DTypeTraits& traits(DType t) {
  const int i = static_cast<int>(t);
  if (i < 0 || i >= kNumTypes) fail("[dtype] unknown dtype id ", i);
  return kTraits[i];
}

DType parse_dtype(std::string_view name, std::string_view what) {
  for (int i = 0; i < kNumTypes; ++i) {
    if (kTraits[i].name != name) continue;
    TS_CHECK(kTraits[i].interleave_rows == 1, "[dtype] ", what, ": '", name,
             "' is an in-memory CPU layout, not a type a file or flag can name");
    return static_cast<DType>(i);
  }
  fail("[dtype] ", what, ": unknown dtype '", name, "'");
}

int64_t dtype_bytes(DType t, int64_t n) {
  const auto& tr = traits(t);
  TS_CHECK(n >= 0 && n % tr.block_elems == 0, "[dtype] ", n, " elements is not a multiple of the ",
           tr.name, " block size ", tr.block_elems);
  return n / tr.block_elems * tr.block_bytes;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (absx < 0x38800000u) {  // subnormal or zero in f16: scale to integer units of 2^-24
    const float a = std::fabs(f) * 16777216.0f;  // exact for the representable range
    const float r = std::nearbyint(a);           // default rounding: to nearest even
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
  }
  // Normal: rebias exponent, round mantissa from 23 to 10 bits, nearest even.
  uint32_t m = absx + 0xfffu + ((absx >> 13) & 1u);
  m -= (127u - 15u) << 23;
  return static_cast<uint16_t>(sign | (m >> 13));
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  float out;
  if (exp == 0) {
    out = std::ldexp(static_cast<float>(man), -24);
    if (sign) out = -out;
    return out;
  }
  uint32_t u;
  if (exp == 31)
    u = sign | 0x7f800000u | (man << 13);
  else
    u = sign | ((exp + 127u - 15u) << 23) | (man << 13);
  std::memcpy(&out, &u, 4);
  return out;
}

void to_f32(DType t, const void* src, float* dst, int64_t n) {
  switch (t) {
    case DType::f32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::bf16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    case DType::f16: {
      auto* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::q8_0: {
      dtype_bytes(t, n);
      auto* b = static_cast<const BlockQ8_0*>(src);
      for (int64_t i = 0; i < n / kQK8_0; ++i) {
        const float d = f16_to_f32(b[i].d);
        for (int j = 0; j < kQK8_0; ++j) dst[i * kQK8_0 + j] = d * b[i].qs[j];
      }
      return;
    }
    case DType::q4_0: {
      dtype_bytes(t, n);
      auto* b = static_cast<const BlockQ4_0*>(src);
      for (int64_t i = 0; i < n / kQK4_0; ++i) {
        const float d = f16_to_f32(b[i].d);
        for (int j = 0; j < kQK4_0 / 2; ++j) {
          dst[i * kQK4_0 + j] = d * ((b[i].qs[j] & 0x0f) - 8);
          dst[i * kQK4_0 + j + 16] = d * ((b[i].qs[j] >> 4) - 8);
        }
      }
      return;
    }
    case DType::q4_1: {
      dtype_bytes(t, n);
      auto* b = static_cast<const BlockQ4_1*>(src);
      for (int64_t i = 0; i < n / kQK4_1; ++i) {
        const float d = f16_to_f32(b[i].d), m = f16_to_f32(b[i].m);
        for (int j = 0; j < kQK4_1 / 2; ++j) {
          dst[i * kQK4_1 + j] = d * (b[i].qs[j] & 0x0f) + m;
          dst[i * kQK4_1 + j + 16] = d * (b[i].qs[j] >> 4) + m;
        }
      }
      return;
    }
    case DType::q5_0:
      dtype_bytes(t, n);
      return dequantize_q5(static_cast<const BlockQ5_0*>(src), dst, n / kQK5_0);
    case DType::q5_1:
      dtype_bytes(t, n);
      return dequantize_q5(static_cast<const BlockQ5_1*>(src), dst, n / kQK5_1);
    case DType::q4_k:
      dtype_bytes(t, n);
      dequantize_q4_k_blocks(static_cast<const BlockQ4K*>(src), dst, n / kQK_K);
      return;
    case DType::q5_k:
      dtype_bytes(t, n);
      dequantize_q5_k_blocks(static_cast<const BlockQ5K*>(src), dst, n / kQK_K);
      return;
    case DType::q2_k:
      dtype_bytes(t, n);
      return dequantize_q2_k_blocks(static_cast<const BlockQ2K*>(src), dst, n / kQK_K);
    case DType::q3_k:
      dtype_bytes(t, n);
      return dequantize_q3_k_blocks(static_cast<const BlockQ3K*>(src), dst, n / kQK_K);
    case DType::q6_k:
      dtype_bytes(t, n);
      dequantize_q6_k_blocks(static_cast<const BlockQ6K*>(src), dst, n / kQK_K);
      return;
    case DType::i32:
    case DType::q4_0x8:
    case DType::q4_1x8:
    case DType::q8_0x8:
    case DType::f16x16:
    case DType::q4_kx8:
    case DType::q5_kx8:
    case DType::q6_kx8:
      break;
  }
  fail("[dtype] cannot convert ", dtype_name(t), " to f32");
}

void from_f32(DType t, const float* src, void* dst, int64_t n) {
  switch (t) {
    case DType::f32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::bf16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::f16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::q8_0: {
      dtype_bytes(t, n);
      auto* b = static_cast<BlockQ8_0*>(dst);
      for (int64_t i = 0; i < n / kQK8_0; ++i) {
        const float* x = src + i * kQK8_0;
        float amax = 0;
        for (int j = 0; j < kQK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
        const float d = amax / 127.0f;
        const float id = d > 0 ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        for (int j = 0; j < kQK8_0; ++j)
          b[i].qs[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));
      }
      return;
    }
    case DType::q4_0: {
      dtype_bytes(t, n);
      auto* b = static_cast<BlockQ4_0*>(dst);
      for (int64_t i = 0; i < n / kQK4_0; ++i) {
        const float* x = src + i * kQK4_0;
        float amax = 0, maxv = 0;  // signed value of largest magnitude maps to -8
        for (int j = 0; j < kQK4_0; ++j)
          if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]), maxv = x[j];
        const float d = maxv / -8.0f;
        const float id = d != 0 ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        for (int j = 0; j < kQK4_0 / 2; ++j) {
          const int q0 = std::min(15, static_cast<int>(x[j] * id + 8.5f));
          const int q1 = std::min(15, static_cast<int>(x[j + 16] * id + 8.5f));
          b[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
        }
      }
      return;
    }
    case DType::q4_1: {
      dtype_bytes(t, n);
      auto* b = static_cast<BlockQ4_1*>(dst);
      for (int64_t i = 0; i < n / kQK4_1; ++i) {
        const float* x = src + i * kQK4_1;
        float lo = x[0], hi = x[0];
        for (int j = 1; j < kQK4_1; ++j) lo = std::min(lo, x[j]), hi = std::max(hi, x[j]);
        const float d = (hi - lo) / 15.0f;
        const float id = d > 0 ? 1.0f / d : 0.0f;
        b[i].d = f32_to_f16(d);
        b[i].m = f32_to_f16(lo);
        for (int j = 0; j < kQK4_1 / 2; ++j) {
          const int q0 = std::min(15, static_cast<int>((x[j] - lo) * id + 0.5f));
          const int q1 = std::min(15, static_cast<int>((x[j + 16] - lo) * id + 0.5f));
          b[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
        }
      }
      return;
    }
    case DType::q5_0:
      dtype_bytes(t, n);
      return quantize_q5(src, static_cast<BlockQ5_0*>(dst), n / kQK5_0);
    case DType::q5_1:
      dtype_bytes(t, n);
      return quantize_q5(src, static_cast<BlockQ5_1*>(dst), n / kQK5_1);
    case DType::q4_k:
      dtype_bytes(t, n);
      quantize_q4_k_blocks(src, static_cast<BlockQ4K*>(dst), n / kQK_K);
      return;
    case DType::q5_k:
      dtype_bytes(t, n);
      quantize_q5_k_blocks(src, static_cast<BlockQ5K*>(dst), n / kQK_K);
      return;
    case DType::q2_k:
      dtype_bytes(t, n);
      return quantize_q2_k_blocks(src, static_cast<BlockQ2K*>(dst), n / kQK_K);
    case DType::q3_k:
      dtype_bytes(t, n);
      return quantize_q3_k_blocks(src, static_cast<BlockQ3K*>(dst), n / kQK_K);
    case DType::q6_k:
      dtype_bytes(t, n);
      quantize_q6_k_blocks(src, static_cast<BlockQ6K*>(dst), n / kQK_K);
      return;
    case DType::i32:
    case DType::q4_0x8:
    case DType::q4_1x8:
    case DType::q8_0x8:
    case DType::f16x16:
    case DType::q4_kx8:
    case DType::q5_kx8:
    case DType::q6_kx8:
      break;
  }
  fail("[dtype] cannot convert f32 to ", dtype_name(t));
}

}  // namespace tessera
