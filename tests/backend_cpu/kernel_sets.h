// Runs a test body once per quantized-kernel set this CPU has: with the AVX512-VNNI kernels
// switched off (the AVX2 ones, or the plain tiles the interleaved k-quants fall back to), then
// with them where present (which matmul_wt otherwise always takes there).
#pragma once

#include <gtest/gtest.h>

#include "backend/cpu/quant_matmul_avx2.h"

namespace tessera::test {

template <class Fn>
void for_each_kernel_set(const char* without_vnni, const char* with_vnni, Fn fn) {
  cpu::set_quant_avx512_vnni_allowed(false);
  {
    SCOPED_TRACE(without_vnni);
    fn();
  }
  cpu::set_quant_avx512_vnni_allowed(true);
  if (cpu::quant_avx512_vnni_active()) {
    SCOPED_TRACE(with_vnni);
    fn();
  }
}

}  // namespace tessera::test
