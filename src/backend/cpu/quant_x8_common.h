// What the kernels of the row-interleaved q4_0x8 / q4_1x8 / q8_0x8 layouts share whatever their
// instruction set (quant_avx2_x8.cc, quant_avx512_x8.cc): the chunk sizes, and the loop that
// hands each group of 8 weight rows to a tile kernel with a few activation rows at a time.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>

#include "backend/cpu/quant_act.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/interleave.h"

namespace tessera::cpu::x8 {

// The three interleaved formats; they differ in the chunk header and in how a pair of rows'
// quants becomes partial sums.
enum class X8 { q4_0, q4_1, q8_0 };

template <X8 F>
constexpr int64_t kScaleBytes = F == X8::q4_1 ? 32 : 16;  // d (and m) of 8 rows
template <X8 F>
constexpr int64_t kChunkBytes = kScaleBytes<F> + (F == X8::q8_0 ? 256 : 128);  // 8 rows x 1 block

// Rows m0 .. m0 + MR - 1 of the quantized activations, as a tile kernel reads them.
template <int MR>
struct ActRows {
  const int8_t* q[MR];
  const float* d[MR];
  const int16_t* sum32[MR];
  const float* dsum[MR];
  ActRows(const ActsQ8& acts, int64_t m0) {
    for (int a = 0; a < MR; ++a) {
      q[a] = acts.row_q(m0 + a), d[a] = acts.row_d(m0 + a);
      sum32[a] = acts.row_sum32(m0 + a), dsum[a] = acts.row_dsum(m0 + a);
    }
  }
};

// A tile kernel: out[a * 8 + r] = dot(weight row r of the group at g, activation row m0 + a)
// for its fixed number of activation rows. Args is the kernel family's argument struct.
template <class Args>
using GroupTile = void (*)(const uint8_t* g, const Args& args, int64_t m0, float* out);

// A rows entry (the avx2::rows_* contract): weight rows [n0, n1), all M activation rows.
template <class Args>
using RowsFn = void (*)(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
                        const Args& args);

// Weight rows [n0, n1) (whole groups of 8, row_bytes apart from w) against activation rows
// [0, M), into y (row stride ldy) plus bias. Activation rows go in blocks of 64 (128 KiB of
// int8 at K = 2048) so that a block and the task's weight rows both stay in L2; inside a block
// each group's 8 rows (under 18 KiB at K = 4096) stay in L1 while the block's rows pass over
// them, tiles.size() at a time (the last pass takes the rest).
template <class Args, size_t N>
void run_groups(const std::array<GroupTile<Args>, N>& tiles, float* y, int64_t ldy, int64_t M,
                const float* bias, int64_t n0, int64_t n1, const Args& args) {
  const uint8_t* w = args.w;
  const int64_t row_bytes = args.row_bytes;
  TS_CHECK(n0 % kInterleaveRows == 0 && n1 % kInterleaveRows == 0,
           "[matmul_wt] interleaved rows must be split on groups of 8 (got ", n0, "..", n1, ")");
  constexpr int64_t kRowBlock = 64;
  float out[N * kInterleaveRows];
  for (int64_t m0 = 0; m0 < M; m0 += kRowBlock) {
    const int64_t m1 = std::min(M, m0 + kRowBlock);
    for (int64_t n = n0; n < n1; n += kInterleaveRows) {
      const uint8_t* g = w + n * row_bytes;
      for (int64_t m = m0; m < m1; m += static_cast<int64_t>(N)) {
        const int64_t rows = std::min<int64_t>(static_cast<int64_t>(N), m1 - m);
        tiles[static_cast<size_t>(rows - 1)](g, args, m, out);
        for (int64_t a = 0; a < rows; ++a)
          for (int64_t r = 0; r < kInterleaveRows; ++r) {
            const float v = out[kInterleaveRows * a + r];
            y[(m + a) * ldy + n + r] = bias ? v + bias[n + r] : v;
          }
      }
    }
  }
}

// Format F's rows entry over Tile<F, MR>::run for MR = 1..N activation rows (N: as many as one
// pass over a group can serve in registers).
template <template <X8, int> class Tile, int N, X8 F, class Args>
void rows(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
          const Args& args) {
  static constexpr auto tiles = []<size_t... R>(std::index_sequence<R...>) {
    return std::array<GroupTile<Args>, N>{&Tile<F, static_cast<int>(R) + 1>::run...};
  }
  (std::make_index_sequence<N>());
  run_groups(tiles, y, ldy, M, bias, n0, n1, args);
}

// The rows entry of an interleaved type (q4_0x8, q4_1x8, q8_0x8); nullptr for any other.
template <template <X8, int> class Tile, int N, class Args>
RowsFn<Args> rows_for(DType t) {
  switch (t) {
    case DType::q4_0x8:
      return &rows<Tile, N, X8::q4_0, Args>;
    case DType::q4_1x8:
      return &rows<Tile, N, X8::q4_1, Args>;
    case DType::q8_0x8:
      return &rows<Tile, N, X8::q8_0, Args>;
    default:
      return nullptr;
  }
}

}  // namespace tessera::cpu::x8
