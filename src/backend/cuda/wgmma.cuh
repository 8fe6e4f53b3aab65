// Hopper warpgroup MMA (wgmma.mma_async, sm_90a only) for the FlashAttention kernels: 128-byte
// swizzled shared-memory descriptors, the fence / commit / wait protocol, and the m64nNk16 forms
// they issue (N = 64 or 128): both operands from shared memory (B K-major or MN-major) and A from
// registers with an MN-major B.
//
// Accumulator fragments (PTX ISA, "wgmma .m64nNk16 register fragment layout"): warp w of the
// warpgroup owns rows 16w..16w+15; with g = lane / 4 and c = lane % 4, d[j][0..1] are (row g,
// cols 8j + 2c, 8j + 2c + 1) and d[j][2..3] the same columns of row g + 8: per warp exactly the
// m16n8 layout of mma.sync. The register A operand of m64nNk16 has, per warp, the m16n8k16 A
// layout, so an S accumulator pair (2j, 2j + 1) packed to 16 bits is P's k-step j, as in the
// mma.sync kernel.
//
// Shared-memory operands use the 128-byte swizzle: a tile is stored in column blocks of 64
// 16-bit elements (128 bytes per row), each block's rows back to back, and the 16-byte chunk c of
// row r is stored at chunk c ^ (r & 7) (address bits 4-6 XOR bits 7-9, so a block must start on
// a 1024-byte boundary). For a K-major operand (Q, and K as the B of Q K^T) the descriptor's
// stride offset is 1024 bytes (from one 8-row group to the next), the leading offset unused, and
// a k-step of 16 elements inside a 64-wide block adds 32 bytes to the start address. For the
// MN-major B of P V (V rows are keys = k, contiguous along D = n; transposed by the instruction)
// the stride offset is again 1024 bytes (8 keys to the next 8), and the leading offset is the
// distance between 64-wide column blocks of D.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace tessera::cuda::wgmma {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TESSERA_HAS_WGMMA 1
#else
#define TESSERA_HAS_WGMMA 0
#endif

// Descriptor of a 128-byte-swizzled operand starting at shared address `addr` (bits 0-13: start
// address >> 4; 16-29: leading byte offset >> 4; 32-45: stride byte offset >> 4; 49-51: base
// offset, 0 for 1024-byte aligned blocks; 62-63: swizzle mode, 1 = 128 bytes).
__host__ __device__ constexpr uint64_t sw128_desc(uint32_t addr, uint32_t leading_bytes,
                                                  uint32_t stride_bytes) {
  return (static_cast<uint64_t>((addr & 0x3FFFF) >> 4)) |
         (static_cast<uint64_t>((leading_bytes >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((stride_bytes >> 4) & 0x3FFF) << 32) | (uint64_t{1} << 62);
}

// Byte offset, inside one 64-element column block of `rows` rows, of 16-byte chunk `chunk`
// (0..7) of row `row` under the 128-byte swizzle.
__host__ __device__ constexpr uint32_t sw128_offset(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

#if TESSERA_HAS_WGMMA

// Orders this thread's register and shared-memory accesses before the wgmma that follow.
__device__ inline void fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ inline void commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ inline void wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}
// Makes shared memory written through the generic proxy (cp.async, st.shared) visible to the
// async proxy that wgmma reads through; each writer calls it before the barrier.
__device__ inline void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Pins accumulator registers in place: the compiler may not move their reads before the wait
// (or their writes after the next fence) across this point.
template <int kRows>
__device__ inline void fence_operands(float (&d)[kRows][4]) {
#pragma unroll
  for (int j = 0; j < kRows; ++j)
    asm volatile("" : "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])::"memory");
}

// Pins P's 16-bit pairs, the register A operand that wgmma reads asynchronously: the compiler
// may not rewrite them between the fence and the wait.
template <int kSteps>
__device__ inline void fence_operands(uint32_t (&a)[kSteps][4]) {
#pragma unroll
  for (int j = 0; j < kSteps; ++j)
    asm volatile("" : "+r"(a[j][0]), "+r"(a[j][1]), "+r"(a[j][2]), "+r"(a[j][3])::"memory");
}

// Operand lists: the accumulator registers as the asm string names them (%0..) and as
// in-out operands, for 32 (N = 64) and 64 (N = 128) accumulators.
#define TESSERA_WGMMA_LIST32                                                         \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, " \
  "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define TESSERA_WGMMA_REGS32 "{" TESSERA_WGMMA_LIST32 "}, "
#define TESSERA_WGMMA_REGS64                                                           \
  "{" TESSERA_WGMMA_LIST32                                                             \
  ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
#define TESSERA_WGMMA_OUT32                                                                     \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),     \
      "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), \
      "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
      "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), \
      "+f"(d[7][2]), "+f"(d[7][3])
#define TESSERA_WGMMA_OUT64                                                                        \
  TESSERA_WGMMA_OUT32, "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]), "+f"(d[9][0]),  \
      "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), \
      "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),              \
      "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]),              \
      "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]),              \
      "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]),              \
      "+f"(d[15][3])

// The asm statements, once each; TY is the PTX input type ("bf16" or "f16"). SS: d (64 x N) =
// [d +] A (64 x 16, shared, K-major) B (16 x N, shared; TB "0" K-major, "1" MN-major),
// scale-a = scale-b = 1. RS: d = [d +] A (64 x 16, registers) B (16 x N, shared, MN-major:
// trans-b = 1). `accumulate` 0 drops d's old value (scale-d false).
#define TESSERA_WGMMA_SS_N64(TY, TB)                                                   \
  asm volatile(                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                     \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " TESSERA_WGMMA_REGS32 \
      "%32, %33, p, 1, 1, 0, " TB ";\n}\n"                                             \
      : TESSERA_WGMMA_OUT32                                                            \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))

#define TESSERA_WGMMA_SS_N128(TY, TB)                                                   \
  asm volatile(                                                                         \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"                                      \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " TESSERA_WGMMA_REGS64 \
      "%64, %65, p, 1, 1, 0, " TB ";\n}\n"                                              \
      : TESSERA_WGMMA_OUT64                                                             \
      : "l"(desc_a), "l"(desc_b), "r"(accumulate))

#define TESSERA_WGMMA_RS_N64(TY)                                                       \
  asm volatile(                                                                        \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                     \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " TESSERA_WGMMA_REGS32 \
      "{%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                                    \
      : TESSERA_WGMMA_OUT32                                                            \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))

#define TESSERA_WGMMA_RS_N128(TY)                                                       \
  asm volatile(                                                                         \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                      \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " TESSERA_WGMMA_REGS64 \
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"                                     \
      : TESSERA_WGMMA_OUT64                                                             \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))

// The member functions of Mma<T>, written once for both input types (TY as above).
#define TESSERA_WGMMA_MEMBERS(TY)                                                          \
  /* kTransB false: B (16 x N) stored K-major; true: MN-major. */                          \
  template <bool kTransB = false>                                                          \
  __device__ static void ss_n64(float(&d)[8][4], uint64_t desc_a, uint64_t desc_b,         \
                                int accumulate) {                                          \
    if constexpr (kTransB) {                                                               \
      TESSERA_WGMMA_SS_N64(TY, "1");                                                       \
    } else {                                                                               \
      TESSERA_WGMMA_SS_N64(TY, "0");                                                       \
    }                                                                                      \
  }                                                                                        \
  template <bool kTransB = false>                                                          \
  __device__ static void ss_n128(float(&d)[16][4], uint64_t desc_a, uint64_t desc_b,       \
                                 int accumulate) {                                         \
    if constexpr (kTransB) {                                                               \
      TESSERA_WGMMA_SS_N128(TY, "1");                                                      \
    } else {                                                                               \
      TESSERA_WGMMA_SS_N128(TY, "0");                                                      \
    }                                                                                      \
  }                                                                                        \
  __device__ static void rs_n64(float(&d)[8][4], const uint32_t(&a)[4], uint64_t desc_b,   \
                                int accumulate) {                                          \
    TESSERA_WGMMA_RS_N64(TY);                                                              \
  }                                                                                        \
  __device__ static void rs_n128(float(&d)[16][4], const uint32_t(&a)[4], uint64_t desc_b, \
                                 int accumulate) {                                         \
    TESSERA_WGMMA_RS_N128(TY);                                                             \
  }

template <typename T>
struct Mma;
template <>
struct Mma<__nv_bfloat16> {
  TESSERA_WGMMA_MEMBERS("bf16")
};
template <>
struct Mma<__half> {
  TESSERA_WGMMA_MEMBERS("f16")
};

#undef TESSERA_WGMMA_MEMBERS
#undef TESSERA_WGMMA_LIST32
#undef TESSERA_WGMMA_REGS32
#undef TESSERA_WGMMA_REGS64
#undef TESSERA_WGMMA_OUT32
#undef TESSERA_WGMMA_OUT64
#undef TESSERA_WGMMA_SS_N64
#undef TESSERA_WGMMA_SS_N128
#undef TESSERA_WGMMA_RS_N64
#undef TESSERA_WGMMA_RS_N128

#endif  // TESSERA_HAS_WGMMA

}  // namespace tessera::cuda::wgmma
