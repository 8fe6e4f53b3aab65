// Highway paged attention: for each (query row, key/value head) the query heads that share the
// head walk the sequence's cache blocks once, with an online softmax per head (scores of one
// block, then one rescale of the running output). One task per (row, kv head) computed by one
// thread in a fixed order, so results do not depend on the thread count.
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

HWY_BEFORE_NAMESPACE();
namespace tessera::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

float Dot(const float* a, const float* b, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  auto s0 = hn::Zero(d), s1 = hn::Zero(d);
  int64_t i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {
    s0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), s0);
    s1 = hn::MulAdd(hn::LoadU(d, a + i + L), hn::LoadU(d, b + i + L), s1);
  }
  for (; i + L <= n; i += L) s0 = hn::MulAdd(hn::LoadU(d, a + i), hn::LoadU(d, b + i), s0);
  float s = hn::GetLane(hn::SumOfLanes(d, hn::Add(s0, s1)));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// acc (n) = acc * scale + sum_j p[j] * v[j*n ...]
void ScaleAccumulate(float* acc, float scale, const float* p, const float* v, int64_t count,
                     int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    auto a = hn::Mul(hn::LoadU(d, acc + i), hn::Set(d, scale));
    for (int64_t j = 0; j < count; ++j)
      a = hn::MulAdd(hn::Set(d, p[j]), hn::LoadU(d, v + j * n + i), a);
    hn::StoreU(a, d, acc + i);
  }
  for (; i < n; ++i) {
    float a = acc[i] * scale;
    for (int64_t j = 0; j < count; ++j) a += p[j] * v[j * n + i];
    acc[i] = a;
  }
}

// dst (n) = src widened from f16.
void WidenF16(const uint16_t* src, float* dst, int64_t n) {
  const hn::ScalableTag<float> d;
  const hn::Rebind<hwy::float16_t, decltype(d)> dh;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const auto* s = reinterpret_cast<const hwy::float16_t*>(src);
  int64_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(hn::PromoteTo(d, hn::LoadU(dh, s + i)), d, dst + i);
  for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
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

void PagedAttention(ThreadPool& pool, const PagedAttentionArgs& a) {
  const int64_t group = a.H / a.Hkv, D = a.D, BT = a.block_tokens;
  pool.parallel_for(a.rows * a.Hkv, 1, [&](int64_t t0, int64_t t1) {
    thread_local std::vector<float> acc, scores, m, l, kf, vf;
    acc.resize(static_cast<size_t>(group * D));
    scores.resize(static_cast<size_t>(BT));
    m.resize(static_cast<size_t>(group));
    l.resize(static_cast<size_t>(group));
    const bool f16 = a.kv_type == DType::f16;
    if (f16) {
      kf.resize(static_cast<size_t>(BT * D));
      vf.resize(static_cast<size_t>(BT * D));
    }
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r = t / a.Hkv, g = t % a.Hkv, nk = a.n_keys[r];
      std::fill(acc.begin(), acc.end(), 0.0f);
      std::fill(m.begin(), m.end(), -INFINITY);
      std::fill(l.begin(), l.end(), 0.0f);
      for (int64_t j0 = 0; j0 < nk; j0 += BT) {
        const int64_t count = std::min(BT, nk - j0);
        const int64_t k_at = a.block_tables[r][j0 / BT] * a.block_stride + g * BT * D;
        const float* kb;
        const float* vb;
        if (f16) {
          // Widen the block's keys and values once; every query head of the group reuses them.
          const auto* h16 = static_cast<const uint16_t*>(a.kv);
          WidenF16(h16 + k_at, kf.data(), count * D);
          WidenF16(h16 + k_at + a.v_offset, vf.data(), count * D);
          kb = kf.data();
          vb = vf.data();
        } else {
          kb = static_cast<const float*>(a.kv) + k_at;
          vb = kb + a.v_offset;
        }
        for (int64_t h = 0; h < group; ++h) {
          const float* q = a.q + (r * a.H + g * group + h) * D;
          float mx = m[h];
          for (int64_t j = 0; j < count; ++j) {
            scores[j] = Dot(q, kb + j * D, D) * a.scale;
            mx = std::max(mx, scores[j]);
          }
          const float correction = std::exp(m[h] - mx);  // 0 on the first block (m = -inf)
          const float block_sum = ExpShiftSum(scores.data(), mx, count);
          l[h] = l[h] * correction + block_sum;
          m[h] = mx;
          ScaleAccumulate(acc.data() + h * D, correction, scores.data(), vb, count, D);
        }
      }
      for (int64_t h = 0; h < group; ++h) {
        float* out = a.out + (r * a.H + g * group + h) * D;
        const float inv = 1.0f / l[h];
        for (int64_t d = 0; d < D; ++d) out[d] = acc[h * D + d] * inv;
      }
    }
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace tessera::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tessera::cpu {

HWY_EXPORT(PagedAttention);

void paged_attention(ThreadPool& pool, const PagedAttentionArgs& a) {
  HWY_DYNAMIC_DISPATCH(PagedAttention)(pool, a);
}

}  // namespace tessera::cpu
#endif  // HWY_ONCE
