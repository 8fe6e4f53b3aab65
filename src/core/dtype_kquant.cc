// k-quant (Q4_K, Q5_K, Q6_K) dequantizers and quantizers: per sub-block least-squares scale (and
// min) search, then 6-bit (Q4_K, Q5_K) or 8-bit (Q6_K) quantization of the sub-block scales.
#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <type_traits>

#include "core/dtype.h"
#include "core/kquant_fit.h"

namespace tessera {

namespace kquant_fit {

int round_clamp(float v, int lo, int hi) {
  return std::clamp(static_cast<int>(std::nearbyint(v)), lo, hi);
}

// The searches are described in core/kquant_fit.h.
void fit_scale_min(const float* x, int n, int qmax, float* scale, float* min_out) {
  float lo = 0, hi = x[0];
  for (int i = 0; i < n; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
  *scale = 0;
  *min_out = -lo;
  if (hi <= lo) return;  // every value equals lo <= 0: the min alone represents them
  float best = std::numeric_limits<float>::infinity();
  for (int step = -2; step <= 6; ++step) {
    const float iscale = (static_cast<float>(qmax) + 0.125f * static_cast<float>(step)) / (hi - lo);
    double sq = 0, sqq = 0, sx = 0, sqx = 0;
    int q[kQK_K];
    for (int i = 0; i < n; ++i) {
      q[i] = round_clamp((x[i] - lo) * iscale, 0, qmax);
      sq += q[i], sqq += double(q[i]) * q[i], sx += x[i], sqx += double(q[i]) * x[i];
    }
    // Least squares x ~ a q + b; the format needs b <= 0, else b = 0 and a through the origin.
    const double det = n * sqq - sq * sq;
    double a = det > 0 ? (n * sqx - sq * sx) / det : 0,
           b = det > 0 ? (sqq * sx - sq * sqx) / det : lo;
    if (b > 0) b = 0, a = sqq > 0 ? sqx / sqq : 0;
    if (a <= 0) continue;
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const double e = a * q[i] + b - x[i];
      err += e * e;
    }
    if (err < best)
      best = static_cast<float>(err), *scale = static_cast<float>(a),
      *min_out = static_cast<float>(-b);
  }
}

float fit_scale_signed(const float* x, int n, int qmin) {
  float amax = 0, vmax = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), vmax = x[i];
  if (amax == 0) return 0;
  const float lo = static_cast<float>(qmin);
  float best_s = vmax / lo, best = std::numeric_limits<float>::infinity();
  for (int step = 0; step <= 8; ++step) {
    const float s0 = vmax / (lo * (1.0f - static_cast<float>(step) / 64.0f));
    double sqq = 0, sqx = 0;
    int q[16];
    for (int i = 0; i < n; ++i) {
      q[i] = round_clamp(x[i] / s0, qmin, -qmin - 1);
      sqq += double(q[i]) * q[i], sqx += double(q[i]) * x[i];
    }
    const double s = sqq > 0 ? sqx / sqq : 0;
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const double e = s * q[i] - x[i];
      err += e * e;
    }
    if (err < best) best = static_cast<float>(err), best_s = static_cast<float>(s);
  }
  return best_s;
}

}  // namespace kquant_fit

using kquant_fit::fit_scale_min;
using kquant_fit::fit_scale_signed;
using kquant_fit::round_clamp;

namespace {

// Q4_K and Q5_K decode alike: sub-block j of 32 is d sc_j q - dmin m_j, q the low (j even) or
// high (j odd) nibbles of qs bytes 32 (j / 2).., plus for Q5_K bit j of qh[l] as 16.
template <class Block>
void dequantize_k4_blocks(const Block* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const Block& blk = src[b];
    const float d = f16_to_f32(blk.d), dmin = f16_to_f32(blk.dmin);
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      q4_k_scale_min(blk.scales, j, &sc, &m);
      const float scale = d * static_cast<float>(sc), offset = dmin * static_cast<float>(m);
      const uint8_t* q = blk.qs + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int l = 0; l < 32; ++l) {
        int v = (q[l] >> shift) & 0x0f;
        if constexpr (std::is_same_v<Block, BlockQ5K>) v |= ((blk.qh[l] >> j) & 1) << 4;
        dst[b * kQK_K + 32 * j + l] = scale * static_cast<float>(v) - offset;
      }
    }
  }
}

}  // namespace

void dequantize_q4_k_blocks(const BlockQ4K* src, float* dst, int64_t n_blocks) {
  dequantize_k4_blocks(src, dst, n_blocks);
}

void dequantize_q5_k_blocks(const BlockQ5K* src, float* dst, int64_t n_blocks) {
  dequantize_k4_blocks(src, dst, n_blocks);
}

void dequantize_q6_k_blocks(const BlockQ6K* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const BlockQ6K& blk = src[b];
    const float d = f16_to_f32(blk.d);
    for (int i = 0; i < kQK_K; ++i) {
      // Within each half of 128: r = i / 32 picks the ql nibble (r & 1 -> +32 bytes, r >= 2 ->
      // high nibble) and the qh bit pair 2r.
      const int h = i / 128, r = (i % 128) / 32, l = i % 32;
      const uint8_t lo_byte = blk.ql[64 * h + l + 32 * (r & 1)];
      const int lo = r < 2 ? (lo_byte & 0x0f) : (lo_byte >> 4);
      const int hi = (blk.qh[32 * h + l] >> (2 * r)) & 3;
      dst[b * kQK_K + i] =
          d * static_cast<float>(blk.scales[i / 16]) * static_cast<float>((lo | (hi << 4)) - 32);
    }
  }
}

namespace {

// The shared half of the Q4_K and Q5_K quantizers: fits each 32-element sub-block of x as
// s_j q - m_j (q in [0, qmax]), stores the super-block scales d / dmin and the packed 6-bit
// sub-block scales, and returns each sub-block's step and offset as the reader will see them.
void fit_k_scales(const float* x, int qmax, uint16_t* d_out, uint16_t* dmin_out, uint8_t* packed,
                  float* step, float* offset) {
  float scale[8], mn[8], max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    fit_scale_min(x + 32 * j, 32, qmax, &scale[j], &mn[j]);
    max_scale = std::max(max_scale, scale[j]);
    max_min = std::max(max_min, mn[j]);
  }
  *d_out = f32_to_f16(max_scale / 63.0f);
  *dmin_out = f32_to_f16(max_min / 63.0f);
  // Quantize the scales against the stored (f16-rounded) super-block scales.
  const float d = f16_to_f32(*d_out), dmin = f16_to_f32(*dmin_out);
  int sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = d > 0 ? round_clamp(scale[j] / d, 0, 63) : 0;
    m[j] = dmin > 0 ? round_clamp(mn[j] / dmin, 0, 63) : 0;
    step[j] = d * static_cast<float>(sc[j]);
    offset[j] = dmin * static_cast<float>(m[j]);
  }
  for (int j = 0; j < 4; ++j) {
    packed[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    packed[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
    packed[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0x0f) | ((m[j + 4] & 0x0f) << 4));
  }
}

// Element l of sub-block j quantized against the stored step and offset (0..qmax).
int k_quant(float x, float step, float offset, int qmax) {
  return round_clamp((x + offset) * (step > 0 ? 1.0f / step : 0.0f), 0, qmax);
}

// Q4_K (qmax 15) and Q5_K (31, the fifth bit of element l of sub-block j in bit j of qh[l]).
template <class Block>
void quantize_k4_blocks(const float* src, Block* dst, int64_t n_blocks) {
  constexpr bool kFifthBit = std::is_same_v<Block, BlockQ5K>;
  constexpr int kQmax = kFifthBit ? 31 : 15;
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float* x = src + b * kQK_K;
    Block& blk = dst[b];
    float step[8], offset[8];
    fit_k_scales(x, kQmax, &blk.d, &blk.dmin, blk.scales, step, offset);
    std::fill(std::begin(blk.qs), std::end(blk.qs), 0);
    if constexpr (kFifthBit) std::fill(std::begin(blk.qh), std::end(blk.qh), 0);
    for (int j = 0; j < 8; ++j)
      for (int l = 0; l < 32; ++l) {
        const int q = k_quant(x[32 * j + l], step[j], offset[j], kQmax);
        blk.qs[32 * (j / 2) + l] |= static_cast<uint8_t>((q & 0x0f) << (4 * (j % 2)));
        if constexpr (kFifthBit) blk.qh[l] |= static_cast<uint8_t>((q >> 4) << j);
      }
  }
}

}  // namespace

void quantize_q4_k_blocks(const float* src, BlockQ4K* dst, int64_t n_blocks) {
  quantize_k4_blocks(src, dst, n_blocks);
}

void quantize_q5_k_blocks(const float* src, BlockQ5K* dst, int64_t n_blocks) {
  quantize_k4_blocks(src, dst, n_blocks);
}

void quantize_q6_k_blocks(const float* src, BlockQ6K* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float* x = src + b * kQK_K;
    BlockQ6K& blk = dst[b];
    float scale[16], amax = 0;
    for (int g = 0; g < 16; ++g) {
      scale[g] = fit_scale_signed(x + 16 * g, 16, -32);
      amax = std::max(amax, std::fabs(scale[g]));
    }
    blk.d = f32_to_f16(amax / 127.0f);
    const float d = f16_to_f32(blk.d);
    for (int g = 0; g < 16; ++g)
      blk.scales[g] = static_cast<int8_t>(d > 0 ? round_clamp(scale[g] / d, -127, 127) : 0);
    std::fill(blk.ql, blk.ql + kQK_K / 2, 0);
    std::fill(blk.qh, blk.qh + kQK_K / 4, 0);
    for (int i = 0; i < kQK_K; ++i) {
      const float s = d * static_cast<float>(blk.scales[i / 16]);
      const int q = (s != 0 ? round_clamp(x[i] / s, -32, 31) : 0) + 32;
      const int h = i / 128, r = (i % 128) / 32, l = i % 32;
      blk.ql[64 * h + l + 32 * (r & 1)] |= static_cast<uint8_t>((q & 0x0f) << (r < 2 ? 0 : 4));
      blk.qh[32 * h + l] |= static_cast<uint8_t>((q >> 4) << (2 * r));
    }
  }
}

}  // namespace tessera
