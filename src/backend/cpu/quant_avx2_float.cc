// AVX2 tiles for float weights (f32, f16 via F16C, bf16 by shifting) against f32 activations:
// 8 weights widened per step, one FMA per (activation row, weight row) pair; streaming, so
// decode runs at memory speed. And the f16x16 groups' kernel: 16 weight rows per FMA pair.
#include "backend/cpu/quant_avx2_common.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/interleave.h"

namespace tessera::cpu::avx2 {
namespace {

template <DType T>
constexpr int64_t kElemBytes = T == DType::f32 ? 4 : 2;

template <DType T>
TS_AVX2 inline __m256 load_w8(const uint8_t* row, int64_t k) {
  if constexpr (T == DType::f32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + k);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * k));
    if constexpr (T == DType::f16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

template <DType T>
float load_w1(const uint8_t* row, int64_t k) {
  if constexpr (T == DType::f32) {
    float f;
    std::memcpy(&f, row + 4 * k, 4);
    return f;
  } else {
    uint16_t h;
    std::memcpy(&h, row + 2 * k, 2);
    return T == DType::f16 ? f16_to_f32(h) : bf16_to_f32(h);
  }
}

template <DType T>
struct FloatTile {
  template <int MR, int NR>
  struct Tile {
    // 4 chains for one activation row (hides FMA latency), 8 accumulators for 3-4 rows.
    static constexpr int kNR = MR <= 2 ? 4 : 2;
    TS_AVX2 static void run(const TileArgs& t, float* out) {
      const float* x[MR];
      const uint8_t* w[NR];
      for (int a = 0; a < MR; ++a) x[a] = t.x + (t.m0 + a) * t.K;
      for (int j = 0; j < NR; ++j) w[j] = t.w + j * t.row_bytes;
      __m256 acc[MR][NR];
      for (int a = 0; a < MR; ++a)
        for (int j = 0; j < NR; ++j) acc[a][j] = _mm256_setzero_ps();
      // Each weight row is its own stream of a few KiB; a new 4 KiB page stops the hardware
      // prefetcher until it retrains, so ask for the next tile's rows (NR rows further) at the
      // same offset, one line per row every 64 bytes of it.
      constexpr int64_t kSteps = 64 / (8 * static_cast<int64_t>(kElemBytes<T>));
      const int64_t ahead = NR * t.row_bytes;
      int64_t k = 0;
      for (; k + 8 <= t.K; k += 8) {
        __m256 wv[NR];
        if ((k / 8) % kSteps == 0)
          for (int j = 0; j < NR; ++j) prefetch_ahead(w[j] + kElemBytes<T> * k, ahead);
        for (int j = 0; j < NR; ++j) wv[j] = load_w8<T>(w[j], k);
        for (int a = 0; a < MR; ++a) {
          const __m256 xv = _mm256_loadu_ps(x[a] + k);
          for (int j = 0; j < NR; ++j) acc[a][j] = _mm256_fmadd_ps(wv[j], xv, acc[a][j]);
        }
      }
      for (int a = 0; a < MR; ++a)
        for (int j = 0; j < NR; ++j) {
          float s = hsum(acc[a][j]);
          for (int64_t i = k; i < t.K; ++i) s += load_w1<T>(w[j], i) * x[a][i];
          out[a * NR + j] = s;
        }
    }
  };
};

// Eight f16 at p as f32 (F16C, exact).
TS_AVX2 inline __m256 load_h8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// f16x16 (core/interleave.h): MR activation rows against one group of 16 weight rows, whose
// K x 16 halves are read front to back once (one sequential stream, where plain rows are 16).
// Each output keeps two chains, even and odd depths, added at the end: vertical sums (no
// horizontal reduction), and two FMAs in flight per output hide the FMA latency even for one row.
// An output's arithmetic depends on nothing but its row and column, so not on M or the chunking.
// Named accumulators, not arrays: GCC kept an array of them in memory and stored all 12 to the
// stack on every step.
template <int MR>
TS_AVX2 void f16_group_rows(float* y, int64_t ldy, const float* bias, int64_t n, const uint16_t* g,
                            const float* x, int64_t K, int64_t m0) {
  const float* x0 = x + m0 * K;
  const float* x1 = MR > 1 ? x0 + K : x0;
  const float* x2 = MR > 2 ? x0 + 2 * K : x0;
  __m256 e00 = _mm256_setzero_ps(), e01 = e00, o00 = e00, o01 = e00;
  __m256 e10 = e00, e11 = e00, o10 = e00, o11 = e00;
  __m256 e20 = e00, e21 = e00, o20 = e00, o21 = e00;
  // One depth P into chain E (e: even depths, o: odd) of every row.
#define TS_F16_DEPTH(P, E)                                                            \
  {                                                                                   \
    const __m256 w0 = load_h8(g + 16 * (P)), w1 = load_h8(g + 16 * (P) + 8);          \
    __m256 xv = _mm256_broadcast_ss(x0 + (P));                                        \
    E##00 = _mm256_fmadd_ps(w0, xv, E##00), E##01 = _mm256_fmadd_ps(w1, xv, E##01);   \
    if constexpr (MR > 1) {                                                           \
      xv = _mm256_broadcast_ss(x1 + (P));                                             \
      E##10 = _mm256_fmadd_ps(w0, xv, E##10), E##11 = _mm256_fmadd_ps(w1, xv, E##11); \
    }                                                                                 \
    if constexpr (MR > 2) {                                                           \
      xv = _mm256_broadcast_ss(x2 + (P));                                             \
      E##20 = _mm256_fmadd_ps(w0, xv, E##20), E##21 = _mm256_fmadd_ps(w1, xv, E##21); \
    }                                                                                 \
  }
  int64_t k = 0;
  for (; k + 2 <= K; k += 2) {
    // Two depths are one 64-byte line; ask for the line 2 KiB ahead, so a 4 KiB page boundary
    // does not stall the stream while the hardware prefetcher retrains (32000 x 2048 from
    // DRAM: 14.3-15.1 ms with it, 15.4-17.7 without, one thread).
    prefetch_ahead(g + 16 * k, 2048);
    TS_F16_DEPTH(k, e)
    TS_F16_DEPTH(k + 1, o)
  }
  if (k < K) TS_F16_DEPTH(k, e)
#undef TS_F16_DEPTH
  auto store = [&](int a, __m256 lo, __m256 hi) __attribute__((target("avx2,fma,f16c"))) {
    if (bias) {
      lo = _mm256_add_ps(lo, _mm256_loadu_ps(bias + n));
      hi = _mm256_add_ps(hi, _mm256_loadu_ps(bias + n + 8));
    }
    float* out = y + (m0 + a) * ldy + n;
    _mm256_storeu_ps(out, lo);
    _mm256_storeu_ps(out + 8, hi);
  };
  store(0, _mm256_add_ps(e00, o00), _mm256_add_ps(e01, o01));
  if constexpr (MR > 1) store(1, _mm256_add_ps(e10, o10), _mm256_add_ps(e11, o11));
  if constexpr (MR > 2) store(2, _mm256_add_ps(e20, o20), _mm256_add_ps(e21, o21));
}

}  // namespace

void rows_f16x16(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
                 const TileArgs& args) {
  TS_CHECK(n0 % kF16PanelRows == 0 && n1 % kF16PanelRows == 0,
           "[matmul_wt] f16x16 rows must be split on groups of 16 (got ", n0, "..", n1, ")");
  // Up to 3 activation rows per pass over a group (12 accumulators, 2 weight vectors, 1
  // broadcast: 15 of the 16 registers); a group
  // (64 KiB at K = 2048) stays in L2 while all rows pass over it.
  for (int64_t n = n0; n < n1; n += kF16PanelRows) {
    const auto* g = reinterpret_cast<const uint16_t*>(args.w + n * args.row_bytes);
    for (int64_t m = 0; m < M; m += 3) {
      if (M - m == 1)
        f16_group_rows<1>(y, ldy, bias, n, g, args.x, args.K, m);
      else if (M - m == 2)
        f16_group_rows<2>(y, ldy, bias, n, g, args.x, args.K, m);
      else
        f16_group_rows<3>(y, ldy, bias, n, g, args.x, args.K, m);
    }
  }
}

void rows_f32(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
              const TileArgs& args) {
  run_tiles<FloatTile<DType::f32>::Tile>(y, ldy, M, bias, n0, n1, args);
}
void rows_f16(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
              const TileArgs& args) {
  run_tiles<FloatTile<DType::f16>::Tile>(y, ldy, M, bias, n0, n1, args);
}
void rows_bf16(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
               const TileArgs& args) {
  run_tiles<FloatTile<DType::bf16>::Tile>(y, ldy, M, bias, n0, n1, args);
}

}  // namespace tessera::cpu::avx2
