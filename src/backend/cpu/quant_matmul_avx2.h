// AVX2 (+FMA, F16C) matmul against weights in their stored format, for CPUs that have it: int8
// activations and vpmaddubsw for the block formats, F16C widening for f16. cpu::matmul_wt picks
// it at run time; tests call it and the Highway path directly.
#pragma once

#include <cstdint>

#include "backend/cpu/quant_act.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "ops/quant.h"

namespace tessera::cpu {

// True when the CPU runs AVX2, FMA and F16C (the kernels below may be called).
bool quant_avx2_supported();

// True where the CPU also runs AVX512F/BW/VL and AVX512-VNNI and tests have not switched them
// off: matmul_wt_avx2 and its group form then run the row-interleaved q4_0x8 / q4_1x8 / q8_0x8
// layouts on the vpdpbusd kernels of quant_avx512_x8.cc (the other types stay on AVX2).
bool quant_avx512_vnni_active();

// Tests: false makes quant_avx512_vnni_active() false, so a CPU that has AVX512-VNNI checks the
// AVX2 kernels too; true restores the CPU's answer. Not for use while kernels run.
void set_quant_avx512_vnni_allowed(bool allowed);

// cpu::matmul_wt's contract (arguments already checked), AVX2 kernels. Requires
// quant_avx2_supported().
void matmul_wt_avx2(ThreadPool& pool, float* y, int64_t ldy, const float* x, int64_t M, int64_t K,
                    const void* w, DType w_type, int64_t N, const float* bias);

// cpu::matmul_wt_group's contract (arguments already checked), AVX2 kernels: products whose
// weights take the same activation blocks share one quantization of x, and all their rows are
// spread over the threads in one hand-off. Each y equals matmul_wt_avx2's, bit for bit.
void matmul_wt_group_avx2(ThreadPool& pool, const float* x, int64_t M, int64_t K,
                          const ops::WtProduct* products, int64_t n_products);

// cpu::matmul_wt's contract with the Highway kernels (int16 activations), whatever the CPU.
void matmul_wt_highway(ThreadPool& pool, float* y, int64_t ldy, const float* x, int64_t M,
                       int64_t K, const void* w, DType w_type, int64_t N, const float* bias);

// quantize_act_rows into int8 (the same integers and scales) plus the sums of ActsQ8, AVX2.
// Requires quant_avx2_supported().
void quantize_acts_q8_avx2(const float* x, const ActsQ8& qa, int64_t m0, int64_t m1);

// Weight rows per task of the row loop (N rows of row_bytes): decode (M <= 4) products under
// 128 KiB run as one task, larger ones in ~32 KiB tasks that balance over threads; prefill uses
// ~64 KiB tasks (a task's weights stay in L2 while all activation rows pass over them). A multiple
// of 8 rows and of `group` (the rows an interleaved layout groups, traits().interleave_rows: a
// group is never split); depends on the problem only (and results do not depend on it at all).
int64_t quant_rows_per_task(int64_t M, int64_t row_bytes, int64_t N, int64_t group);

}  // namespace tessera::cpu
