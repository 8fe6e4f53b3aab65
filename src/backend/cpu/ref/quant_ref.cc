// Reference matmul against weights stored as f32/f16/bf16 or GGUF block formats: plain loops,
// integer dot products per block as the SIMD kernels compute them (the test oracle).
#include <algorithm>
#include <vector>

#include "backend/cpu/quant_act.h"
#include "backend/cpu/ref/ref_kernels.h"
#include "core/error.h"
#include "core/interleave.h"
#include "ops/quant.h"

namespace tessera::cpu::ref {

namespace {

float weight_f32(DType t, const uint8_t* row, int64_t k) {
  uint16_t h;
  switch (t) {
    case DType::f32: {
      float f;
      std::memcpy(&f, row + 4 * k, 4);
      return f;
    }
    case DType::f16:
      std::memcpy(&h, row + 2 * k, 2);
      return f16_to_f32(h);
    default:  // bf16
      std::memcpy(&h, row + 2 * k, 2);
      return bf16_to_f32(h);
  }
}

// One weight row against activation row m; every block's integer sum is exact, and blocks are
// combined in order in f32.
float dot_row(DType t, const uint8_t* row, const QuantizedActs& qa, int64_t m) {
  const int16_t* xq = qa.row_q(m);
  const float* dx = qa.row_d(m);
  const int32_t* s32 = qa.row_sum32(m);
  float acc = 0;
  switch (t) {
    case DType::q8_0:
      for (int64_t b = 0; b < qa.K / kQK8_0; ++b) {
        const auto* blk = reinterpret_cast<const BlockQ8_0*>(row) + b;
        int32_t s = 0;
        for (int j = 0; j < kQK8_0; ++j) s += blk->qs[j] * xq[b * kQK8_0 + j];
        acc += f16_to_f32(blk->d) * dx[b] * static_cast<float>(s);
      }
      return acc;
    case DType::q4_0:
      for (int64_t b = 0; b < qa.K / kQK4_0; ++b) {
        const auto* blk = reinterpret_cast<const BlockQ4_0*>(row) + b;
        const int16_t* x = xq + b * kQK4_0;
        int32_t s = 0;
        for (int j = 0; j < 16; ++j)
          s += ((blk->qs[j] & 0x0f) - 8) * x[j] + ((blk->qs[j] >> 4) - 8) * x[j + 16];
        acc += f16_to_f32(blk->d) * dx[b] * static_cast<float>(s);
      }
      return acc;
    case DType::q4_1:
      // x = d q + m: the min contributes m * dx * sum(xq).
      for (int64_t b = 0; b < qa.K / kQK4_1; ++b) {
        const auto* blk = reinterpret_cast<const BlockQ4_1*>(row) + b;
        const int16_t* x = xq + b * kQK4_1;
        int32_t s = 0;
        for (int j = 0; j < 16; ++j)
          s += (blk->qs[j] & 0x0f) * x[j] + (blk->qs[j] >> 4) * x[j + 16];
        acc += f16_to_f32(blk->d) * dx[b] * static_cast<float>(s) +
               f16_to_f32(blk->m) * (dx[b] * static_cast<float>(s32[b]));
      }
      return acc;
    case DType::q5_0:
    case DType::q5_1:
      // q5_0: x = d (q - 16); q5_1: x = d q + m, the min contributing m * dx * sum(xq).
      for (int64_t b = 0; b < qa.K / 32; ++b) {
        const bool has_min = t == DType::q5_1;
        const uint8_t* blk = row + b * (has_min ? sizeof(BlockQ5_1) : sizeof(BlockQ5_0));
        uint16_t dh, mh = 0;
        std::memcpy(&dh, blk, 2);
        if (has_min) std::memcpy(&mh, blk + 2, 2);
        const uint8_t* qh = blk + (has_min ? 4 : 2);
        const uint32_t hb = q5_high_bits(qh);
        const int16_t* x = xq + b * 32;
        int32_t s = 0;
        for (int j = 0; j < 16; ++j) {
          const int q0 = (qh[4 + j] & 0x0f) | static_cast<int>((hb >> j) & 1) << 4;
          const int q1 = (qh[4 + j] >> 4) | static_cast<int>((hb >> (j + 16)) & 1) << 4;
          s += (has_min ? q0 : q0 - 16) * x[j] + (has_min ? q1 : q1 - 16) * x[j + 16];
        }
        acc += f16_to_f32(dh) * dx[b] * static_cast<float>(s);
        if (has_min) acc += f16_to_f32(mh) * (dx[b] * static_cast<float>(s32[b]));
      }
      return acc;
    case DType::q4_k:
    case DType::q5_k:
      // Per super-block: sum_j sc_j dot_j and sum_j m_j sum_j are exact integers. Q5_K shares
      // Q4_K's scales and nibbles (after its qh), the fifth bit of element l of sub-block j in
      // bit j of qh[l].
      for (int64_t b = 0; b < qa.K / kQK_K; ++b) {
        const bool fifth = t == DType::q5_k;
        const uint8_t* blk = row + b * (fifth ? sizeof(BlockQ5K) : sizeof(BlockQ4K));
        uint16_t d, dmin;
        std::memcpy(&d, blk, 2);
        std::memcpy(&dmin, blk + 2, 2);
        const uint8_t* qh = blk + 16;
        const uint8_t* qs = blk + (fifth ? 48 : 16);
        int32_t isum = 0, msum = 0;
        for (int j = 0; j < 8; ++j) {
          int sc, mn;
          q4_k_scale_min(blk + 4, j, &sc, &mn);
          const uint8_t* q = qs + 32 * (j / 2);
          const int16_t* x = xq + b * kQK_K + 32 * j;
          int32_t s = 0;
          for (int l = 0; l < 32; ++l) {
            const int hi = fifth ? ((qh[l] >> j) & 1) << 4 : 0;
            s += (((q[l] >> (4 * (j % 2))) & 0x0f) | hi) * x[l];
          }
          isum += sc * s;
          msum += mn * s32[b * 8 + j];
        }
        acc += f16_to_f32(d) * dx[b] * static_cast<float>(isum) -
               f16_to_f32(dmin) * dx[b] * static_cast<float>(msum);
      }
      return acc;
    case DType::q2_k:
    case DType::q3_k:
      // 16 groups of 16: sum_g s_g dot_g exact in integers; Q2_K's mins m_g sum_g as well
      // (the 16-element sums from the 32-element ones are not at hand: summed here).
      for (int64_t b = 0; b < qa.K / kQK_K; ++b) {
        const int16_t* x = xq + b * kQK_K;
        int sc[16], mn[16] = {};
        const uint8_t *qs, *hmask = nullptr;
        uint16_t d, dmin = 0;
        if (t == DType::q2_k) {
          const auto* blk = reinterpret_cast<const BlockQ2K*>(row) + b;
          for (int g = 0; g < 16; ++g) sc[g] = blk->scales[g] & 15, mn[g] = blk->scales[g] >> 4;
          qs = blk->qs, d = blk->d, dmin = blk->dmin;
        } else {
          const auto* blk = reinterpret_cast<const BlockQ3K*>(row) + b;
          q3_k_scales(blk->scales, sc);
          qs = blk->qs, hmask = blk->hmask, d = blk->d;
        }
        int32_t isum = 0, msum = 0;
        for (int g = 0; g < 16; ++g) {
          int32_t s = 0, xs = 0;
          for (int e = 16 * g; e < 16 * g + 16; ++e) {
            const int h = e / 128, j = (e % 128) / 32, l = e % 32;
            int q = (qs[32 * h + l] >> (2 * j)) & 3;
            if (hmask && !((hmask[l] >> (4 * h + j)) & 1)) q -= 4;
            s += q * x[e], xs += x[e];
          }
          isum += sc[g] * s;
          msum += mn[g] * xs;
        }
        acc += f16_to_f32(d) * dx[b] * static_cast<float>(isum) -
               f16_to_f32(dmin) * dx[b] * static_cast<float>(msum);
      }
      return acc;
    case DType::q6_k:
      for (int64_t b = 0; b < qa.K / kQK_K; ++b) {
        const auto* blk = reinterpret_cast<const BlockQ6K*>(row) + b;
        int32_t isum = 0;
        for (int g = 0; g < 16; ++g) {
          int32_t s = 0;
          for (int i = 16 * g; i < 16 * g + 16; ++i) {
            const int h = i / 128, r = (i % 128) / 32, l = i % 32;
            const uint8_t lo_byte = blk->ql[64 * h + l + 32 * (r & 1)];
            const int lo = r < 2 ? (lo_byte & 0x0f) : (lo_byte >> 4);
            const int hi = (blk->qh[32 * h + l] >> (2 * r)) & 3;
            s += ((lo | (hi << 4)) - 32) * xq[b * kQK_K + i];
          }
          isum += blk->scales[g] * s;
        }
        acc += f16_to_f32(blk->d) * dx[b] * static_cast<float>(isum);
      }
      return acc;
    default:
      break;
  }
  fail("[matmul_wt] weight type ", dtype_name(t), " is not supported");
}

}  // namespace

void matmul_wt(float* y, int64_t ldy, const float* x, int64_t M, int64_t K, const void* w,
               DType w_type, int64_t N, const float* bias) {
  ops::check_matmul_wt_args(ldy, M, K, w_type, N);
  const int64_t row_bytes = dtype_bytes(w_type, K);
  const auto* wb = static_cast<const uint8_t*>(w);
  const int64_t block = act_block_elems(w_type);
  // Interleaved layouts: each row back in its plain layout first.
  const DType plain = plain_type(w_type);
  std::vector<uint8_t> row(plain != w_type ? static_cast<size_t>(row_bytes) : 0);
  auto plain_row = [&](int64_t n) {
    if (plain == w_type) return wb + n * row_bytes;
    deinterleave_row(w_type, wb, K, n, row.data());
    return static_cast<const uint8_t*>(row.data());
  };
  if (block == 0) {
    // bf16 weights take x rounded to bf16 (ops::matmul_wt); core's conversion, not the SIMD
    // path's, so the two are checked against each other.
    const bool round_x = plain == DType::bf16;
    for (int64_t n = 0; n < N; ++n) {
      const uint8_t* wr = plain_row(n);
      for (int64_t m = 0; m < M; ++m) {
        float acc = 0;
        for (int64_t k = 0; k < K; ++k) {
          const float xv = round_x ? bf16_to_f32(f32_to_bf16(x[m * K + k])) : x[m * K + k];
          acc += xv * weight_f32(plain, wr, k);
        }
        y[m * ldy + n] = bias ? acc + bias[n] : acc;
      }
    }
    return;
  }
  // Own buffers: the reference shares only the activation quantizer with the SIMD path.
  std::vector<int16_t> q(static_cast<size_t>(M * K));
  std::vector<float> d(static_cast<size_t>(M * (K / block)));
  std::vector<int32_t> s32(static_cast<size_t>(M * (K / 32)));
  QuantizedActs qa;
  qa.M = M, qa.K = K, qa.block = block, qa.q = q.data(), qa.d = d.data(), qa.sum32 = s32.data();
  quantize_act_rows(x, qa, 0, M);
  for (int64_t n = 0; n < N; ++n) {
    const uint8_t* wr = plain_row(n);
    for (int64_t m = 0; m < M; ++m) {
      const float acc = dot_row(plain, wr, qa, m);
      y[m * ldy + n] = bias ? acc + bias[n] : acc;
    }
  }
}

void matmul_w(float* dx, int64_t ldx, const float* dy, int64_t M, int64_t N, const void* w,
              DType w_type, int64_t K, bool accumulate) {
  std::vector<float> wf(static_cast<size_t>(N * K));
  for (int64_t j = 0; j < N; ++j) ops::dequantize_row(w, w_type, K, j, wf.data() + j * K);
  std::vector<double> acc(static_cast<size_t>(K));
  for (int64_t i = 0; i < M; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t j = 0; j < N; ++j) {
      const double d = dy[i * N + j];
      const float* wr = wf.data() + j * K;
      for (int64_t k = 0; k < K; ++k) acc[static_cast<size_t>(k)] += d * wr[k];
    }
    float* out = dx + i * ldx;
    for (int64_t k = 0; k < K; ++k)
      out[k] = static_cast<float>((accumulate ? out[k] : 0.0) + acc[static_cast<size_t>(k)]);
  }
}

}  // namespace tessera::cpu::ref
