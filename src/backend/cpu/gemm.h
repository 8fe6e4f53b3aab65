// Packed CPU GEMM (Goto/BLIS style): blocking parameters and the entry that takes them, so tests
// can force tiny blocks and exercise every loop edge with small matrices.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "ops/ops.h"

namespace tessera::cpu {

// Cache blocking of the packed GEMM. kc: depth of one packed panel pair (A micro-panel + B
// micro-panel stay in L1); mc: rows of the packed A block (stays in L2); nc: columns of the
// packed B block (stays in L3). 0 means "the default for the running SIMD target". Values are
// rounded up to multiples of the micro-tile.
// `kernel` picks the micro-kernel: automatic takes the bf16 dot-product kernel for bf16 compute
// (round_bf16, or both operands bf16) where the CPU has AVX512-BF16, else the f32 FMA kernel;
// tests and benchmarks force one (forcing bf16_dot on a CPU without it throws).
enum class GemmKernel { automatic, f32_fma, bf16_dot };
struct GemmBlocking {
  int64_t mc = 0, kc = 0, nc = 0;
  GemmKernel kernel = GemmKernel::automatic;
};

// The kernel cpu::gemm takes for a product of m rows with bf16 compute (bf16_compute) or not.
GemmKernel gemm_kernel_for(bool bf16_compute, int64_t m);
// "f32 FMA (AVX3_DL)", "bf16 dot (avx512-bf16)": the kernel a training step's products take.
std::string gemm_kernel_name(GemmKernel kernel);
// True where this CPU has the bf16 dot-product kernel (AVX512-BF16 with AVX512BW/VL).
bool gemm_bf16_supported();

// cpu::gemm (cpu_kernels.h) with explicit blocking; results do not depend on the blocking of
// M and N nor on the thread count (each output's K loop order is fixed by kc alone).
void gemm_blocked(ThreadPool& pool, const ops::GemmArgs& g, const GemmBlocking& blocking);

// The AVX512-BF16 kernel behind gemm_blocked (gemm_bf16.cc): every operand rounded to bf16, f32
// accumulation. Arguments already validated, m, n, k > 0; throws where the CPU lacks the
// instruction.
void gemm_bf16(ThreadPool& pool, const ops::GemmArgs& g, const GemmBlocking& blocking);

// y (M,N) = x (M,K) W^T [+ bias (N)] with W (N,K) stored as w_type (f32, f16, bf16 or a block
// type; K a whole number of blocks), through the packed f32 kernel: W's panels are widened to
// f32 while packed, once per depth block and shared by all M rows, and x is used as is (no
// 8-bit activations), except that bf16 weights take x rounded to bf16 while packed (the rule of
// ops::matmul_wt). Any M; worth it over the integer kernels of matmul_wt once M is large enough
// to amortize the widening (cpu::matmul_wt decides). kc is rounded up to whole blocks.
void gemm_wt(ThreadPool& pool, float* y, int64_t ldy, const float* x, int64_t M, int64_t K,
             const void* w, DType w_type, int64_t N, const float* bias);
void gemm_wt_blocked(ThreadPool& pool, float* y, int64_t ldy, const float* x, int64_t M, int64_t K,
                     const void* w, DType w_type, int64_t N, const float* bias,
                     const GemmBlocking& blocking);

// Micro-tile of the running SIMD target: mr rows x nr columns of C per micro-kernel call.
struct GemmTile {
  int64_t mr = 0, nr = 0;
};
GemmTile gemm_tile();

namespace gemm_detail {
// Per-thread pack buffer `slot` (0: A block, 1: B block, 2: staging of widened weights) of at least
// `floats` floats, 64-byte aligned; grown on demand and reused by later calls on the same thread.
float* pack_buffer(int slot, size_t floats);

// Splits C (m,n) into a tm x tn grid of thread rectangles (whole mr x nr micro-tiles) minimizing
// the slowest thread's modelled time: its multiply-adds (mt*nt*k at macs_per_cycle) plus its
// packing (B once per depth block: nt*k elements at b_pack_cost each; A once per nc block:
// mt*k*ceil(nt/nc)), ~1 element per cycle. Below ~1 MFLOP one thread (a pool hand-off costs
// microseconds); else threads = pool.size(). Calls rect(m0, m1, n0, n1) once per rectangle on
// its own thread; rectangles are disjoint, so no two threads write the same element of C.
template <class Rect>
void run_grid(ThreadPool& pool, int64_t m, int64_t n, int64_t k, int64_t mr, int64_t nr, int64_t nc,
              double b_pack_cost, double macs_per_cycle, const Rect& rect) {
  const int threads = 2.0 * m * n * k < 1e6 ? 1 : pool.size();
  const int64_t pm = (m + mr - 1) / mr, pn = (n + nr - 1) / nr;
  int tm = 1, tn = 1;
  double best = -1;
  for (int t = 1; t <= threads; ++t) {
    const int u = threads / t;
    if (t > pm && t > 1) break;
    const double mt = static_cast<double>((pm + t - 1) / t * mr);
    const double nt = static_cast<double>((pn + u - 1) / u * nr);
    const double cost = mt * nt / macs_per_cycle + b_pack_cost * nt +
                        mt * static_cast<double>((static_cast<int64_t>(nt) + nc - 1) / nc);
    if (best < 0 || cost < best) best = cost, tm = t, tn = u;
  }
  if (tm * tn == 1) {
    rect(int64_t{0}, m, int64_t{0}, n);
    return;
  }
  pool.run([&](int t) {
    if (t >= tm * tn) return;
    const int64_t ti = t / tn, tj = t % tn;
    rect(std::min(m, pm * ti / tm * mr), std::min(m, pm * (ti + 1) / tm * mr),
         std::min(n, pn * tj / tn * nr), std::min(n, pn * (tj + 1) / tn * nr));
  });
}

// Goto's loops over one thread's rectangle C[m0:m1, n0:n1] (a B block of nc x kc stays in L3, an
// A block of mc x kc in L2, micro-panels in L1), shared by the f32 and the bf16 kernels, which
// differ only in panel format and micro-kernel. pack_b(jc, nc, pc, kc) and pack_a(ic, mc, pc, kc)
// fill this thread's buffers; tile(i, ir, j, jr, pc, kc, rows, cols, load_c, bias) computes the
// micro-tile at C[i, j] (rows x cols: kMR x kNR except at an edge; A panel ir of the A block, B
// panel jr of the B block), starting from C when load_c (a later depth block, or accumulating)
// and adding bias (the first depth block's columns) unless null.
// Always inlined, so that the caller's SIMD target reaches the loops and its tile callback (the
// micro-kernel) is inlined into them as it was before they were shared.
template <int64_t kMR, int64_t kNR, class PackB, class PackA, class Tile>
[[gnu::always_inline]] inline void goto_loops(int64_t m0, int64_t m1, int64_t n0, int64_t n1,
                                              int64_t k, int64_t mc_blk, int64_t kc_blk,
                                              int64_t nc_blk, bool accumulate, const float* bias,
                                              const PackB& pack_b, const PackA& pack_a,
                                              const Tile& tile) {
  for (int64_t jc = n0; jc < n1; jc += nc_blk) {
    const int64_t nc = std::min(nc_blk, n1 - jc);
    for (int64_t pc = 0; pc < k; pc += kc_blk) {
      const int64_t kc = std::min(kc_blk, k - pc);
      pack_b(jc, nc, pc, kc);
      const bool load_c = pc > 0 || accumulate;
      const float* bias_pc = pc == 0 ? bias : nullptr;
      for (int64_t ic = m0; ic < m1; ic += mc_blk) {
        const int64_t mc = std::min(mc_blk, m1 - ic);
        pack_a(ic, mc, pc, kc);
        for (int64_t jr = 0; jr < nc; jr += kNR) {
          const int64_t cols = std::min(kNR, nc - jr);
          const float* bias_j = bias_pc ? bias_pc + jc + jr : nullptr;
          for (int64_t ir = 0; ir < mc; ir += kMR)
            tile(ic + ir, ir, jc + jr, jr, pc, kc, std::min(kMR, mc - ir), cols, load_c, bias_j);
        }
      }
    }
  }
}

// A partial tile (rows x cols inside kMR x kNR) goes through an aligned full-size scratch tile,
// so the micro-kernel's arithmetic, and with it every output bit, is that of a full tile.
// kernel(tile, ld, load_c, bias) computes one full tile at `tile` (leading dimension ld).
template <int64_t kMR, int64_t kNR, class Kernel>
void edge_tile(const Kernel& kernel, float* c, int64_t ldc, int64_t rows, int64_t cols, bool load_c,
               const float* bias) {
  alignas(64) float tile[kMR * kNR];
  alignas(64) float bias_tile[kNR];
  std::memset(tile, 0, sizeof(tile));
  const auto row_bytes = static_cast<size_t>(cols) * sizeof(float);
  if (load_c)
    for (int64_t r = 0; r < rows; ++r) std::memcpy(tile + r * kNR, c + r * ldc, row_bytes);
  if (bias) {
    std::memset(bias_tile, 0, sizeof(bias_tile));
    std::memcpy(bias_tile, bias, row_bytes);
  }
  kernel(tile, kNR, load_c, bias ? bias_tile : nullptr);
  for (int64_t r = 0; r < rows; ++r) std::memcpy(c + r * ldc, tile + r * kNR, row_bytes);
}
}  // namespace gemm_detail

}  // namespace tessera::cpu
