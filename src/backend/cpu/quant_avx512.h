// AVX512-VNNI kernels of the quantized matmul: the row-interleaved block layouts
// (quant_avx512_x8.cc, vpdpbusd on zmm; quant_avx512_kquant_x8.cc, q4_kx8 / q5_kx8) and the
// k-quant tiles (quant_avx512_kquant.cc). Taken
// over the AVX2 ones where quant_avx512_vnni_active() (quant_matmul_avx2.h).
#pragma once

#include <cstdint>

#include "backend/cpu/quant_avx2_common.h"

namespace tessera::cpu::avx512 {

// Row-interleaved q4_0x8 / q4_1x8 / q8_0x8: the entry of type t, with avx2::x8_rows_fn's
// contract; nullptr for other types. Requires quant_avx512_vnni_active() (quant_matmul_avx2.h).
x8::RowsFn<avx2::TileArgs> x8_rows_fn(DType t);

// Q4_K / Q5_K / Q6_K on zmm (quant_avx512_kquant.cc): the entry of type t with avx2::rows_q4_k's
// contract, nullptr for other types. Requires quant_avx512_vnni_active().
using KQuantRowsFn = void (*)(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0,
                              int64_t n1, const avx2::TileArgs& args);
KQuantRowsFn kquant_rows_fn(DType t);

// Row-interleaved q4_kx8 / q5_kx8 (quant_avx512_kquant_x8.cc): the entry of type t (n0 and n1
// multiples of 8), nullptr for other types. Requires quant_avx512_vnni_active().
KQuantRowsFn kquant_x8_rows_fn(DType t);
}  // namespace tessera::cpu::avx512
