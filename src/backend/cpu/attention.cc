// Tiled causal self-attention forward and backward on CPU (FlashAttention-2 algorithm: online
// softmax over key tiles, only the log-sum-exp saved, scores recomputed tile by tile in backward),
// vectorized with Highway and dispatched once per op. A sliding window W (ops.h) is work saved,
// not only masked: the forward visits, for a query tile, only the key tiles from the one holding
// its first row's first key (i0 - W + 1) to the diagonal, and packs only those keys; the backward
// visits, for a key tile, only the query tiles up to the one holding its last key + W - 1, and
// packs only those queries. Per head that is about T W of the T^2 / 2 scores (Gemma 3 270m's
// local layers, W = 512, at T = 4096: 2.2 M of 8.4 M pairs, about a quarter), plus at most one
// partly visible tile per row of tiles at each edge; the entries of those tiles outside the
// window are masked to -inf (P = 0).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/attention.cc"
// foreach_target re-includes this file once per SIMD target; everything below is per target
// except the HWY_ONCE and include-guarded parts.
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/aligned_allocator.h"
#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

#ifndef TESSERA_BACKEND_CPU_ATTENTION_ONCE
#define TESSERA_BACKEND_CPU_ATTENTION_ONCE

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "backend/cpu/attention_bf16.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace tessera::cpu::attention_detail {

// Tile sizes. With D = 64 a K^T or V tile (64 keys x 64 dims) is 16 KB: half of the 32 KB L1d,
// so the micro-kernels stream it from L1 while the other operands stay in registers. The whole
// working set of one tile step (Q, K^T, V, scores, output accumulator: 5 x 16 KB) fits in L2.
// Equal query and key tiles keep the diagonal tile square, so no query row of a visited tile is
// fully masked and at most half of each diagonal tile is wasted work.
constexpr size_t kBr = 64;  // query rows per tile
constexpr size_t kBc = 64;  // keys per tile; a multiple of 2 vectors on every x86 target

// Rounds n up to a multiple of m.
inline size_t round_up(size_t n, size_t m) {
  return (n + m - 1) / m * m;
}

// A float scratch region seen as words of two bf16 (the bf16 products' operands).
inline uint32_t* words(float* p) {
  return reinterpret_cast<uint32_t*>(p);
}

inline void check_args(const char* op, const void* p0, const void* p1, const void* p2,
                       const ops::AttentionArgs& a) {
  ops::check_attention_args(op, a);
  TS_CHECK(a.B * a.T == 0 || (p0 && p1 && p2), "[", op, "] null tensor pointer");
}

// The first key query i sees with window W (0: none), as ops::AttentionArgs::first_key says.
inline size_t first_key(size_t i, size_t W) {
  return static_cast<size_t>(
      ops::AttentionArgs{.window = static_cast<int64_t>(W)}.first_key(static_cast<int64_t>(i)));
}
// One past the last query that sees key j: j + W (at most T), T without a window.
inline size_t last_query_end(size_t j, size_t W, size_t T) {
  return W > 0 ? std::min(T, j + W) : T;
}

}  // namespace tessera::cpu::attention_detail

#endif  // TESSERA_BACKEND_CPU_ATTENTION_ONCE

HWY_BEFORE_NAMESPACE();
namespace tessera::cpu::HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using attention_detail::first_key;
using attention_detail::kBc;
using attention_detail::kBr;
using attention_detail::last_query_end;
using attention_detail::round_up;
using attention_detail::words;
namespace ab = attention_bf16;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// s (rows, kBc) = a (rows, D; row stride lda) * bt (D, kBc). The register tile is kR rows x 2
// vectors: per d, two loads of bt and kR broadcasts feed 2 kR FMAs. kR = 6 uses 12 accumulators
// + 2 loaded + 1 broadcast = 15 of AVX2's 16 registers.
template <size_t kR>
HWY_INLINE void abt_rows(const float* HWY_RESTRICT a, size_t lda, const float* HWY_RESTRICT bt,
                         size_t D, float* HWY_RESTRICT s) {
  const DF df;
  const size_t N = hn::Lanes(df);
  for (size_t c = 0; c < kBc; c += 2 * N) {
    VF acc0[kR], acc1[kR];
    for (size_t r = 0; r < kR; ++r) acc0[r] = acc1[r] = hn::Zero(df);
    for (size_t d = 0; d < D; ++d) {
      const VF b0 = hn::LoadU(df, bt + d * kBc + c);
      const VF b1 = hn::LoadU(df, bt + d * kBc + c + N);
      for (size_t r = 0; r < kR; ++r) {
        const VF av = hn::Set(df, a[r * lda + d]);
        acc0[r] = hn::MulAdd(av, b0, acc0[r]);
        acc1[r] = hn::MulAdd(av, b1, acc1[r]);
      }
    }
    for (size_t r = 0; r < kR; ++r) {
      hn::StoreU(acc0[r], df, s + r * kBc + c);
      hn::StoreU(acc1[r], df, s + r * kBc + c + N);
    }
  }
}

// s (rows, kBc) = a (rows, D) * bt (D, kBc); columns past the tile's keys come out 0 because bt
// is zero-padded there.
void abt(const float* a, size_t lda, size_t rows, const float* bt, size_t D, float* s) {
  size_t r = 0;
  for (; r + 6 <= rows; r += 6) abt_rows<6>(a + r * lda, lda, bt, D, s + r * kBc);
  a += r * lda;
  s += r * kBc;
  switch (rows - r) {
    case 5:
      abt_rows<5>(a, lda, bt, D, s);
      break;
    case 4:
      abt_rows<4>(a, lda, bt, D, s);
      break;
    case 3:
      abt_rows<3>(a, lda, bt, D, s);
      break;
    case 2:
      abt_rows<2>(a, lda, bt, D, s);
      break;
    case 1:
      abt_rows<1>(a, lda, bt, D, s);
      break;
    default:
      break;
  }
}

// out[i, dv : dv + kV*N] += sum_k a[i*si + k*sk] * b[k, dv : ...] for kI rows i. Register tile
// kI rows x kV vectors: 3 x 4 = 12 accumulators, 3 broadcasts and one b vector at a time fit
// AVX2's 16 registers; per k, 4 loads of b and 3 broadcasts feed 12 FMAs.
template <size_t kI, size_t kV>
HWY_INLINE void ab_acc_block(float* HWY_RESTRICT out, size_t ldo, const float* HWY_RESTRICT a,
                             size_t si, size_t sk, size_t nk, const float* HWY_RESTRICT b,
                             size_t ldb) {
  const DF df;
  const size_t N = hn::Lanes(df);
  VF acc[kI][kV];
  for (size_t i = 0; i < kI; ++i)
    for (size_t v = 0; v < kV; ++v) acc[i][v] = hn::LoadU(df, out + i * ldo + v * N);
  for (size_t k = 0; k < nk; ++k) {
    VF bv[kV];
    for (size_t v = 0; v < kV; ++v) bv[v] = hn::LoadU(df, b + k * ldb + v * N);
    for (size_t i = 0; i < kI; ++i) {
      const VF av = hn::Set(df, a[i * si + k * sk]);
      for (size_t v = 0; v < kV; ++v) acc[i][v] = hn::MulAdd(av, bv[v], acc[i][v]);
    }
  }
  for (size_t i = 0; i < kI; ++i)
    for (size_t v = 0; v < kV; ++v) hn::StoreU(acc[i][v], df, out + i * ldo + v * N);
}

template <size_t kI>
HWY_INLINE void ab_acc_rows(float* out, size_t ldo, const float* a, size_t si, size_t sk, size_t nk,
                            const float* b, size_t ldb, size_t Dp) {
  const size_t N = hn::Lanes(DF());
  size_t dv = 0;
  for (; dv + 4 * N <= Dp; dv += 4 * N)
    ab_acc_block<kI, 4>(out + dv, ldo, a, si, sk, nk, b + dv, ldb);
  switch ((Dp - dv) / N) {
    case 3:
      ab_acc_block<kI, 3>(out + dv, ldo, a, si, sk, nk, b + dv, ldb);
      break;
    case 2:
      ab_acc_block<kI, 2>(out + dv, ldo, a, si, sk, nk, b + dv, ldb);
      break;
    case 1:
      ab_acc_block<kI, 1>(out + dv, ldo, a, si, sk, nk, b + dv, ldb);
      break;
    default:
      break;
  }
}

// out (ni, Dp; stride ldo) += A (ni, nk) * b (nk, Dp; stride ldb), where A[i][k] = a[i*si + k*sk].
// The strides let one kernel serve P V and dS K (A row-major) and P^T dO, dS^T Q (A transposed).
// Dp is a multiple of the vector length; b's padding columns are finite (zero).
void ab_acc(float* out, size_t ldo, size_t ni, const float* a, size_t si, size_t sk, size_t nk,
            const float* b, size_t ldb, size_t Dp) {
  size_t i = 0;
  for (; i + 3 <= ni; i += 3)
    ab_acc_rows<3>(out + i * ldo, ldo, a + i * si, si, sk, nk, b, ldb, Dp);
  if (ni - i == 2) ab_acc_rows<2>(out + i * ldo, ldo, a + i * si, si, sk, nk, b, ldb, Dp);
  if (ni - i == 1) ab_acc_rows<1>(out + i * ldo, ldo, a + i * si, si, sk, nk, b, ldb, Dp);
}

// Sets row[n_valid, n) to -inf so that max ignores it and Exp maps it to 0.
inline void mask_tail(float* row, size_t n_valid, size_t n) {
  for (size_t c = n_valid; c < n; ++c) row[c] = -std::numeric_limits<float>::infinity();
}

// Max of row[0, n) (n >= 1; the row is readable up to round_up(n, N)).
inline float row_max(const float* row, size_t n) {
  const DF df;
  const size_t N = hn::Lanes(df);
  VF m = hn::Set(df, -std::numeric_limits<float>::infinity());
  size_t c = 0;
  for (; c + N <= n; c += N) m = hn::Max(m, hn::LoadU(df, row + c));
  float best = hn::GetLane(hn::MaxOfLanes(df, m));
  for (; c < n; ++c) best = std::max(best, row[c]);
  return best;
}

// row[c] = exp(row[c] - shift) for c < n (masked -inf entries become 0); returns their sum.
// Vectors cover round_up(n, N) entries; the row buffer has kBc (a multiple of N) entries.
inline float exp_shift_sum(float* row, size_t n, float shift) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const VF sv = hn::Set(df, shift);
  VF sum = hn::Zero(df);
  for (size_t c = 0; c < n; c += N) {
    const VF e = hn::Exp(df, hn::Sub(hn::LoadU(df, row + c), sv));
    hn::StoreU(e, df, row + c);
    sum = hn::Add(sum, e);
  }
  return hn::GetLane(hn::SumOfLanes(df, sum));
}

// Rows of one head are 3C floats apart in qkv (a new page each for GPT-2 sizes), so the hardware
// prefetcher does not follow them; packing loops prefetch kAhead rows in advance.
constexpr size_t kAhead = 8;
inline void prefetch_row(const float* p, size_t D) {
  for (size_t d = 0; d < D; d += 16) __builtin_prefetch(p + d);
  __builtin_prefetch(p + D - 1);
}

// Copies rows [0, n) of one head's (n, D) slice with row stride `ld` into dst (n, Dp) times
// `mul`, zeroing the padding columns.
void pack_rows(float* dst, size_t Dp, const float* src, size_t ld, size_t n, size_t D, float mul) {
  for (size_t r = 0; r < n; ++r) {
    if (r + kAhead < n) prefetch_row(src + (r + kAhead) * ld, D);
    for (size_t d = 0; d < D; ++d) dst[r * Dp + d] = src[r * ld + d] * mul;
    for (size_t d = D; d < Dp; ++d) dst[r * Dp + d] = 0.0f;
  }
}

// Transposes n rows of a (n, D) slice with row stride `ld` into tiles of kBc keys: tile t is a
// contiguous (D, kBc) block at dst + t * D * kBc (a 16 KB block for D = 64, so the micro-kernel
// streams it without the cache-set conflicts of a long power-of-two row stride). Columns past n
// in the last tile are zeroed. Source rows are read contiguously.
void pack_transposed(float* dst, const float* src, size_t ld, size_t n, size_t D) {
  for (size_t j = 0; j < n; ++j) {
    if (j + kAhead < n) prefetch_row(src + (j + kAhead) * ld, D);
    float* col = dst + (j / kBc) * D * kBc + j % kBc;
    for (size_t d = 0; d < D; ++d) col[d * kBc] = src[j * ld + d];
  }
  if (n % kBc != 0) {
    float* last = dst + (n / kBc) * D * kBc;
    for (size_t d = 0; d < D; ++d) std::fill(last + d * kBc + n % kBc, last + (d + 1) * kBc, 0.0f);
  }
}

// Hands out task indices [0, n) to the pool's threads; fn(thread, task). Which thread runs which
// task does not change any result: tasks write disjoint outputs, each in a fixed order.
template <class Fn>
void run_tasks(ThreadPool& pool, size_t n, const Fn& fn) {
  std::atomic<size_t> next{0};
  pool.run([&](int thread) {
    for (size_t t = next.fetch_add(1); t < n; t = next.fetch_add(1)) fn(thread, t);
  });
}

// One query tile of the forward pass: queries i0 .. i0 + nq of one head against the keys
// 0 .. i0 + nq - 1 with an online softmax. q_head = qkv + b*T*3C + h*D (rows of stride ld);
// kt, v hold the head's keys packed by pack_transposed / pack_rows (bf16: by
// ab::pack_tiles_along_d / ab::pack_row_pairs); out_head, lse_head are the head's rows of out
// (stride ldo) and lse. qs, o (kBr, Dp), s, pw (kBr, kBc), m, l (kBr) are scratch. With bf16 the
// two products take bf16 operands (Dp a multiple of 16, Dh = Dp / 2 words per packed row).
void forward_tile(bool bf16, float* qs, float* o, float* kt, float* v, float* s, float* pw,
                  float* m, float* l, const float* q_head, size_t ld, size_t i0, size_t nq,
                  size_t W, size_t D, size_t Dp, float scale, float* out_head, size_t ldo,
                  float* lse_head) {
  const DF df;
  const size_t N = hn::Lanes(df);
  const size_t Dh = Dp / 2;
  if (bf16)
    ab::pack_rows_along_d(words(qs), Dh, q_head + i0 * ld, ld, nq, D, scale);
  else
    pack_rows(qs, Dp, q_head + i0 * ld, ld, nq, D, scale);
  std::fill(o, o + nq * Dp, 0.0f);
  std::fill(m, m + nq, -std::numeric_limits<float>::infinity());
  std::fill(l, l + nq, 0.0f);
  // Key tiles from the one holding the first row's first key (0 without a window) up to the one
  // holding the last query; tiles above the diagonal or before the window are skipped.
  for (size_t j0 = first_key(i0, W) / kBc * kBc; j0 < i0 + nq; j0 += kBc) {
    const size_t nkv = std::min(kBc, i0 + nq - j0);
    if (bf16)
      ab::dot(s, kBc, words(qs), Dh, 1, nq, words(kt) + j0 / kBc * Dh * kBc, kBc, Dh, kBc, false);
    else
      abt(qs, Dp, nq, kt + j0 * D, D, s);  // tile j0 / kBc starts at (j0 / kBc) * D * kBc
    for (size_t r = 0; r < nq; ++r) {
      float* row = s + r * kBc;
      const size_t lo = first_key(i0 + r, W);
      // No key of this tile is visible to row r (causal: j <= i; window: j >= lo).
      if (i0 + r + 1 <= j0 || lo >= j0 + nkv) {
        std::fill(row, row + kBc, 0.0f);
        continue;
      }
      const size_t n_valid = std::min(nkv, i0 + r + 1 - j0);
      // Columns before the window and past n_valid (masked or beyond the tile's keys) must give
      // P = 0; at least one column in between is visible.
      if (lo > j0) std::fill(row, row + (lo - j0), -std::numeric_limits<float>::infinity());
      mask_tail(row, n_valid, kBc);
      const float m_new = std::max(m[r], row_max(row, n_valid));
      const float corr = std::exp(m[r] - m_new);  // 0 on the first tile (m = -inf)
      l[r] = l[r] * corr + exp_shift_sum(row, nkv, m_new);
      m[r] = m_new;
      if (corr != 1.0f) {
        const VF cv = hn::Set(df, corr);
        for (size_t d = 0; d < Dp; d += N) {
          hn::StoreU(hn::Mul(hn::LoadU(df, o + r * Dp + d), cv), df, o + r * Dp + d);
        }
      }
    }
    if (bf16) {  // P in pairs of keys; every P read is finite (masked and padded keys: 0)
      const size_t pairs = (nkv + 1) / 2;
      ab::pairs_along_columns(words(pw), kBc / 2, s, kBc, nq, 2 * pairs);
      ab::dot(o, Dp, words(pw), kBc / 2, 1, nq, words(v) + j0 / 2 * Dp, Dp, pairs, Dp, true);
    } else {
      ab_acc(o, Dp, nq, s, kBc, 1, nkv, v + j0 * Dp, Dp, Dp);
    }
  }
  for (size_t r = 0; r < nq; ++r) {
    float* dst = out_head + (i0 + r) * ldo;
    const float inv = 1.0f / l[r];
    for (size_t d = 0; d < D; ++d) dst[d] = o[r * Dp + d] * inv;
    lse_head[i0 + r] = m[r] + std::log(l[r]);
  }
}

}  // namespace

// out (B,T,C), lse (B,H,T), qkv (B,T,C+2*Hkv*D). One task per (b, h, run of query tiles): the
// task packs K^T and V of its key/value head for the keys its queries see once (from the tile
// holding the run's first key with a window), then sweeps its query tiles.
void AttentionForward(ThreadPool& pool, float* out, float* lse, const float* qkv,
                      const ops::AttentionArgs& a) {
  const int64_t B = a.B, T = a.T, C = a.C, H = a.H, Hkv = a.Hkv;
  const bool round_bf16 = a.round_bf16;
  if (B == 0 || T == 0) return;
  const DF df;
  const size_t N = hn::Lanes(df);
  const bool bf16 = round_bf16 && ab::supported();
  // The bf16 products work on 16-column vectors whatever the Highway target.
  const size_t D = static_cast<size_t>(C / H), Dp = round_up(D, bf16 ? 16 : N);
  const size_t Tz = static_cast<size_t>(T), Cz = static_cast<size_t>(C);
  const size_t KVw = static_cast<size_t>(Hkv) * D, ld = Cz + 2 * KVw;
  const size_t group = static_cast<size_t>(H / Hkv);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  // A window of T or more hides nothing: 0 keeps the unwindowed path (and its bits).
  const size_t W = a.window < T ? static_cast<size_t>(a.window) : 0;
  const size_t BH = static_cast<size_t>(B * H), n_qt = (Tz + kBr - 1) / kBr;
  // Split each head's query tiles into runs only when there are too few heads to keep every
  // thread busy (about 4 tasks per thread); each run repacks the keys it needs.
  const size_t threads = static_cast<size_t>(pool.size());
  size_t per_run = n_qt;
  if (BH < 4 * threads) per_run = std::max<size_t>(1, n_qt * BH / (4 * threads));
  const size_t n_runs = (n_qt + per_run - 1) / per_run;
  const size_t Tp = round_up(Tz, kBc);

  // Per-thread scratch, allocated once per call: Q, O (kBr, Dp); K^T tiles (Tp / kBc of
  // (D, kBc); bf16: of (Dp / 2, kBc) words); V (Tp, Dp); S, P pairs (kBr, kBc); running max and
  // sum (kBr).
  const size_t q_off = 0, o_off = q_off + kBr * Dp, kt_off = o_off + kBr * Dp;
  const size_t v_off = kt_off + round_up(Dp * Tp, 16), s_off = v_off + Tp * Dp;
  const size_t pw_off = s_off + kBr * kBc, m_off = pw_off + kBr * kBc, l_off = m_off + kBr;
  const size_t per_thread = round_up(l_off + kBr, 16);
  auto scratch = hwy::AllocateAligned<float>(per_thread * static_cast<size_t>(pool.size()));
  TS_CHECK(scratch, "[attention_forward] cannot allocate scratch");

  // Runs nearest the end of the sequence see the most keys: hand them out first.
  run_tasks(pool, BH * n_runs, [&](int thread, size_t task) {
    const size_t run = n_runs - 1 - task / BH, bh = task % BH;
    const size_t b = bh / static_cast<size_t>(H), h = bh % static_cast<size_t>(H);
    float* ws = scratch.get() + per_thread * static_cast<size_t>(thread);
    float *qs = ws + q_off, *o = ws + o_off, *kt = ws + kt_off, *v = ws + v_off, *s = ws + s_off;
    float *pw = ws + pw_off, *m = ws + m_off, *l = ws + l_off;
    const float* base = qkv + b * Tz * ld;
    const size_t qt_end = std::min(n_qt, (run + 1) * per_run);
    const size_t n_keys = std::min(Tz, qt_end * kBr);
    // Keys [k_lo, n_keys), k_lo a tile start: packed where the whole sequence's would be.
    const size_t k_lo = first_key(run * per_run * kBr, W) / kBc * kBc, nk = n_keys - k_lo;
    const float* k_cols = base + k_lo * ld + Cz + h / group * D;
    const float* v_cols = k_cols + KVw;
    if (bf16) {
      ab::pack_tiles_along_d(words(kt) + k_lo / kBc * (Dp / 2) * kBc, Dp / 2, kBc, k_cols, ld, nk,
                             D);
      ab::pack_row_pairs(words(v) + k_lo / 2 * Dp, Dp, v_cols, ld, nk, D, 1.0f);
    } else {
      pack_transposed(kt + k_lo * D, k_cols, ld, nk, D);
      pack_rows(v + k_lo * Dp, Dp, v_cols, ld, nk, D, 1.0f);
    }
    for (size_t qt = run * per_run; qt < qt_end; ++qt)
      forward_tile(bf16, qs, o, kt, v, s, pw, m, l, base + h * D, ld, qt * kBr,
                   std::min(kBr, Tz - qt * kBr), W, D, Dp, scale, out + (b * Tz) * Cz + h * D, Cz,
                   lse + bh * Tz);
  });
}

// dqkv (B,T,C+2*Hkv*D) overwritten; dout, out (B,T,C); qkv as dqkv; lse (B,H,T).
// One task per (b, key/value head, run of key tiles). A task owns the dk and dv rows of its keys,
// so they are never accumulated across tasks: it sweeps the query heads of its group in order,
// each over the run's key tiles, adding into the run's dk and dv. dq_i sums over all key tiles:
// with one run per head the task owns dq too; otherwise each run writes a partial dq and a second
// pass adds the partials in run order. The split depends on the shape alone, not on the thread
// count or on timing, so every bit of the result is reproducible. With a window a task packs and
// visits only the query tiles that see its keys.
void AttentionBackward(ThreadPool& pool, float* dqkv, const float* dout, const float* qkv,
                       const float* out, const float* lse, const ops::AttentionArgs& a) {
  const int64_t B = a.B, T = a.T, C = a.C, H = a.H, Hkv = a.Hkv;
  const bool round_bf16 = a.round_bf16;
  if (B == 0 || T == 0) return;
  const DF df;
  const size_t N = hn::Lanes(df);
  const bool bf16 = round_bf16 && ab::supported();
  const size_t D = static_cast<size_t>(C / H), Dp = round_up(D, bf16 ? 16 : N), Dh = Dp / 2;
  const size_t Tz = static_cast<size_t>(T), Cz = static_cast<size_t>(C);
  const size_t KVw = static_cast<size_t>(Hkv) * D, ld = Cz + 2 * KVw;
  const size_t group = static_cast<size_t>(H / Hkv);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const size_t W = a.window < T ? static_cast<size_t>(a.window) : 0;  // as in the forward
  const size_t BG = static_cast<size_t>(B * Hkv), n_kt = (Tz + kBc - 1) / kBc;
  // Fewer kv heads than kMinTasks: split each head's key tiles into runs so that small batches
  // still spread over the threads. A fixed constant, so the split is the same on every machine.
  constexpr size_t kMinTasks = 16;
  const size_t want_runs = BG >= kMinTasks ? 1 : std::min(n_kt, (kMinTasks + BG - 1) / BG);
  const size_t kt_per_run = (n_kt + want_runs - 1) / want_runs;
  const size_t n_runs = (n_kt + kt_per_run - 1) / kt_per_run;

  // Per-thread scratch: Q*scale, dO, K, dQ (T, Dp) and Di (T) of the rows a task needs, packed
  // once per query head; the run's dK, dV (its keys, Dp); per key tile K^T, V^T (D, kBc);
  // S/P, dP/dS (kBr, kBc). bf16: Q*scale and dO packed twice, in pairs along d (as A of S and
  // dP) and in pairs of rows (as B of dK and dV); K in pairs of rows; K^T and V^T tiles in pairs
  // along d; P or dS in pairs of rows (kBr / 2, kBc words) and dS in pairs along keys (kBr,
  // kBc / 2 words).
  const size_t TD = round_up(Tz * Dp, 16), RD = kt_per_run * kBc * Dp;
  const size_t q_off = 0, do_off = TD, k_off = 2 * TD, dq_off = 3 * TD, di_off = 4 * TD;
  const size_t kt_off = di_off + round_up(Tz, 16), vt_off = kt_off + round_up(Dp * kBc, 16);
  const size_t dk_off = vt_off + round_up(Dp * kBc, 16), dv_off = dk_off + RD;
  const size_t s_off = dv_off + RD, dp_off = s_off + kBr * kBc;
  const size_t qr_off = dp_off + kBr * kBc, gr_off = qr_off + (bf16 ? TD : 0);
  const size_t pt_off = gr_off + (bf16 ? TD : 0), dsw_off = pt_off + (bf16 ? kBc * kBr : 0);
  const size_t per_thread = dsw_off + (bf16 ? kBr * kBc : 0);
  auto scratch = hwy::AllocateAligned<float>(per_thread * static_cast<size_t>(pool.size()));
  TS_CHECK(scratch, "[attention_backward] cannot allocate scratch");
  // Partial dq per (b, query head, run) when heads are split: (B*H, n_runs, T, Dp).
  hwy::AlignedFreeUniquePtr<float[]> partial;
  if (n_runs > 1) {
    partial = hwy::AllocateAligned<float>(static_cast<size_t>(B * H) * n_runs * TD);
    TS_CHECK(partial, "[attention_backward] cannot allocate partial dq");
  }

  // Early runs see the most queries: hand them out first.
  run_tasks(pool, BG * n_runs, [&](int thread, size_t task) {
    const size_t run = task / BG, bg = task % BG;
    const size_t b = bg / static_cast<size_t>(Hkv), g = bg % static_cast<size_t>(Hkv);
    float* ws = scratch.get() + per_thread * static_cast<size_t>(thread);
    float *qs = ws + q_off, *go = ws + do_off, *kp = ws + k_off;
    float *di = ws + di_off, *kt = ws + kt_off, *vt = ws + vt_off, *dk = ws + dk_off;
    float *dv = ws + dv_off, *s = ws + s_off, *dp = ws + dp_off;
    float *qr = ws + qr_off, *gr = ws + gr_off, *pt = ws + pt_off, *dsw = ws + dsw_off;
    const float* base = qkv + b * Tz * ld;
    float* dbase = dqkv + b * Tz * ld;
    const size_t j_begin = run * kt_per_run * kBc, j_end = std::min(Tz, j_begin + kt_per_run * kBc);
    const size_t q_begin = j_begin / kBr * kBr;  // queries before the run's keys see none of them
    // Nor do queries past the window of its last key; whole query tiles are packed.
    const size_t q_end = std::min(Tz, round_up(last_query_end(j_end - 1, W, Tz), kBr));
    const size_t nq_run = q_end - q_begin, nk_run = j_end - j_begin;
    const size_t k_col = Cz + g * D, v_col = k_col + KVw;

    // Packed rows keep their sequence index: row i of qs, go, dq is query i, row j of kp key j,
    // row j - j_begin of dk and dv key j (bf16: row i of the along-d packs, pair i / 2 of the
    // row-pair packs; runs start even).
    const float* k_rows = base + j_begin * ld + k_col;
    if (bf16)
      ab::pack_row_pairs(words(kp) + j_begin / 2 * Dp, Dp, k_rows, ld, nk_run, D, 1.0f);
    else
      pack_rows(kp + j_begin * Dp, Dp, k_rows, ld, nk_run, D, 1.0f);
    std::fill(dk, dk + RD, 0.0f);
    std::fill(dv, dv + RD, 0.0f);

    for (size_t h = g * group; h < (g + 1) * group; ++h) {
      const size_t bh = b * static_cast<size_t>(H) + h;
      float* dq = n_runs > 1 ? partial.get() + (bh * n_runs + run) * TD : ws + dq_off;
      const float* lse_h = lse + bh * Tz;
      const float* q_rows = base + q_begin * ld + h * D;
      const float* do_rows = dout + (b * Tz + q_begin) * Cz + h * D;
      if (bf16) {
        ab::pack_rows_along_d(words(qs) + q_begin * Dh, Dh, q_rows, ld, nq_run, D, scale);
        ab::pack_row_pairs(words(qr) + q_begin / 2 * Dp, Dp, q_rows, ld, nq_run, D, scale);
        ab::pack_rows_along_d(words(go) + q_begin * Dh, Dh, do_rows, Cz, nq_run, D, 1.0f);
        ab::pack_row_pairs(words(gr) + q_begin / 2 * Dp, Dp, do_rows, Cz, nq_run, D, 1.0f);
      } else {
        pack_rows(qs + q_begin * Dp, Dp, q_rows, ld, nq_run, D, scale);
        pack_rows(go + q_begin * Dp, Dp, do_rows, Cz, nq_run, D, 1.0f);
      }
      std::fill(dq + q_begin * Dp, dq + q_end * Dp, 0.0f);
      // Di = rowsum(dO_i * O_i), in double: it is subtracted from dP, where cancellation hurts.
      for (size_t i = q_begin; i < q_end; ++i) {
        const float* o = out + (b * Tz + i) * Cz + h * D;
        const float* gi = dout + (b * Tz + i) * Cz + h * D;
        double acc = 0;
        for (size_t d = 0; d < D; ++d) acc += static_cast<double>(gi[d]) * o[d];
        di[i] = static_cast<float>(acc);
      }

      for (size_t j0 = j_begin; j0 < j_end; j0 += kBc) {
        const size_t nkv = std::min(kBc, Tz - j0);
        float* dk_t = dk + (j0 - j_begin) * Dp;
        float* dv_t = dv + (j0 - j_begin) * Dp;
        if (bf16) {
          ab::pack_tiles_along_d(words(kt), Dh, kBc, base + j0 * ld + k_col, ld, nkv, D);
          ab::pack_tiles_along_d(words(vt), Dh, kBc, base + j0 * ld + v_col, ld, nkv, D);
        } else {
          pack_transposed(kt, base + j0 * ld + k_col, ld, nkv, D);
          pack_transposed(vt, base + j0 * ld + v_col, ld, nkv, D);
        }
        // Query tiles at or below the diagonal and up to the one holding the window's last query
        // of this key tile, in increasing order (fixed summation order).
        const size_t i_end = std::min(q_end, last_query_end(j0 + nkv - 1, W, Tz));
        for (size_t i0 = j0 / kBr * kBr; i0 < i_end; i0 += kBr) {
          const size_t nq = std::min(kBr, Tz - i0);
          if (bf16) {
            ab::dot(s, kBc, words(qs) + i0 * Dh, Dh, 1, nq, words(kt), kBc, Dh, kBc, false);
            ab::dot(dp, kBc, words(go) + i0 * Dh, Dh, 1, nq, words(vt), kBc, Dh, kBc, false);
          } else {
            abt(qs + i0 * Dp, Dp, nq, kt, D, s);   // S = scale Q K^T
            abt(go + i0 * Dp, Dp, nq, vt, D, dp);  // dP = dO V^T
          }
          for (size_t r = 0; r < nq; ++r) {
            const size_t i = i0 + r;
            float* prow = s + r * kBc;
            float* dsrow = dp + r * kBc;
            // Rows of a tile that starts above this key tile's first key see no key here, nor
            // do keys before row i's window (P = 0 there, so dS = 0).
            const size_t n_valid = i + 1 > j0 ? std::min(nkv, i + 1 - j0) : 0;
            const size_t lo = first_key(i, W);
            if (lo > j0)
              std::fill(prow, prow + std::min(kBc, lo - j0),
                        -std::numeric_limits<float>::infinity());
            mask_tail(prow, n_valid, kBc);
            exp_shift_sum(prow, nkv, lse_h[i]);  // P = exp(S - lse)
            const VF div = hn::Set(df, di[i]);
            for (size_t c = 0; c < nkv; c += N) {  // dS = P * (dP - Di)
              const VF pv = hn::LoadU(df, prow + c);
              hn::StoreU(hn::Mul(pv, hn::Sub(hn::LoadU(df, dsrow + c), div)), df, dsrow + c);
            }
          }
          if (bf16) {  // the same three products on pairs (of queries, then of keys)
            // P and dS in pairs of query rows (pt: (nq / 2, kBc) words), read transposed as A.
            const size_t q_pairs = (nq + 1) / 2, k_pairs = (nkv + 1) / 2;
            ab::pack_row_pairs(words(pt), kBc, s, kBc, nq, nkv, 1.0f);
            ab::dot(dv_t, Dp, words(pt), 1, kBc, nkv, words(gr) + i0 / 2 * Dp, Dp, q_pairs, Dp,
                    true);
            ab::pack_row_pairs(words(pt), kBc, dp, kBc, nq, nkv, 1.0f);
            ab::dot(dk_t, Dp, words(pt), 1, kBc, nkv, words(qr) + i0 / 2 * Dp, Dp, q_pairs, Dp,
                    true);
            ab::pairs_along_columns(words(dsw), kBc / 2, dp, kBc, nq, 2 * k_pairs);
            ab::dot(dq + i0 * Dp, Dp, words(dsw), kBc / 2, 1, nq, words(kp) + j0 / 2 * Dp, Dp,
                    k_pairs, Dp, true);
          } else {
            ab_acc(dv_t, Dp, nkv, s, 1, kBc, nq, go + i0 * Dp, Dp, Dp);   // dV += P^T dO
            ab_acc(dk_t, Dp, nkv, dp, 1, kBc, nq, qs + i0 * Dp, Dp, Dp);  // dK += dS^T (scale Q)
            ab_acc(dq + i0 * Dp, Dp, nq, dp, kBc, 1, nkv, kp + j0 * Dp, Dp, Dp);  // dQ += dS K
          }
        }
      }
      if (n_runs == 1) {
        for (size_t i = 0; i < Tz; ++i) {
          float* gq = dbase + i * ld + h * D;
          for (size_t d = 0; d < D; ++d) gq[d] = dq[i * Dp + d] * scale;  // dq = scale dS K
        }
      }
    }
    for (size_t j = j_begin; j < j_end; ++j) {
      float* row = dbase + j * ld;
      for (size_t d = 0; d < D; ++d) {
        row[k_col + d] = dk[(j - j_begin) * Dp + d];
        row[v_col + d] = dv[(j - j_begin) * Dp + d];
      }
    }
  });
  if (n_runs == 1) return;

  // dq_i = scale * (partial of run r0 + r0 + 1 + ...), the runs whose keys query i sees (from
  // the one holding its first key), in run order; each of them wrote row i.
  run_tasks(pool, static_cast<size_t>(B * H), [&](int, size_t bh) {
    const size_t b = bh / static_cast<size_t>(H), h = bh % static_cast<size_t>(H);
    const float* parts = partial.get() + bh * n_runs * TD;
    const size_t run_keys = kt_per_run * kBc;
    for (size_t i = 0; i < Tz; ++i) {
      float* gq = dqkv + (b * Tz + i) * ld + h * D;
      const size_t r0 = first_key(i, W) / run_keys;
      const size_t runs_seen = std::min(n_runs, i / run_keys + 1);
      for (size_t d = 0; d < D; ++d) {
        float sum = parts[r0 * TD + i * Dp + d];
        for (size_t r = r0 + 1; r < runs_seen; ++r) sum += parts[r * TD + i * Dp + d];
        gq[d] = sum * scale;
      }
    }
  });
}

}  // namespace tessera::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tessera::cpu {

HWY_EXPORT(AttentionForward);
HWY_EXPORT(AttentionBackward);

void attention_forward(ThreadPool& pool, float* out, float* lse, const float* qkv,
                       const ops::AttentionArgs& a) {
  attention_detail::check_args("attention_forward", out, lse, qkv, a);
  HWY_DYNAMIC_DISPATCH(AttentionForward)(pool, out, lse, qkv, a);
}

void attention_backward(ThreadPool& pool, float* dqkv, const float* dout, const float* qkv,
                        const float* out, const float* lse, const ops::AttentionArgs& a) {
  attention_detail::check_args("attention_backward", dqkv, dout, qkv, a);
  TS_CHECK(a.B * a.T == 0 || (out && lse), "[attention_backward] null tensor pointer");
  HWY_DYNAMIC_DISPATCH(AttentionBackward)(pool, dqkv, dout, qkv, out, lse, a);
}

}  // namespace tessera::cpu
#endif  // HWY_ONCE
