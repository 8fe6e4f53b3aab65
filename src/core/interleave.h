// Row-interleaved layouts of q4_0 / q4_1 / q8_0 / q4_K / Q5_K / Q6_K matrices (DType q4_0x8,
// q4_1x8, q8_0x8, q4_kx8, q5_kx8, q6_kx8): 8 consecutive rows stored block by block, so one 32-byte
// load feeds the int8 dot products of two rows and one 16-byte load brings 8 rows' scales. And of
// f16 matrices (f16x16): 16 consecutive rows stored column by column, which is the packed GEMM's B
// micro-panel, read in place. The CPU kernels read them; nothing else does.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace tessera {

// Group layout. Rows 8g..8g+7 of a matrix with K columns occupy the same bytes as in the plain
// layout (8 * dtype_bytes(base, K) from row 8g's offset). Within the group, block b is one chunk
// of 8 * block_bytes: the 8 rows' f16 scales d (row order), for q4_1 their 8 f16 mins m, then
// the 8 rows' quant bytes in slot order kInterleaveSlotRow, 16 bytes per row and slot (slots 2i
// and 2i+1 share one 32-byte load: rows i and i + 4, which a horizontal-add tree turns back into
// row order). q8_0's 32 quant bytes per row come as two such runs of 8 slots: every row's bytes
// 0-15, then every row's bytes 16-31.
constexpr int64_t kInterleaveRows = 8;
constexpr int kInterleaveSlotRow[kInterleaveRows] = {0, 4, 1, 5, 2, 6, 3, 7};

// q4_kx8 group layout. Rows 8g..8g+7 occupy the same bytes as in the plain layout; super-block b
// is one chunk of 8 x 144 bytes: the 8 rows' f16 d (row order), their f16 dmin (row order), their
// 12 packed scale bytes in slot order (slots 0-3, rows 0, 4, 1, 5, first: one 48-byte run per
// half of a 64-byte register's four rows), then 8 runs of 128 bytes, run 2c + p holding bytes
// 32c + 16p .. 32c + 16p + 15 of every row's qs in slot order. So one 64-byte load holds 16 quant
// bytes of four rows, as in q4_0x8, and the nibbles of runs 2c and 2c + 1 are sub-blocks 2c (low)
// and 2c + 1 (high).
// q5_kx8 is the same with Q5_K's 32 qh bytes per row between the scales and the quants: 2 runs
// of 128 bytes, run p holding qh bytes 16p .. 16p + 15 of every row in slot order (the fifth
// bits of the elements the quant runs 2c + p hold), so its quants start 256 bytes later.
constexpr int64_t kQ4KX8ChunkBytes = kInterleaveRows * sizeof(BlockQ4K);
constexpr int64_t kQ5KX8ChunkBytes = kInterleaveRows * sizeof(BlockQ5K);
constexpr int64_t kQ4KX8ScalesAt = 2 * 2 * kInterleaveRows;
constexpr int64_t kQ4KX8QuantsAt = kQ4KX8ScalesAt + 12 * kInterleaveRows;
constexpr int64_t kQ5KX8HighBitsAt = kQ4KX8QuantsAt;
constexpr int64_t kQ5KX8QuantsAt = kQ5KX8HighBitsAt + 32 * kInterleaveRows;

// q6_kx8 group layout: per super-block a chunk of 8 x 210 bytes: the 8 rows' f16 d (row order),
// their 16 int8 group scales in slot order (16 bytes per row), then 8 runs of 128 bytes of ql
// (run k: bytes 16k .. 16k + 15 of every row's ql, slot order) and 4 of qh, as in q4_kx8.
constexpr int64_t kQ6KX8ChunkBytes = kInterleaveRows * sizeof(BlockQ6K);
constexpr int64_t kQ6KX8ScalesAt = 2 * kInterleaveRows;
constexpr int64_t kQ6KX8LowAt = kQ6KX8ScalesAt + 16 * kInterleaveRows;
constexpr int64_t kQ6KX8HighAt = kQ6KX8LowAt + 128 * kInterleaveRows;

// f16x16 group layout. Rows 16g..16g+15 (K columns) occupy the same bytes as in the plain layout,
// element (16g + r, p) at half 16p + r of the group: the 16 rows' element p are one 32-byte run.
// With K = 2048 a group is 64 KiB, read front to back by every kernel (one sequential stream).
constexpr int64_t kF16PanelRows = 16;

// True for the interleaved layouts themselves (q4_0x8, q4_1x8, q8_0x8, q4_kx8, q5_kx8, q6_kx8,
// f16x16).
inline bool is_interleaved(DType t) {
  return traits(t).interleave_rows > 1;
}
// True for the types that have an interleaved layout (q4_0, q4_1, q8_0, q4_k, q5_k, q6_k, f16).
bool has_interleaved_layout(DType t);
// q4_0 -> q4_0x8, q4_1 -> q4_1x8, q8_0 -> q8_0x8, q4_k -> q4_kx8, q5_k -> q5_kx8, q6_k ->
// q6_kx8, f16 -> f16x16 (throws for other types).
DType interleaved_type(DType t);
// The inverse of interleaved_type; any other type is returned unchanged.
DType plain_type(DType t);

// Rewrites n_rows rows of K elements of `t` (q4_0, q4_1, q8_0, q4_k, q5_k, q6_k, f16; n_rows a
// multiple of the group, traits(interleaved_type(t)).interleave_rows; K of the block) at w from the
// plain layout to interleaved_type(t), in place. Throws Error naming the bad size.
void interleave_rows(DType t, void* w, int64_t n_rows, int64_t K);

// Row `row` of an interleaved matrix (an interleaved type, K columns) in the plain layout of
// plain_type(t) at dst (dtype_bytes(plain_type(t), K) bytes).
void deinterleave_row(DType t, const void* w, int64_t K, int64_t row, void* dst);
// Blocks [b0, b0 + n_blocks) of that row, in the plain layout at dst (f16x16: elements).
void deinterleave_blocks(DType t, const void* w, int64_t K, int64_t row, int64_t b0,
                         int64_t n_blocks, void* dst);

}  // namespace tessera
