// The q4_0x8 / q4_1x8 / q8_0x8 / q4_kx8 / q5_kx8 / q6_kx8 / f16x16 row-interleaved layouts:
// conversion from and back to plain rows.
#include "core/interleave.h"

#include <cstddef>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace tessera {

namespace {

// Byte offsets inside one interleaved chunk (8 rows x one block).
struct ChunkLayout {
  int64_t block_bytes;      // plain block: d [, m] [, scales], then the quant bytes
  int64_t header;           // bytes of d (and m or dmin) per plain block: 2 or 4
  int64_t scale_bytes = 0;  // q4_K's packed sub-block scales and mins: 12; Q6_K's scales: 16
  // Where d, the scales and the quants sit in the plain block, when not in that order (Q6_K
  // stores quants, scales, then d).
  int64_t d_at = 0, s_at = -1, q_at = -1;
  int64_t scales_at() const { return s_at >= 0 ? s_at : header; }
  int64_t quants_at() const { return q_at >= 0 ? q_at : header + scale_bytes; }
  int64_t chunk() const { return kInterleaveRows * block_bytes; }
  // Where the quant slots start.
  int64_t quants() const { return kInterleaveRows * (header + scale_bytes); }
  // 16-byte pieces per row.
  int64_t runs() const { return (block_bytes - header - scale_bytes) / 16; }
};

ChunkLayout layout_of(DType plain) {
  switch (plain) {
    case DType::q4_0:
      return {static_cast<int64_t>(sizeof(BlockQ4_0)), 2};
    case DType::q4_1:
      return {static_cast<int64_t>(sizeof(BlockQ4_1)), 4};
    case DType::q8_0:
      return {static_cast<int64_t>(sizeof(BlockQ8_0)), 2};
    case DType::q4_k:
      return {static_cast<int64_t>(sizeof(BlockQ4K)), 4, 12};
    case DType::q5_k:  // qh and qs follow the scales: 2 + 8 runs
      return {static_cast<int64_t>(sizeof(BlockQ5K)), 4, 12};
    case DType::q6_k:  // ql then qh: 8 + 4 runs
      return {static_cast<int64_t>(sizeof(BlockQ6K)),
              2,
              16,
              offsetof(BlockQ6K, d),
              offsetof(BlockQ6K, scales),
              offsetof(BlockQ6K, ql)};
    default:
      fail("[interleave] ", dtype_name(plain),
           " has no interleaved layout (q4_0, q4_1, q8_0, q4_k, q5_k, q6_k, f16)");
  }
}

// Offsets of row r's scale, min (q4_1, q4_K), packed scales (q4_K) and first 16 quant bytes
// inside a chunk: the slot s with kInterleaveSlotRow[s] == r of the first run (later 16-byte
// pieces sit one run further each).
struct RowParts {
  int64_t d, m, s, q;
};
RowParts parts_of(const ChunkLayout& l, int r) {
  int slot = 0;
  while (kInterleaveSlotRow[slot] != r) ++slot;
  return {2 * r, 2 * kInterleaveRows + 2 * r, kInterleaveRows * l.header + l.scale_bytes * slot,
          l.quants() + 16 * slot};
}

// f16 -> f16x16, n_rows a multiple of 16: each group transposed from a copy of its plain rows.
void interleave_f16(void* w, int64_t n_rows, int64_t K) {
  TS_CHECK(n_rows >= 0 && n_rows % kF16PanelRows == 0, "[interleave] ", n_rows,
           " rows is not a multiple of ", kF16PanelRows);
  TS_CHECK(K >= 0, "[interleave] negative row length ", K);
  const int64_t group = kF16PanelRows * K;
  std::vector<uint16_t> plain(static_cast<size_t>(group));
  auto* base = static_cast<uint16_t*>(w);
  for (int64_t g = 0; g < n_rows / kF16PanelRows; ++g) {
    uint16_t* dst = base + g * group;
    std::memcpy(plain.data(), dst, static_cast<size_t>(group) * 2);
    for (int64_t r = 0; r < kF16PanelRows; ++r)
      for (int64_t p = 0; p < K; ++p) dst[p * kF16PanelRows + r] = plain[r * K + p];
  }
}

// One 16-byte run holds 16 bytes of each of the 8 rows.
constexpr int64_t kRunBytes = 16 * kInterleaveRows;

// Copies row r's block between its plain form and its places in an interleaved chunk.
void to_chunk(const ChunkLayout& l, const RowParts& at, const uint8_t* blk, uint8_t* chunk) {
  std::memcpy(chunk + at.d, blk + l.d_at, 2);
  if (l.header == 4) std::memcpy(chunk + at.m, blk + l.d_at + 2, 2);
  std::memcpy(chunk + at.s, blk + l.scales_at(), static_cast<size_t>(l.scale_bytes));
  const uint8_t* q = blk + l.quants_at();
  for (int64_t run = 0; run < l.runs(); ++run)
    std::memcpy(chunk + at.q + run * kRunBytes, q + 16 * run, 16);
}
void from_chunk(const ChunkLayout& l, const RowParts& at, const uint8_t* chunk, uint8_t* blk) {
  std::memcpy(blk + l.d_at, chunk + at.d, 2);
  if (l.header == 4) std::memcpy(blk + l.d_at + 2, chunk + at.m, 2);
  std::memcpy(blk + l.scales_at(), chunk + at.s, static_cast<size_t>(l.scale_bytes));
  uint8_t* q = blk + l.quants_at();
  for (int64_t run = 0; run < l.runs(); ++run)
    std::memcpy(q + 16 * run, chunk + at.q + run * kRunBytes, 16);
}

}  // namespace

bool has_interleaved_layout(DType t) {
  return t == DType::q4_0 || t == DType::q4_1 || t == DType::q8_0 || t == DType::q4_k ||
         t == DType::q5_k || t == DType::q6_k || t == DType::f16;
}

DType interleaved_type(DType t) {
  if (t == DType::q4_0) return DType::q4_0x8;
  if (t == DType::q4_1) return DType::q4_1x8;
  if (t == DType::q8_0) return DType::q8_0x8;
  if (t == DType::q4_k) return DType::q4_kx8;
  if (t == DType::q5_k) return DType::q5_kx8;
  if (t == DType::q6_k) return DType::q6_kx8;
  if (t == DType::f16) return DType::f16x16;
  fail("[interleave] ", dtype_name(t),
       " has no interleaved layout (q4_0, q4_1, q8_0, q4_k, q5_k, q6_k, f16)");
}

DType plain_type(DType t) {
  if (t == DType::q4_0x8) return DType::q4_0;
  if (t == DType::q4_1x8) return DType::q4_1;
  if (t == DType::q8_0x8) return DType::q8_0;
  if (t == DType::q4_kx8) return DType::q4_k;
  if (t == DType::q5_kx8) return DType::q5_k;
  if (t == DType::q6_kx8) return DType::q6_k;
  if (t == DType::f16x16) return DType::f16;
  return t;
}

void interleave_rows(DType t, void* w, int64_t n_rows, int64_t K) {
  if (t == DType::f16) return interleave_f16(w, n_rows, K);
  const ChunkLayout l = layout_of(t);
  TS_CHECK(n_rows >= 0 && n_rows % kInterleaveRows == 0, "[interleave] ", n_rows,
           " rows is not a multiple of ", kInterleaveRows);
  const int64_t row_bytes = dtype_bytes(t, K);  // throws unless K is whole blocks
  const int64_t nb = K / traits(t).block_elems, group_bytes = kInterleaveRows * row_bytes;
  std::vector<uint8_t> plain(static_cast<size_t>(group_bytes));
  auto* base = static_cast<uint8_t*>(w);
  for (int64_t g = 0; g < n_rows / kInterleaveRows; ++g) {
    uint8_t* group = base + g * group_bytes;
    std::memcpy(plain.data(), group, static_cast<size_t>(group_bytes));
    for (int r = 0; r < kInterleaveRows; ++r) {
      const RowParts at = parts_of(l, r);
      for (int64_t b = 0; b < nb; ++b)
        to_chunk(l, at, plain.data() + r * row_bytes + b * l.block_bytes, group + b * l.chunk());
    }
  }
}

void deinterleave_row(DType t, const void* w, int64_t K, int64_t row, void* dst) {
  deinterleave_blocks(t, w, K, row, 0, K / traits(t).block_elems, dst);
}

void deinterleave_blocks(DType t, const void* w, int64_t K, int64_t row, int64_t b0,
                         int64_t n_blocks, void* dst) {
  const DType p = plain_type(t);
  TS_CHECK(p != t, "[interleave] ", dtype_name(t), " is not an interleaved layout");
  if (t == DType::f16x16) {
    TS_CHECK(b0 >= 0 && n_blocks >= 0 && b0 + n_blocks <= K, "[interleave] elements ", b0, "+",
             n_blocks, " outside a row of ", K, " elements");
    const auto* group = static_cast<const uint16_t*>(w) + row / kF16PanelRows * kF16PanelRows * K;
    auto* out = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n_blocks; ++i)
      out[i] = group[(b0 + i) * kF16PanelRows + row % kF16PanelRows];
    return;
  }
  const ChunkLayout l = layout_of(p);
  const int64_t row_bytes = dtype_bytes(p, K);
  TS_CHECK(b0 >= 0 && n_blocks >= 0 && (b0 + n_blocks) * traits(p).block_elems <= K,
           "[interleave] blocks ", b0, "+", n_blocks, " outside a row of ", K, " elements");
  const auto* group =
      static_cast<const uint8_t*>(w) + row / kInterleaveRows * kInterleaveRows * row_bytes;
  const int r = static_cast<int>(row % kInterleaveRows);
  const RowParts at = parts_of(l, r);
  for (int64_t b = 0; b < n_blocks; ++b)
    from_chunk(l, at, group + (b0 + b) * l.chunk(), static_cast<uint8_t*>(dst) + b * l.block_bytes);
}

}  // namespace tessera
