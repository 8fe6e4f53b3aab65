// The bf16 products of the CPU attention kernel (attention.cc) on AVX512-BF16 dot products
// (vdpbf16ps): operands packed as words of two bf16 (rounded to nearest even from f32, the
// first of the pair in the low half), f32 accumulation. The tiling, the online softmax and every
// statistic stay in attention.cc, in f32; only the score and output products change. Reached
// only where supported() (the CPU reports the instruction).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tessera::cpu::attention_bf16 {

bool supported();

// dst (n, Dh words) = rows of src (n, D; row stride ld) times mul, as pairs along d; words past
// D are zero (Dh >= (D + 1) / 2).
void pack_rows_along_d(uint32_t* dst, size_t Dh, const float* src, size_t ld, size_t n, size_t D,
                       float mul);
// Tiles of kc keys, pairs along d: tile t is (Dh, kc) words at dst + t * Dh * kc, word (p, c)
// holding row t*kc + c's elements 2p and 2p+1; keys past n are zero.
void pack_tiles_along_d(uint32_t* dst, size_t Dh, size_t kc, const float* src, size_t ld, size_t n,
                        size_t D);
// dst ((n + 1) / 2, Dp words) = rows of src (n, D; stride ld) times mul, interleaved in pairs of
// rows: word (q, d) holds rows 2q and 2q+1 at d; zero past n rows and past D columns.
void pack_row_pairs(uint32_t* dst, size_t Dp, const float* src, size_t ld, size_t n, size_t D,
                    float mul);
// dst (rows, cols / 2 words; stride ldd) = pairs along the columns of src (rows, cols; stride
// ld); cols even.
void pairs_along_columns(uint32_t* dst, size_t ldd, const float* src, size_t ld, size_t rows,
                         size_t cols);
// c (rows, ncols; stride ldc) = [c +] A (rows, P words) * b (P, ncols words; stride ldb), A(r, p)
// = a[r * a_rs + p * a_ps] (row-major A: a_ps = 1; a row-pair pack read as A^T: a_rs = 1), each
// word a pair of products summed in f32. ncols is a multiple of 16.
void dot(float* c, size_t ldc, const uint32_t* a, size_t a_rs, size_t a_ps, size_t rows,
         const uint32_t* b, size_t ldb, size_t P, size_t ncols, bool accumulate);

}  // namespace tessera::cpu::attention_bf16
