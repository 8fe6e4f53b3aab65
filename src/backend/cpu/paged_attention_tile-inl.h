// Row-tiled paged attention over keys stored transposed: the query heads of several rows of one
// sequence (chunked prefill) share each cache block's loads; compiled once per SIMD target
// (included from paged_attention.cc after hwy/foreach_target.h).
#if defined(TESSERA_BACKEND_CPU_PAGED_ATTENTION_TILE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TESSERA_BACKEND_CPU_PAGED_ATTENTION_TILE_INL_H_
#undef TESSERA_BACKEND_CPU_PAGED_ATTENTION_TILE_INL_H_
#else
#define TESSERA_BACKEND_CPU_PAGED_ATTENTION_TILE_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/cpu/paged_attention.h"
#include "core/dtype.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tessera::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Every query vector (one head of one row) gets the same arithmetic whichever tile, chunk or
// thread computes it, so a row alone equals that row in a batch, bit for bit:
//  - score j = scale * (one multiply-add chain over the dimensions in order);
//  - per block: scores outside the row's keys are -inf, p = exp(s - m) (0 outside), the block's
//    sum added lane-wise vector by vector in key order (trailing all-zero vectors change
//    nothing), and acc = acc * correction then one multiply-add chain over keys 0 .. count-1.
// Kernels differ only in how many query vectors (NQ) share each widened key or value vector: up
// to five on AVX2, a 5 x 2-vector register tile (10 accumulators cover the multiply-add latency
// of two pipes; 2 loads and 5 broadcasts feed 10 multiply-adds). Six would need 15 of AVX2's 16
// registers, and GCC spills one to the stack in the inner loop (measured 1.5x slower). AVX-512's
// 32 registers hold an 8 x 2 tile: a Llama query group of 8 then reads each key and value
// vector once instead of twice (5 + 3). One Xeon core, 32 / 4 heads over 544 keys, 22 layers in
// turn (BM_PagedAttentionDecodeLlama1B): 81.6 against 94.8 us per layer, 42.3 against 56.6 on
// two threads.
namespace tile_detail {

using DF = hn::ScalableTag<float>;

// Cache elements as f32 vectors: f32 loads directly, f16 widens on the way in.
template <class D>
HWY_INLINE hn::Vec<D> LoadWide(D d, const float* p) {
  return hn::LoadU(d, p);
}
template <class D>
HWY_INLINE hn::Vec<D> LoadWide(D d, const uint16_t* p) {
  const hn::Rebind<hwy::float16_t, D> dh;
  return hn::PromoteTo(d, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
}

#if HWY_TARGET <= HWY_AVX3
constexpr int kMaxNQ = 8;
#else
constexpr int kMaxNQ = 5;
#endif
// Key (or value) vectors per kernel call: accumulators 5 * 2, 4 * 2, 3 * 2, 2 * 4, 1 * 4.
constexpr int Width(int nq) {
  return nq >= 3 ? 2 : 4;
}

// Asks for the cache lines of n elements at p (nothing for a null p).
template <typename T>
HWY_INLINE void PrefetchRow(const T* p, int64_t n) {
  if (p == nullptr) return;
  for (int64_t o = 0; o < n; o += 64 / static_cast<int64_t>(sizeof(T))) __builtin_prefetch(p + o);
}

// s[q][j .. j + NV*L) for NQ query vectors; kt is one head's keys, (D, bt). With pf (the next
// block's keys, same layout) each dimension's step also asks for that row of pf.
template <int NQ, int NV, typename T>
HWY_INLINE void Scores(const float* const* qs, float* const* ss, const T* kt, int64_t bt, int64_t j,
                       int64_t D, float scale, const T* pf) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  hn::Vec<DF> a[NQ][NV];
  for (int q = 0; q < NQ; ++q)
    for (int v = 0; v < NV; ++v) a[q][v] = hn::Zero(d);
  for (int64_t e = 0; e < D; ++e) {
    PrefetchRow(pf ? pf + e * bt : pf, bt);
    const T* row = kt + e * bt + j;
    hn::Vec<DF> k[NV];
    for (int v = 0; v < NV; ++v) k[v] = LoadWide(d, row + v * L);
    for (int q = 0; q < NQ; ++q) {
      const auto x = hn::Set(d, qs[q][e]);
      for (int v = 0; v < NV; ++v) a[q][v] = hn::MulAdd(x, k[v], a[q][v]);
    }
  }
  const auto sc = hn::Set(d, scale);
  for (int q = 0; q < NQ; ++q)
    for (int v = 0; v < NV; ++v) hn::StoreU(hn::Mul(a[q][v], sc), d, ss[q] + j + v * L);
}

// Scores of NQ query vectors over key vectors [0, nv); the first pass over the dimensions also
// asks for pf's rows (see Scores).
template <int NQ, typename T>
HWY_NOINLINE void ScoresRange(const float* const* qs, float* const* ss, const T* kt, int64_t bt,
                              int64_t nv, int64_t D, float scale, const T* pf) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(DF()));
  constexpr int kNV = Width(NQ);
  int64_t v = 0;
  for (; v + kNV <= nv; v += kNV, pf = nullptr)
    Scores<NQ, kNV>(qs, ss, kt, bt, v * L, D, scale, pf);
  for (; v < nv; ++v, pf = nullptr) Scores<NQ, 1>(qs, ss, kt, bt, v * L, D, scale, pf);
}

// acc[q][dv + u*L ..] for NDV value vectors: keys [j0, j1) of v, (bt, D). With `rescale` the
// chain starts from acc * corr[q] (the block's first keys). With pf (the next block's values,
// same layout) each key's step also asks for that key's row of pf.
template <int NQ, int NDV, typename T>
HWY_INLINE void Accumulate(float* const* accs, const float* corr, const float* const* ps,
                           const T* v, int64_t j0, int64_t j1, int64_t dv, int64_t D, bool rescale,
                           const T* pf) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  hn::Vec<DF> a[NQ][NDV];
  for (int q = 0; q < NQ; ++q)
    for (int u = 0; u < NDV; ++u) {
      a[q][u] = hn::LoadU(d, accs[q] + dv + u * L);
      if (rescale) a[q][u] = hn::Mul(a[q][u], hn::Set(d, corr[q]));
    }
  for (int64_t j = j0; j < j1; ++j) {
    PrefetchRow(pf ? pf + j * D : pf, D);
    const T* row = v + j * D + dv;
    hn::Vec<DF> x[NDV];
    for (int u = 0; u < NDV; ++u) x[u] = LoadWide(d, row + u * L);
    for (int q = 0; q < NQ; ++q) {
      const auto p = hn::Set(d, ps[q][j]);
      for (int u = 0; u < NDV; ++u) a[q][u] = hn::MulAdd(p, x[u], a[q][u]);
    }
  }
  for (int q = 0; q < NQ; ++q)
    for (int u = 0; u < NDV; ++u) hn::StoreU(a[q][u], d, accs[q] + dv + u * L);
}

// All D dimensions of NQ accumulators over keys [j0, j1) (a lone query vector takes 8 value
// vectors at a time, to keep 8 chains in flight); the first pass over the keys also asks for
// pf's rows (see Accumulate).
template <int NQ, typename T>
HWY_NOINLINE void AccumulateRange(float* const* accs, const float* corr, const float* const* ps,
                                  const T* v, int64_t j0, int64_t j1, int64_t D, bool rescale,
                                  const T* pf = nullptr) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(DF()));
  constexpr int kNDV = NQ == 1 ? 8 : Width(NQ);
  const int64_t nd = D / L;
  int64_t u = 0;
  for (; u + kNDV <= nd; u += kNDV, pf = nullptr)
    Accumulate<NQ, kNDV>(accs, corr, ps, v, j0, j1, u * L, D, rescale, pf);
  for (; u < nd; ++u, pf = nullptr)
    Accumulate<NQ, 1>(accs, corr, ps, v, j0, j1, u * L, D, rescale, pf);
}

// exp(x) for x <= 0 (a score minus the running maximum): Highway's Exp (reduction by ln 2 in
// two parts, the same polynomial) without its handling of large x, which cannot occur here: 2^q
// is one exponent-field add (q >= -126). 0 below -87, where 2^q would leave the normal range
// (the sum of a row's p is >= 1, so that changes nothing), and for -inf (keys outside the row).
template <class D>
HWY_INLINE hn::Vec<D> ExpNonPositive(D d, hn::Vec<D> x) {
  const hn::Rebind<int32_t, D> di;
  // x / ln 2 - 0.5 truncated toward zero: the nearest integer to x / ln 2 for x <= 0.
  const auto q = hn::ConvertTo(
      di, hn::MulAdd(x, hn::Set(d, 1.442695040888963407359924681f), hn::Set(d, -0.5f)));
  const auto qf = hn::ConvertTo(d, q);
  auto r = hn::MulAdd(qf, hn::Set(d, -0.693145751953125f), x);
  r = hn::MulAdd(qf, hn::Set(d, -1.428606765330187045e-6f), r);
  auto p = hn::Set(d, 0.000198527617612853646278381f);
  p = hn::MulAdd(p, r, hn::Set(d, 0.00139304355252534151077271f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.00833336077630519866943359f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.0416664853692054748535156f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.166666671633720397949219f));
  p = hn::MulAdd(p, r, hn::Set(d, 0.5f));
  const auto y = hn::Add(hn::MulAdd(p, hn::Mul(r, r), r), hn::Set(d, 1.0f));
  const auto scale = hn::BitCast(d, hn::ShiftLeft<23>(hn::Add(q, hn::Set(di, 127))));
  return hn::IfThenElseZero(hn::Ge(x, hn::Set(d, -87.0f)), hn::Mul(y, scale));
}

// Per-thread scratch of a tile task.
struct TileScratch {
  std::vector<float> acc, s, m, l, corr, shift;
  std::vector<const float*> q, p;
  std::vector<float*> accp, sp;
  std::vector<int64_t> act, skip, count;
};

// The block's online-softmax step for the n active query vectors of w: masks each s outside
// [skip, count), turns it into p in place, updates m and l and sets corr, the running output's
// correction. Two passes over all vectors (maxima, then exponentials) keep many independent
// exponentials in flight.
HWY_NOINLINE void SoftmaxStep(TileScratch& w, int64_t n, int64_t nv) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const auto neg_inf = hn::Set(d, -INFINITY);
  for (int64_t k = 0; k < n; ++k) {
    float* s = w.sp[k];
    const int64_t skip = w.skip[k], count = w.count[k];
    auto mx = neg_inf;
    if (skip == 0 && count == nv * L) {  // every key of the vectors is the row's (most blocks)
      for (int64_t v = 0; v < nv; ++v) mx = hn::Max(mx, hn::LoadU(d, s + v * L));
    } else {
      const auto lo = hn::Set(d, static_cast<float>(skip));
      const auto hi = hn::Set(d, static_cast<float>(count));
      for (int64_t v = 0; v < nv; ++v) {
        const auto idx = hn::Iota(d, static_cast<float>(v * L));
        const auto in = hn::And(hn::Ge(idx, lo), hn::Lt(idx, hi));
        const auto x = hn::IfThenElse(in, hn::LoadU(d, s + v * L), neg_inf);
        hn::StoreU(x, d, s + v * L);
        mx = hn::Max(mx, x);
      }
    }
    float& m = w.m[static_cast<size_t>(w.act[k])];
    const float m_new = std::max(m, hn::GetLane(hn::MaxOfLanes(d, mx)));
    // exp(0) is exactly 1: skip the call when the maximum did not move.
    w.corr[k] = m_new == m ? 1.0f : std::exp(m - m_new);  // 0 on the first block
    w.shift[k] = m = m_new;
  }
  for (int64_t k = 0; k < n; ++k) {
    float* s = w.sp[k];
    const auto shift = hn::Set(d, w.shift[k]);
    auto sum = hn::Zero(d);
    for (int64_t v = 0; v < nv; ++v) {
      const auto p = ExpNonPositive(d, hn::Sub(hn::LoadU(d, s + v * L), shift));
      hn::StoreU(p, d, s + v * L);
      sum = hn::Add(sum, p);
    }
    float& l = w.l[static_cast<size_t>(w.act[k])];
    l = l * w.corr[k] + hn::GetLane(hn::SumOfLanes(d, sum));
    w.p[k] = s;
  }
}

// Calls F<NQ>::run(args...) for the chunk size nq in 1 .. kMaxNQ.
template <template <int> class F, typename... Args>
HWY_INLINE void ForChunk(int64_t nq, Args&&... args) {
  switch (nq) {
#if HWY_TARGET <= HWY_AVX3
    case 8:
      return F<8>::run(args...);
    case 7:
      return F<7>::run(args...);
    case 6:
      return F<6>::run(args...);
#endif
    case 5:
      return F<5>::run(args...);
    case 4:
      return F<4>::run(args...);
    case 3:
      return F<3>::run(args...);
    case 2:
      return F<2>::run(args...);
    default:
      return F<1>::run(args...);
  }
}
template <int NQ>
struct ScoresChunk {
  template <typename T>
  static void run(const float* const* qs, float* const* ss, const T* kt, int64_t bt, int64_t nv,
                  int64_t D, float scale, const T* pf) {
    ScoresRange<NQ>(qs, ss, kt, bt, nv, D, scale, pf);
  }
};
template <int NQ>
struct AccumulateChunk {
  template <typename T>
  static void run(float* const* accs, const float* corr, const float* const* ps, const T* v,
                  int64_t j0, int64_t j1, int64_t D, bool rescale, const T* pf) {
    AccumulateRange<NQ>(accs, corr, ps, v, j0, j1, D, rescale, pf);
  }
};

// One block for the n active query vectors of w, in chunks of up to kMaxNQ: scores, softmax
// step, p V. kt (D, bt) and v (bt, D) are one head's keys and values; next_k / next_v (or null)
// the next block's, which the first chunk's loops ask for line by line as they go.
template <typename T>
HWY_NOINLINE void BlockStep(TileScratch& w, int64_t n, int64_t nv, const T* kt, const T* v,
                            int64_t bt, int64_t D, float scale, const T* next_k, const T* next_v) {
  for (int64_t i = 0; i < n; i += kMaxNQ)
    ForChunk<ScoresChunk>(std::min<int64_t>(kMaxNQ, n - i), &w.q[i], &w.sp[i], kt, bt, nv, D, scale,
                          i == 0 ? next_k : nullptr);
  SoftmaxStep(w, n, nv);
  // A chunk shares the keys all its rows have; a longer row's extra keys continue its chain.
  for (int64_t i = 0; i < n; i += kMaxNQ) {
    const int64_t nq = std::min<int64_t>(kMaxNQ, n - i);
    const int64_t c = *std::min_element(&w.count[i], &w.count[i] + nq);
    ForChunk<AccumulateChunk>(nq, &w.accp[i], &w.corr[i], &w.p[i], v, int64_t{0}, c, D, true,
                              i == 0 ? next_v : nullptr);
    for (int64_t k = i; k < i + nq; ++k)
      if (w.count[k] > c)
        AccumulateRange<1>(&w.accp[k], &w.corr[k], &w.p[k], v, c, w.count[k], D, false);
  }
}

// Query vectors of tile rows [r0, r1) (all reading row r0's block table) and query heads [h0, h1)
// of KV head g; a row's blocks run from its first key's block to its last key's.
template <typename T>
HWY_NOINLINE void TileTask(const ops::PagedAttentionArgs& a, TileScratch& w, int64_t r0, int64_t r1,
                           int64_t g, int64_t h0, int64_t h1) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t group = a.H / a.Hkv, D = a.D, BT = a.block_tokens, nh = h1 - h0;
  const int64_t nq = (r1 - r0) * nh;
  w.acc.assign(static_cast<size_t>(nq * D), 0.0f);
  w.s.resize(static_cast<size_t>(nq * BT));
  w.m.assign(static_cast<size_t>(nq), -INFINITY);
  w.l.assign(static_cast<size_t>(nq), 0.0f);
  w.corr.resize(static_cast<size_t>(nq));
  w.shift.resize(static_cast<size_t>(nq));
  w.q.resize(static_cast<size_t>(nq));
  w.p.resize(static_cast<size_t>(nq));
  w.accp.resize(static_cast<size_t>(nq));
  w.sp.resize(static_cast<size_t>(nq));
  w.act.resize(static_cast<size_t>(nq));
  w.skip.resize(static_cast<size_t>(nq));
  w.count.resize(static_cast<size_t>(nq));
  int64_t b_lo = INT64_MAX, b_hi = 0;
  for (int64_t r = r0; r < r1; ++r) {
    b_lo = std::min<int64_t>(b_lo, (a.first_key ? a.first_key[r] : 0) / BT);
    b_hi = std::max<int64_t>(b_hi, (a.n_keys[r] - 1) / BT);
  }
  const int32_t* table = a.block_tables + r0 * a.table_stride;
  const T* cache = static_cast<const T*>(a.kv);
  for (int64_t b = b_lo; b <= b_hi; ++b) {
    const int64_t j0 = b * BT;
    // The query vectors whose rows have keys in this block, with their key ranges in it.
    int64_t n = 0, cmax = 0;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t nk = a.n_keys[r], first = a.first_key ? a.first_key[r] : 0;
      if (nk <= j0 || first >= j0 + BT) continue;
      const int64_t count = std::min(BT, nk - j0), skip = std::max<int64_t>(0, first - j0);
      cmax = std::max(cmax, count);
      for (int64_t h = 0; h < nh; ++h) {
        const int64_t i = (r - r0) * nh + h;
        w.act[n] = i;
        w.skip[n] = skip;
        w.count[n] = count;
        w.q[n] = a.q + (r * a.H + g * group + h0 + h) * D;
        w.sp[n] = w.s.data() + i * BT;
        w.accp[n] = w.acc.data() + i * D;
        ++n;
      }
    }
    if (n == 0) continue;
    const int64_t nv = (cmax + L - 1) / L;
    const T* kb = cache + table[b] * a.block_stride + g * BT * D;
    const T* vb = kb + a.v_offset;
    // The next block's keys and values sit elsewhere in the arena, where the hardware
    // prefetcher cannot guess them; decode reads every block once, from L3 or memory. The
    // block's own loops ask for them a line per step (a burst of 2 x 64 requests up front
    // overflows the core's outstanding-miss slots); the first block is asked for here.
    const T* next_k = nullptr;
    const T* next_v = nullptr;
    if (b < b_hi) {
      next_k = cache + table[b + 1] * a.block_stride + g * BT * D;
      next_v = next_k + a.v_offset;
    }
    if (b == b_lo) {
      PrefetchRow(kb, BT * D);
      PrefetchRow(vb, BT * D);
    }
    BlockStep(w, n, nv, kb, vb, BT, D, a.scale, next_k, next_v);
  }
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t i = (r - r0) * nh + h;
      float* out = a.out + (r * a.H + g * group + h0 + h) * D;
      const float* acc = w.acc.data() + i * D;
      const float inv = 1.0f / w.l[static_cast<size_t>(i)];
      for (int64_t e = 0; e < D; ++e) out[e] = acc[e] * inv;
    }
}

}  // namespace tile_detail
}  // namespace tessera::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
