// AVX512-VNNI kernels of the quantized matmul (quant_avx512_x8.cc): the row-interleaved block
// layouts, int8 dot products with vpdpbusd on zmm. Taken over the AVX2 ones where
// quant_avx512_vnni_active() (quant_matmul_avx2.h).
#pragma once

#include <cstdint>

#include "backend/cpu/quant_avx2_common.h"

namespace tessera::cpu::avx512 {

// Row-interleaved q4_0x8 / q4_1x8 / q8_0x8: the entry of type t, with avx2::x8_rows_fn's
// contract; nullptr for other types. Requires quant_avx512_vnni_active() (quant_matmul_avx2.h).
x8::RowsFn<avx2::TileArgs> x8_rows_fn(DType t);
}  // namespace tessera::cpu::avx512
