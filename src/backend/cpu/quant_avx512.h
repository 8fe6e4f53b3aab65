// AVX512-VNNI kernels of the quantized matmul (quant_avx512_x8.cc) and the switch that picks them
// over the AVX2 ones (quant_avx512_vnni_active): the row-interleaved block layouts, int8 dot
// products with vpdpbusd on zmm.
#pragma once

#include <cstdint>

#include "backend/cpu/quant_avx2_common.h"

namespace tessera::cpu {

namespace avx512 {
// Row-interleaved q4_0x8 / q4_1x8 / q8_0x8: weight rows [n0, n1) (multiples of 8) against all M
// activation rows, the contract of the avx2:: entries of the same names. Require
// quant_avx512_vnni_active() (quant_matmul_avx2.h).
void rows_q4_0x8(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
                 const avx2::TileArgs& args);
void rows_q4_1x8(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
                 const avx2::TileArgs& args);
void rows_q8_0x8(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
                 const avx2::TileArgs& args);
}  // namespace avx512

}  // namespace tessera::cpu
