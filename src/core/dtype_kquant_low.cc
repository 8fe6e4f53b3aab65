// The low-bit k-quants (Q2_K, Q3_K: 16 groups of 16 per super-block of 256) : dequantizers and
// quantizers. Quantization fits each group's scale (and Q2_K's min) by least squares, then
// quantizes the group scales to 4 bits (Q2_K) or 6 bits (Q3_K) against the super-block scale.
#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "core/kquant_fit.h"

namespace tessera {

using kquant_fit::fit_scale_min;
using kquant_fit::fit_scale_signed;
using kquant_fit::round_clamp;

namespace {

// Element e of a super-block: half h, 2-bit plane j, byte l (core/dtype.h's layout).
struct Place {
  int h, j, l;
};
Place place(int e) {
  return {e / 128, (e % 128) / 32, e % 32};
}

}  // namespace

void dequantize_q2_k_blocks(const BlockQ2K* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, dst += kQK_K) {
    const BlockQ2K& blk = src[b];
    const float d = f16_to_f32(blk.d), dmin = f16_to_f32(blk.dmin);
    for (int e = 0; e < kQK_K; ++e) {
      const Place p = place(e);
      const int q = (blk.qs[32 * p.h + p.l] >> (2 * p.j)) & 3;
      const int sc = blk.scales[e / 16];
      dst[e] = d * static_cast<float>(sc & 15) * static_cast<float>(q) -
               dmin * static_cast<float>(sc >> 4);
    }
  }
}

void dequantize_q3_k_blocks(const BlockQ3K* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, dst += kQK_K) {
    const BlockQ3K& blk = src[b];
    const float d = f16_to_f32(blk.d);
    int sc[16];
    q3_k_scales(blk.scales, sc);
    for (int e = 0; e < kQK_K; ++e) {
      const Place p = place(e);
      const int low = (blk.qs[32 * p.h + p.l] >> (2 * p.j)) & 3;
      const bool high = (blk.hmask[p.l] >> (4 * p.h + p.j)) & 1;
      dst[e] = d * static_cast<float>(sc[e / 16]) * static_cast<float>(low - (high ? 0 : 4));
    }
  }
}

void quantize_q2_k_blocks(const float* src, BlockQ2K* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float* x = src + b * kQK_K;
    BlockQ2K& blk = dst[b];
    float scale[16], mn[16], max_scale = 0, max_min = 0;
    for (int g = 0; g < 16; ++g) {
      fit_scale_min(x + 16 * g, 16, 3, &scale[g], &mn[g]);
      max_scale = std::max(max_scale, scale[g]);
      max_min = std::max(max_min, mn[g]);
    }
    blk.d = f32_to_f16(max_scale / 15.0f);
    blk.dmin = f32_to_f16(max_min / 15.0f);
    const float d = f16_to_f32(blk.d), dmin = f16_to_f32(blk.dmin);
    float step[16], offset[16];
    for (int g = 0; g < 16; ++g) {
      const int sc = d > 0 ? round_clamp(scale[g] / d, 0, 15) : 0;
      const int m = dmin > 0 ? round_clamp(mn[g] / dmin, 0, 15) : 0;
      blk.scales[g] = static_cast<uint8_t>(sc | (m << 4));
      step[g] = d * static_cast<float>(sc), offset[g] = dmin * static_cast<float>(m);
    }
    std::fill(std::begin(blk.qs), std::end(blk.qs), 0);
    for (int e = 0; e < kQK_K; ++e) {
      const int g = e / 16;
      const float inv = step[g] > 0 ? 1.0f / step[g] : 0.0f;
      const int q = round_clamp((x[e] + offset[g]) * inv, 0, 3);
      const Place p = place(e);
      blk.qs[32 * p.h + p.l] |= static_cast<uint8_t>(q << (2 * p.j));
    }
  }
}

void quantize_q3_k_blocks(const float* src, BlockQ3K* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const float* x = src + b * kQK_K;
    BlockQ3K& blk = dst[b];
    float scale[16], amax = 0;
    for (int g = 0; g < 16; ++g) {
      scale[g] = fit_scale_signed(x + 16 * g, 16, -4);
      amax = std::max(amax, std::fabs(scale[g]));
    }
    blk.d = f32_to_f16(amax / 31.0f);
    const float d = f16_to_f32(blk.d);
    int sc[16];
    std::fill(std::begin(blk.scales), std::end(blk.scales), 0);
    for (int g = 0; g < 16; ++g) {
      sc[g] = d > 0 ? round_clamp(scale[g] / d, -32, 31) : 0;
      const int u = sc[g] + 32;  // stored biased, 6 bits
      blk.scales[g % 8] |= static_cast<uint8_t>((u & 0x0f) << (g < 8 ? 0 : 4));
      blk.scales[8 + g % 4] |= static_cast<uint8_t>((u >> 4) << (2 * (g / 4)));
    }
    std::fill(std::begin(blk.qs), std::end(blk.qs), 0);
    std::fill(std::begin(blk.hmask), std::end(blk.hmask), 0);
    for (int e = 0; e < kQK_K; ++e) {
      const float s = d * static_cast<float>(sc[e / 16]);
      const int q = (s != 0 ? round_clamp(x[e] / s, -4, 3) : 0) + 4;  // 0..7
      const Place p = place(e);
      blk.qs[32 * p.h + p.l] |= static_cast<uint8_t>((q & 3) << (2 * p.j));
      blk.hmask[p.l] |= static_cast<uint8_t>((q >> 2) << (4 * p.h + p.j));
    }
  }
}

}  // namespace tessera
