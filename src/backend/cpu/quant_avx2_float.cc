// AVX2 tiles for float weights (f32, f16 via F16C, bf16 by shifting) against f32 activations:
// 8 weights widened per step, one FMA per (activation row, weight row) pair; streaming, so
// decode runs at memory speed.
#include "backend/cpu/quant_avx2_common.h"
#include "core/dtype.h"

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

}  // namespace

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
