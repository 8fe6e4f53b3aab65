// Highway paged attention. Keys stored transposed (the engine's layout) take the row-tiled
// kernel of paged_attention_tile-inl.h. Other layouts and shapes take the per-head kernel here:
// for each (query row, key/value head) the query heads that share the head walk the sequence's
// cache blocks, with an online softmax per head (scores of one block, then one rescale of the
// running output). f16 caches widen on load. Each head is computed by one thread in a fixed
// order, so results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/paged_attention.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/paged_attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// Separate block: math-inl.h needs highway.h first.
#include "hwy/contrib/math/math-inl.h"
// Separate block: compiled per target after foreach_target.h.
#include "backend/cpu/paged_attention_tile-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tessera::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Cache elements as f32 vectors (f16 widens on the way in): the tiled kernel's loader.
using tile_detail::LoadWide;
HWY_INLINE float ScalarKV(const float* p) {
  return *p;
}
HWY_INLINE float ScalarKV(const uint16_t* p) {
  return f16_to_f32(*p);
}

template <typename T>
float Dot(const float* a, const T* b, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  auto s0 = hn::Zero(d), s1 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {
    s0 = hn::MulAdd(hn::LoadU(d, a + i), LoadWide(d, b + i), s0);
    s1 = hn::MulAdd(hn::LoadU(d, a + i + L), LoadWide(d, b + i + L), s1);
  }
  for (; i + L <= n; i += L) s0 = hn::MulAdd(hn::LoadU(d, a + i), LoadWide(d, b + i), s0);
  float s = hn::GetLane(hn::SumOfLanes(d, hn::Add(s0, s1)));
  for (; i < n; ++i) s += a[i] * ScalarKV(b + i);
  return s;
}

// scores (count) = scale * q . K[j] for keys stored transposed: kt[d * bt + j]. Keys sit in the
// vector lanes, so each dimension is one broadcast multiply-add per vector of keys.
template <typename T>
void ScoresTransposed(float* scores, const float* q, const T* kt, int64_t bt, int64_t count,
                      int64_t D, float scale) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  int64_t j = 0;
  // Four vectors of keys, even and odd dimensions in separate accumulators: eight independent
  // multiply-add chains hide the FMA latency (one chain over D would wait on it every step).
  for (; j + 4 * L <= count; j += 4 * L) {
    auto a0 = hn::Zero(d), a1 = hn::Zero(d), a2 = hn::Zero(d), a3 = hn::Zero(d);
    auto b0 = hn::Zero(d), b1 = hn::Zero(d), b2 = hn::Zero(d), b3 = hn::Zero(d);
    int64_t e = 0;
    for (; e + 2 <= D; e += 2) {
      const auto qa = hn::Set(d, q[e]), qb = hn::Set(d, q[e + 1]);
      const T* ra = kt + e * bt + j;
      const T* rb = ra + bt;
      a0 = hn::MulAdd(qa, LoadWide(d, ra), a0);
      a1 = hn::MulAdd(qa, LoadWide(d, ra + L), a1);
      a2 = hn::MulAdd(qa, LoadWide(d, ra + 2 * L), a2);
      a3 = hn::MulAdd(qa, LoadWide(d, ra + 3 * L), a3);
      b0 = hn::MulAdd(qb, LoadWide(d, rb), b0);
      b1 = hn::MulAdd(qb, LoadWide(d, rb + L), b1);
      b2 = hn::MulAdd(qb, LoadWide(d, rb + 2 * L), b2);
      b3 = hn::MulAdd(qb, LoadWide(d, rb + 3 * L), b3);
    }
    if (e < D) {
      const auto qa = hn::Set(d, q[e]);
      const T* ra = kt + e * bt + j;
      a0 = hn::MulAdd(qa, LoadWide(d, ra), a0);
      a1 = hn::MulAdd(qa, LoadWide(d, ra + L), a1);
      a2 = hn::MulAdd(qa, LoadWide(d, ra + 2 * L), a2);
      a3 = hn::MulAdd(qa, LoadWide(d, ra + 3 * L), a3);
    }
    const auto sc = hn::Set(d, scale);
    hn::StoreU(hn::Mul(hn::Add(a0, b0), sc), d, scores + j);
    hn::StoreU(hn::Mul(hn::Add(a1, b1), sc), d, scores + j + L);
    hn::StoreU(hn::Mul(hn::Add(a2, b2), sc), d, scores + j + 2 * L);
    hn::StoreU(hn::Mul(hn::Add(a3, b3), sc), d, scores + j + 3 * L);
  }
  for (; j + L <= count; j += L) {
    auto a0 = hn::Zero(d);
    for (int64_t e = 0; e < D; ++e)
      a0 = hn::MulAdd(hn::Set(d, q[e]), LoadWide(d, kt + e * bt + j), a0);
    hn::StoreU(hn::Mul(a0, hn::Set(d, scale)), d, scores + j);
  }
  for (; j < count; ++j) {
    float a = 0;
    for (int64_t e = 0; e < D; ++e) a += q[e] * ScalarKV(kt + e * bt + j);
    scores[j] = a * scale;
  }
}

// acc (n) = acc * scale + sum_j p[j] * v[j*n ...]. Four vectors of acc at a time, keys inner:
// four independent multiply-add chains instead of one that waits on the FMA latency.
template <typename T>
void ScaleAccumulate(float* acc, float scale, const float* p, const T* v, int64_t count,
                     int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const auto sc = hn::Set(d, scale);
  int64_t i = 0;
  for (; i + 4 * L <= n; i += 4 * L) {
    auto a0 = hn::Mul(hn::LoadU(d, acc + i), sc), a1 = hn::Mul(hn::LoadU(d, acc + i + L), sc);
    auto a2 = hn::Mul(hn::LoadU(d, acc + i + 2 * L), sc);
    auto a3 = hn::Mul(hn::LoadU(d, acc + i + 3 * L), sc);
    for (int64_t j = 0; j < count; ++j) {
      const auto pj = hn::Set(d, p[j]);
      const T* row = v + j * n + i;
      a0 = hn::MulAdd(pj, LoadWide(d, row), a0);
      a1 = hn::MulAdd(pj, LoadWide(d, row + L), a1);
      a2 = hn::MulAdd(pj, LoadWide(d, row + 2 * L), a2);
      a3 = hn::MulAdd(pj, LoadWide(d, row + 3 * L), a3);
    }
    hn::StoreU(a0, d, acc + i);
    hn::StoreU(a1, d, acc + i + L);
    hn::StoreU(a2, d, acc + i + 2 * L);
    hn::StoreU(a3, d, acc + i + 3 * L);
  }
  for (; i + L <= n; i += L) {
    auto a = hn::Mul(hn::LoadU(d, acc + i), sc);
    for (int64_t j = 0; j < count; ++j)
      a = hn::MulAdd(hn::Set(d, p[j]), LoadWide(d, v + j * n + i), a);
    hn::StoreU(a, d, acc + i);
  }
  for (; i < n; ++i) {
    float a = acc[i] * scale;
    for (int64_t j = 0; j < count; ++j) a += p[j] * ScalarKV(v + j * n + i);
    acc[i] = a;
  }
}

// p (n) = exp(s - mx) in place; returns the sum.
float ExpShiftSum(float* s, float mx, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  auto sum = hn::Zero(d);
  for (; i + L <= n; i += L) {
    const auto e = hn::CallExp(d, hn::Sub(hn::LoadU(d, s + i), hn::Set(d, mx)));
    hn::StoreU(e, d, s + i);
    sum = hn::Add(sum, e);
  }
  float total = hn::GetLane(hn::SumOfLanes(d, sum));
  for (; i < n; ++i) {
    s[i] = std::exp(s[i] - mx);
    total += s[i];
  }
  return total;
}

// Task t covers query row t / (Hkv * parts), KV head (t / parts) % Hkv, and the query heads
// [h0, h1) of that head's group given by part t % parts. Every head's arithmetic is the same
// whatever the split, so results do not depend on it (or on the thread count).
template <typename T>
void PagedAttentionTyped(ThreadPool& pool, const ops::PagedAttentionArgs& a) {
  const int64_t group = a.H / a.Hkv, D = a.D, BT = a.block_tokens;
  // Decode has one row: with fewer (row, KV head) pairs than a few per thread, split groups so
  // the threads share the heads (SmolLM2's 3 KV heads would leave one of 2 threads half idle).
  const int64_t parts = a.rows * a.Hkv < 8 ? std::min<int64_t>(group, 4) : 1;
  const T* cache = static_cast<const T*>(a.kv);
  pool.parallel_for(a.rows * a.Hkv * parts, 1, [&](int64_t t0, int64_t t1) {
    thread_local std::vector<float> acc, scores, m, l;
    acc.resize(static_cast<size_t>(group * D));
    scores.resize(static_cast<size_t>(BT));
    m.resize(static_cast<size_t>(group));
    l.resize(static_cast<size_t>(group));
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r = t / (a.Hkv * parts), g = (t / parts) % a.Hkv, part = t % parts;
      const int64_t h0 = group * part / parts, h1 = group * (part + 1) / parts;
      const int64_t nk = a.n_keys[r], first = a.first_key ? a.first_key[r] : 0;
      std::fill(acc.begin(), acc.end(), 0.0f);
      std::fill(m.begin(), m.end(), -INFINITY);
      std::fill(l.begin(), l.end(), 0.0f);
      for (int64_t j0 = first / BT * BT; j0 < nk; j0 += BT) {
        const int64_t count = std::min(BT, nk - j0);
        const int64_t skip = std::max<int64_t>(0, first - j0);  // keys before the window
        const T* kb =
            cache + a.block_tables[r * a.table_stride + j0 / BT] * a.block_stride + g * BT * D;
        const T* vb = kb + a.v_offset;
        for (int64_t h = h0; h < h1; ++h) {
          const float* q = a.q + (r * a.H + g * group + h) * D;
          if (a.k_transposed) {
            ScoresTransposed(scores.data(), q, kb, BT, count, D, a.scale);
          } else {
            for (int64_t j = 0; j < count; ++j) scores[j] = Dot(q, kb + j * D, D) * a.scale;
          }
          for (int64_t j = 0; j < skip; ++j) scores[j] = -INFINITY;  // exp gives them 0
          float mx = m[h];
          for (int64_t j = skip; j < count; ++j) mx = std::max(mx, scores[j]);
          const float correction = std::exp(m[h] - mx);  // 0 on the first block (m = -inf)
          const float block_sum = ExpShiftSum(scores.data(), mx, count);
          l[h] = l[h] * correction + block_sum;
          m[h] = mx;
          ScaleAccumulate(acc.data() + h * D, correction, scores.data(), vb, count, D);
        }
      }
      for (int64_t h = h0; h < h1; ++h) {
        float* out = a.out + (r * a.H + g * group + h) * D;
        const float inv = 1.0f / l[h];
        for (int64_t d = 0; d < D; ++d) out[d] = acc[h * D + d] * inv;
      }
    }
  });
}

// Rows per tile: 5 rows of SmolLM2's 3-head groups are three 5-vector chunks that read each block
// while it is in L1, and prefill still has hundreds of tasks to balance over the threads.
constexpr int64_t kTileRows = 5;

// Whether row r's keys sit in the blocks row r0's table names (rows of one sequence: a prefill).
bool SharesTable(const ops::PagedAttentionArgs& a, int64_t r, int64_t r0) {
  const int64_t BT = a.block_tokens, b0 = (a.first_key ? a.first_key[r] : 0) / BT;
  const int64_t b1 = (a.n_keys[r] - 1) / BT + 1;
  const int32_t* t = a.block_tables + r * a.table_stride;
  const int32_t* t0 = a.block_tables + r0 * a.table_stride;
  return std::equal(t + b0, t + b1, t0 + b0);
}

// Keys stored transposed, whole vectors per block and head: tiles of up to kTileRows
// consecutive rows whose keys sit in the same blocks (one sequence's prefill rows). Task t covers
// tile (tiles - 1 - t / (Hkv * parts)), the heaviest (last, longest causal rows) first so the
// threads finish together, KV head (t / parts) % Hkv and part t % parts of its query group.
template <typename T>
void PagedAttentionTiled(ThreadPool& pool, const ops::PagedAttentionArgs& a) {
  const int64_t group = a.H / a.Hkv;
  std::vector<int64_t> starts;
  for (int64_t r = 0; r < a.rows; ++r)
    if (r == 0 || r - starts.back() == kTileRows || !SharesTable(a, r, starts.back()))
      starts.push_back(r);
  starts.push_back(a.rows);
  const int64_t tiles = static_cast<int64_t>(starts.size()) - 1;
  // Decode has few (tile, KV head) tasks: split query groups until each thread has about two
  // (more parts would leave single query vectors, which keep too few multiply-adds in flight).
  // The arithmetic of a query vector does not depend on the split, so the result does not either.
  const int64_t threads = pool.size(), tasks = tiles * a.Hkv;
  const int64_t parts = threads == 1 || tasks >= 2 * threads
                            ? 1
                            : std::min<int64_t>(group, (2 * threads + tasks - 1) / tasks);
  pool.parallel_for(tiles * a.Hkv * parts, 1, [&](int64_t t0, int64_t t1) {
    thread_local tile_detail::TileScratch w;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t tile = tiles - 1 - t / (a.Hkv * parts), g = (t / parts) % a.Hkv;
      const int64_t part = t % parts;
      tile_detail::TileTask<T>(a, w, starts[tile], starts[tile + 1], g, group * part / parts,
                               group * (part + 1) / parts);
    }
  });
}

void PagedAttention(ThreadPool& pool, const ops::PagedAttentionArgs& a) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(hn::ScalableTag<float>()));
  const bool tiled = a.k_transposed && a.D % L == 0 && a.block_tokens % L == 0;
  if (a.kv_type == DType::f16) {
    if (tiled) return PagedAttentionTiled<uint16_t>(pool, a);
    PagedAttentionTyped<uint16_t>(pool, a);
  } else {
    if (tiled) return PagedAttentionTiled<float>(pool, a);
    PagedAttentionTyped<float>(pool, a);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace tessera::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tessera::cpu {

HWY_EXPORT(PagedAttention);

void paged_attention(ThreadPool& pool, const ops::PagedAttentionArgs& a) {
  HWY_DYNAMIC_DISPATCH(PagedAttention)(pool, a);
}

}  // namespace tessera::cpu
#endif  // HWY_ONCE
