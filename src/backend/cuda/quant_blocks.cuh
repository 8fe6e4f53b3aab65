// Device-side decoders of the GGUF block formats for the quantized matvec: each block is split
// into "units" of packed 8-bit integer words ready for __dp4a, with the block element every byte
// multiplies. __host__ __device__, so the host tests check the mapping against core/dtype.h.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/dtype.h"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define TS_HD __host__ __device__ __forceinline__
#else
#define TS_HD inline
#endif

namespace tessera::cuda::qblocks {

// Little-endian 32-bit word at any byte address. On the device p points into a shared-memory
// staging buffer that is padded by at least 4 bytes past the data: the two aligned words around
// p are read and funnel-shifted (shared memory has no unaligned loads).
TS_HD uint32_t ld_u32(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  const auto a = reinterpret_cast<uintptr_t>(p);
  const auto* w = reinterpret_cast<const uint32_t*>(a & ~uintptr_t{3});
  return __funnelshift_r(w[0], w[1], static_cast<uint32_t>(a & 3u) * 8u);
#else
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
#endif
}

TS_HD uint16_t ld_u16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}

TS_HD float f16_bits_to_f32(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  return f16_to_f32(h);
#endif
}

// Bytewise a - b (mod 256 in each byte, no borrow between bytes).
TS_HD uint32_t sub_bytes(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __vsub4(a, b);
#else
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) r |= (((a >> (8 * i)) - (b >> (8 * i))) & 0xffu) << (8 * i);
  return r;
#endif
}

// c + the dot product of the four signed bytes of a and b (__dp4a).
TS_HD int dot4(uint32_t a, uint32_t b, int c) {
#if defined(__CUDA_ARCH__)
  return __dp4a(static_cast<int>(a), static_cast<int>(b), c);
#else
  for (int i = 0; i < 4; ++i)
    c += static_cast<int8_t>((a >> (8 * i)) & 0xffu) * static_cast<int8_t>((b >> (8 * i)) & 0xffu);
  return c;
#endif
}

// A 32-sum of the activations (read through the read-only cache on the device).
TS_HD int32_t ld_sum(const int32_t* p) {
#if defined(__CUDA_ARCH__)
  return __ldg(p);
#else
  return *p;
#endif
}

// Bits 0..3 of n moved to bit 4 of bytes 0..3: the fifth bits of four 5-bit quants.
TS_HD uint32_t spread_bits4(uint32_t n) {
  return ((n & 1u) << 4) | ((n & 2u) << 11) | ((n & 4u) << 18) | ((n & 8u) << 25);
}

// Byte i of w as a signed value (host tests only use it to rebuild weights).
TS_HD int byte_s8(uint32_t w, int i) {
  return static_cast<int8_t>((w >> (8 * i)) & 0xffu);
}

// Every type below describes one unit of a block: kWords packed words q[w] of four signed 8-bit
// integers; byte i of q[w] multiplies block element x_first(u, w) + i with integer weight
// scale sc[w]. The block's value at that element is
//     scale(blk) * sc[w] * byte + offset(blk, element)
// where the offset (q4_0's -8 d, q5_0's -16 d, q4_1's / q5_1's m, q4_K's / q5_K's -dmin m_j) is
// applied per 32 elements through the activation sums (sum of x over those 32), never per byte:
// unit u's offset_terms(blk, u, sums, &isum, &f) adds its share (each 32 elements counted by
// exactly one unit) to the integer sum, which the kernel scales by d * dx, and to f, which it
// scales by dx. The kernel and the host emulation in the tests both call it.

// Each type also names kChunkBlocks, the blocks of one weight row a warp stages per step:
// kChunkBlocks * kUnitsPerBlock is a multiple of 32 (every lane decodes the same number of
// units) and a chunk is ~1-2 KB, enough bytes in flight per warp with the next chunk's loads
// issued before the current one is decoded.

// q8_0: 34 bytes = f16 d, 32 int8. Unit u (0..3): elements 8u..8u+7.
struct Q8_0 {
  static constexpr DType kType = DType::q8_0;
  static constexpr int kBlockBytes = 34, kBlockElems = 32, kUnitsPerBlock = 4, kWords = 2;
  static constexpr int kActBlock = 32;  // activation scale granularity (as the CPU path)
  // Words w..w+kXVec-1 (w % kXVec == 0) multiply contiguous elements: x is loaded kXVec words
  // at a time.
  static constexpr int kXVec = 2;
  static constexpr int kChunkBlocks = 56;  // 1904 B
  TS_HD static int x_first(int u, int w) { return 8 * u + 4 * w; }
  TS_HD static float scale(const uint8_t* blk) { return f16_bits_to_f32(ld_u16(blk)); }
  TS_HD static void unit(const uint8_t* blk, int u, uint32_t* q, int* sc) {
    q[0] = ld_u32(blk + 2 + 8 * u);
    q[1] = ld_u32(blk + 6 + 8 * u);
    sc[0] = sc[1] = 1;
  }
  TS_HD static void offset_terms(const uint8_t*, int, const int32_t*, int*, float*) {}
};

// q4_0: 18 bytes = f16 d, 16 bytes of nibbles (element j low nibble of byte j, element j+16
// high nibble). Unit u (0..3): bytes 4u..4u+3 -> elements 4u.. (low) and 16+4u.. (high).
// Nibbles stay unsigned (0..15, valid int8); the -8 is the offset -8 d times the x sum.
struct Q4_0 {
  static constexpr DType kType = DType::q4_0;
  static constexpr int kBlockBytes = 18, kBlockElems = 32, kUnitsPerBlock = 4, kWords = 2;
  static constexpr int kActBlock = 32, kXVec = 1;
  static constexpr int kChunkBlocks = 56;  // 1008 B
  TS_HD static int x_first(int u, int w) { return 4 * u + 16 * w; }
  TS_HD static float scale(const uint8_t* blk) { return f16_bits_to_f32(ld_u16(blk)); }
  TS_HD static void unit(const uint8_t* blk, int u, uint32_t* q, int* sc) {
    const uint32_t raw = ld_u32(blk + 2 + 4 * u);
    q[0] = raw & 0x0f0f0f0fu;
    q[1] = (raw >> 4) & 0x0f0f0f0fu;
    sc[0] = sc[1] = 1;
  }
  // Offset per element: -8 d.
  TS_HD static float offset(const uint8_t* blk) { return -8.0f * scale(blk); }
  // sum (q - 8) x = sum q x - 8 sum x.
  TS_HD static void offset_terms(const uint8_t*, int u, const int32_t* sums, int* isum, float*) {
    if (u == 0) *isum -= 8 * ld_sum(sums);
  }
};

// q4_1: 20 bytes = f16 d, f16 m, 16 bytes of nibbles laid out as q4_0; x = d q + m.
struct Q4_1 {
  static constexpr DType kType = DType::q4_1;
  static constexpr int kBlockBytes = 20, kBlockElems = 32, kUnitsPerBlock = 4, kWords = 2;
  static constexpr int kActBlock = 32, kXVec = 1;
  static constexpr int kChunkBlocks = 48;  // 960 B
  TS_HD static int x_first(int u, int w) { return 4 * u + 16 * w; }
  TS_HD static float scale(const uint8_t* blk) { return f16_bits_to_f32(ld_u16(blk)); }
  TS_HD static float min(const uint8_t* blk) { return f16_bits_to_f32(ld_u16(blk + 2)); }
  TS_HD static void unit(const uint8_t* blk, int u, uint32_t* q, int* sc) {
    const uint32_t raw = ld_u32(blk + 4 + 4 * u);
    q[0] = raw & 0x0f0f0f0fu;
    q[1] = (raw >> 4) & 0x0f0f0f0fu;
    sc[0] = sc[1] = 1;
  }
  TS_HD static void offset_terms(const uint8_t* blk, int u, const int32_t* sums, int*, float* f) {
    if (u == 0) *f += min(blk) * static_cast<float>(ld_sum(sums));
  }
};

// q5_0 / q5_1: q4_0 / q4_1 with a 32-bit word qh before the nibbles whose bit e is element e's
// fifth bit (16): 22 bytes = f16 d, qh, 16 bytes of nibbles; 24 bytes = f16 d, f16 m, qh,
// nibbles. Units as q4's; the quants 0..31 stay unsigned (valid int8), q5_0's -16 is the offset
// -16 d times the x sum.
template <bool kHasMin>
struct Q5 {
  static constexpr DType kType = kHasMin ? DType::q5_1 : DType::q5_0;
  static constexpr int kQh = kHasMin ? 4 : 2;  // byte offset of qh
  static constexpr int kBlockBytes = kQh + 20, kBlockElems = 32, kUnitsPerBlock = 4, kWords = 2;
  static constexpr int kActBlock = 32, kXVec = 1;
  static constexpr int kChunkBlocks = kHasMin ? 56 : 64;  // 1344 B, 1408 B
  TS_HD static int x_first(int u, int w) { return 4 * u + 16 * w; }
  TS_HD static float scale(const uint8_t* blk) { return f16_bits_to_f32(ld_u16(blk)); }
  TS_HD static float min(const uint8_t* blk) { return f16_bits_to_f32(ld_u16(blk + 2)); }
  TS_HD static float offset(const uint8_t* blk) { return kHasMin ? min(blk) : -16.0f * scale(blk); }
  TS_HD static void unit(const uint8_t* blk, int u, uint32_t* q, int* sc) {
    const uint32_t qh = ld_u32(blk + kQh);
    const uint32_t raw = ld_u32(blk + kQh + 4 + 4 * u);
    q[0] = (raw & 0x0f0f0f0fu) | spread_bits4((qh >> (4 * u)) & 0xfu);
    q[1] = ((raw >> 4) & 0x0f0f0f0fu) | spread_bits4((qh >> (16 + 4 * u)) & 0xfu);
    sc[0] = sc[1] = 1;
  }
  TS_HD static void offset_terms(const uint8_t* blk, int u, const int32_t* sums, int* isum,
                                 float* f) {
    if (u != 0) return;
    if constexpr (kHasMin)
      *f += min(blk) * static_cast<float>(ld_sum(sums));
    else
      *isum -= 16 * ld_sum(sums);
  }
};
using Q5_0 = Q5<false>;
using Q5_1 = Q5<true>;

// q4_K: 144 bytes = f16 d, f16 dmin, 12 bytes of packed 6-bit scales/mins, 128 bytes of nibbles.
// Sub-block j (32 elements) is in the low (j even) or high (j odd) nibbles of bytes
// 32 (j/2) .. +31. Unit u (0..7): p = u/2, h = u%2 -> bytes 32p + 16h .. +15; its low nibbles
// are elements 64p + 16h .. +15 (sub-block 2p), its high nibbles 64p + 32 + 16h .. (2p+1).
// q5_K: 176 bytes = f16 d, f16 dmin, the same 12 scale bytes, qh[32], then q4_K's 128 nibble
// bytes; element l of sub-block j takes bit j of qh[l] as its fifth bit. Units as q4_K's.
template <bool kFifthBit>
struct QK4 {
  static constexpr DType kType = kFifthBit ? DType::q5_k : DType::q4_k;
  static constexpr int kQs = kFifthBit ? 48 : 16;  // byte offset of the nibbles
  static constexpr int kBlockBytes = kQs + 128, kBlockElems = 256, kUnitsPerBlock = 8, kWords = 8;
  static constexpr int kActBlock = 256, kXVec = 4;
  static constexpr int kChunkBlocks = kFifthBit ? 8 : 12;  // 1408 B, 1728 B
  TS_HD static int x_first(int u, int w) {
    return 64 * (u / 2) + 16 * (u % 2) + (w < 4 ? 4 * w : 32 + 4 * (w - 4));
  }
  TS_HD static float scale(const uint8_t* blk) { return f16_bits_to_f32(ld_u16(blk)); }
  TS_HD static float dmin(const uint8_t* blk) { return f16_bits_to_f32(ld_u16(blk + 2)); }
  // Same unpacking as core/dtype.h's q4_k_scale_min, on the 12 bytes at blk + 4.
  TS_HD static void scale_min(const uint8_t* blk, int j, int* sc, int* m) {
    const uint8_t* s = blk + 4;
    if (j < 4) {
      *sc = s[j] & 63;
      *m = s[j + 4] & 63;
    } else {
      *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
      *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
  }
  TS_HD static void unit(const uint8_t* blk, int u, uint32_t* q, int* sc) {
    const int p = u / 2, h = u % 2;
    const uint8_t* qs = blk + kQs + 32 * p + 16 * h;
    int sc_lo, sc_hi, m_unused;
    scale_min(blk, 2 * p, &sc_lo, &m_unused);
    scale_min(blk, 2 * p + 1, &sc_hi, &m_unused);
    for (int w = 0; w < 4; ++w) {
      const uint32_t raw = ld_u32(qs + 4 * w);
      q[w] = raw & 0x0f0f0f0fu;
      q[w + 4] = (raw >> 4) & 0x0f0f0f0fu;
      if constexpr (kFifthBit) {  // bytes l = 16 h + 4 w .. of qh, bits 2p and 2p + 1
        const uint32_t qh = ld_u32(blk + 16 + 16 * h + 4 * w);
        q[w] |= ((qh >> (2 * p)) & 0x01010101u) << 4;
        q[w + 4] |= ((qh >> (2 * p + 1)) & 0x01010101u) << 4;
      }
      sc[w] = sc_lo;
      sc[w + 4] = sc_hi;
    }
  }
  // Unit pair (2p, 2p + 1) covers sub-blocks 2p, 2p + 1 once: the even unit adds their mins.
  TS_HD static void offset_terms(const uint8_t* blk, int u, const int32_t* sums, int*, float* f) {
    if (u % 2 != 0) return;
    const int p = u / 2;
    int sc0, m0, sc1, m1;
    scale_min(blk, 2 * p, &sc0, &m0);
    scale_min(blk, 2 * p + 1, &sc1, &m1);
    const int msum = m0 * ld_sum(sums + 2 * p) + m1 * ld_sum(sums + 2 * p + 1);
    *f -= dmin(blk) * static_cast<float>(msum);
  }
};
using Q4K = QK4<false>;
using Q5K = QK4<true>;

// q6_K: 210 bytes = ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], f16 d.
// Element i: h = i/128, r = (i%128)/32, l = i%32; low bits from ql[64h + l + 32 (r&1)] (high
// nibble when r >= 2), high bits (qh[32h + l] >> 2r) & 3; value d * scales[i/16] * (q - 32).
// Unit u (0..7): h = u/4, l0 = 8 (u%4); words w = 2r + t cover l = l0 + 4t .. +3 for r = 0..3,
// so each unit reads 8 bytes of each ql half and 8 bytes of qh. The -32 is applied per byte
// (q - 32 fits int8), so there is no offset term.
struct Q6K {
  static constexpr DType kType = DType::q6_k;
  static constexpr int kBlockBytes = 210, kBlockElems = 256, kUnitsPerBlock = 8, kWords = 8;
  static constexpr int kActBlock = 256, kXVec = 2;
  static constexpr int kChunkBlocks = 8;  // 1680 B
  TS_HD static int x_first(int u, int w) {
    return 128 * (u / 4) + 32 * (w / 2) + 8 * (u % 4) + 4 * (w % 2);
  }
  TS_HD static float scale(const uint8_t* blk) { return f16_bits_to_f32(ld_u16(blk + 208)); }
  TS_HD static void unit(const uint8_t* blk, int u, uint32_t* q, int* sc) {
    const int h = u / 4, l0 = 8 * (u % 4);
    const uint8_t* ql = blk + 64 * h + l0;
    const uint8_t* qh = blk + 128 + 32 * h + l0;
    const auto* scales = reinterpret_cast<const int8_t*>(blk + 192);
    for (int t = 0; t < 2; ++t) {
      const uint32_t lo_a = ld_u32(ql + 4 * t);       // r = 0 (low nibble), r = 2 (high)
      const uint32_t lo_b = ld_u32(ql + 32 + 4 * t);  // r = 1 (low nibble), r = 3 (high)
      const uint32_t hi = ld_u32(qh + 4 * t);
      for (int r = 0; r < 4; ++r) {
        const uint32_t src = (r & 1) ? lo_b : lo_a;
        const uint32_t lo = (r < 2 ? src : src >> 4) & 0x0f0f0f0fu;
        const uint32_t hb = ((hi >> (2 * r)) & 0x03030303u) << 4;
        q[2 * r + t] = sub_bytes(lo | hb, 0x20202020u);
        // l0 + 4t + 3 < l0 + 8 <= 32 and l0 % 8 == 0: the unit's 8 elements of row r share one
        // group of 16.
        sc[2 * r + t] = scales[(128 * h + 32 * r + l0) / 16];
      }
    }
  }
  TS_HD static void offset_terms(const uint8_t*, int, const int32_t*, int*, float*) {}
};

// Geometry of one staged chunk of a weight row. The chunk starts at any phase 0..15 of a
// 16-byte line; lane l loads the 16-byte slots l, l + 32, ... of the aligned span covering it
// into a shared buffer of kRowBuf bytes, where block i of the chunk starts at phase + i * bytes.
template <class T>
struct Chunk {
  static constexpr int kBlocks = T::kChunkBlocks;
  static constexpr int kBytes = kBlocks * T::kBlockBytes;
  static constexpr int kSlots = (kBytes + 15 + 15) / 16;
  static constexpr int kSlotsPerLane = (kSlots + 31) / 32;
  static constexpr int kUnitsPerLane = kBlocks * T::kUnitsPerBlock / 32;
  // +16: ld_u32 reads the aligned word after the one holding its last byte.
  static constexpr int kRowBuf = kSlotsPerLane * 32 * 16 + 16;
  static_assert(kBlocks * T::kUnitsPerBlock % 32 == 0, "every lane decodes as many units");
  static_assert(T::kBlockElems == T::kActBlock, "one activation scale per weight block");
  static_assert(T::kBlockElems % 32 == 0 && T::kWords % T::kXVec == 0, "x loads in vectors");
};

}  // namespace tessera::cuda::qblocks
