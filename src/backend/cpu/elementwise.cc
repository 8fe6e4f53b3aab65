// Highway kernels for the elementwise ops: GELU (tanh approximation) forward/backward, add,
// scale, and the double-precision sum of squares; each split into size-fixed chunks.
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/fixed_chunks.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/elementwise.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// Separate block: gelu-inl.h needs highway.h first (and include sorting would swap them).
#include "backend/cpu/gelu-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tessera::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Applies op to whole vectors of in[0,n), then to the tail through a zero-padded buffer, so no
// load or store touches memory past n.
template <class D, class Op>
HWY_INLINE void Map2(D d, float* out, const float* a, const float* b, int64_t n, const Op& op) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(op(hn::LoadU(d, a + i), hn::LoadU(d, b + i)), d, out + i);
  if (i < n) {
    HWY_ALIGN float ba[HWY_MAX_BYTES / sizeof(float)] = {};
    HWY_ALIGN float bb[HWY_MAX_BYTES / sizeof(float)] = {};
    const size_t rem = static_cast<size_t>(n - i);
    std::memcpy(ba, a + i, rem * sizeof(float));
    std::memcpy(bb, b + i, rem * sizeof(float));
    hn::Store(op(hn::Load(d, ba), hn::Load(d, bb)), d, ba);
    std::memcpy(out + i, ba, rem * sizeof(float));
  }
}

void GeluForward(ThreadPool& pool, float* out, const float* inp, int64_t n) {
  for_each_chunk(pool, n, kElementwiseChunk, [&](int64_t, int64_t i0, int64_t i1) {
    const hn::ScalableTag<float> d;
    Map2(d, out + i0, inp + i0, inp + i0, i1 - i0, [d](auto x, auto) {
      decltype(x) e;
      return hn::Mul(x, GeluFactor(d, x, &e));
    });
  });
}

void GeluBackward(ThreadPool& pool, float* dinp, const float* inp, const float* dout, int64_t n) {
  for_each_chunk(pool, n, kElementwiseChunk, [&](int64_t, int64_t i0, int64_t i1) {
    const hn::ScalableTag<float> d;
    Map2(d, dinp + i0, inp + i0, dout + i0, i1 - i0,
         [d](auto x, auto g) { return hn::Mul(GeluGrad(d, x), g); });
  });
}

void Add(ThreadPool& pool, float* out, const float* a, const float* b, int64_t n) {
  for_each_chunk(pool, n, kElementwiseChunk, [&](int64_t, int64_t i0, int64_t i1) {
    const hn::ScalableTag<float> d;
    Map2(d, out + i0, a + i0, b + i0, i1 - i0, [](auto x, auto y) { return hn::Add(x, y); });
  });
}

void Scale(ThreadPool& pool, float* x, int64_t n, float s) {
  for_each_chunk(pool, n, kElementwiseChunk, [&](int64_t, int64_t i0, int64_t i1) {
    const hn::ScalableTag<float> d;
    const auto vs = hn::Set(d, s);
    Map2(d, x + i0, x + i0, x + i0, i1 - i0, [vs](auto v, auto) { return hn::Mul(v, vs); });
  });
}

// Squares are exact in double; per-lane double sums, lanes reduced in a fixed order.
double SumSquaresRange(const float* x, int64_t n) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const int64_t L = static_cast<int64_t>(hn::Lanes(dd));
  auto acc0 = hn::Zero(dd), acc1 = hn::Zero(dd);
  int64_t i = 0;
  for (; i + 2 * L <= n; i += 2 * L) {
    __builtin_prefetch(x + i + 1024);  // 4 KiB ahead: 18-20 -> 24-31 GB/s from DRAM, 2 threads
    const auto a = hn::PromoteTo(dd, hn::LoadU(df, x + i));
    const auto b = hn::PromoteTo(dd, hn::LoadU(df, x + i + L));
    acc0 = hn::MulAdd(a, a, acc0);
    acc1 = hn::MulAdd(b, b, acc1);
  }
  double s = hn::GetLane(hn::SumOfLanes(dd, hn::Add(acc0, acc1)));
  for (; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

}  // namespace HWY_NAMESPACE
}  // namespace tessera::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tessera::cpu {

HWY_EXPORT(GeluForward);
HWY_EXPORT(GeluBackward);
HWY_EXPORT(Add);
HWY_EXPORT(Scale);
HWY_EXPORT(SumSquaresRange);

void gelu_forward(ThreadPool& pool, float* out, const float* inp, int64_t n) {
  HWY_DYNAMIC_DISPATCH(GeluForward)(pool, out, inp, n);
}

void gelu_backward(ThreadPool& pool, float* dinp, const float* inp, const float* dout, int64_t n) {
  HWY_DYNAMIC_DISPATCH(GeluBackward)(pool, dinp, inp, dout, n);
}

void add(ThreadPool& pool, float* out, const float* a, const float* b, int64_t n) {
  HWY_DYNAMIC_DISPATCH(Add)(pool, out, a, b, n);
}

void scale(ThreadPool& pool, float* x, int64_t n, float s) {
  HWY_DYNAMIC_DISPATCH(Scale)(pool, x, n, s);
}

// At most kMaxChunks partials (kept on the stack, so nothing is allocated); the chunk size
// depends only on n, and partials are added in chunk order, so the result is bit-identical
// for any thread count.
double sum_squares(ThreadPool& pool, const float* x, int64_t n) {
  constexpr int64_t kMaxChunks = 256, kMinChunk = 16384;
  int64_t chunk = std::max(kMinChunk, (n + kMaxChunks - 1) / kMaxChunks);
  chunk = (chunk + 63) / 64 * 64;
  double partial[kMaxChunks] = {};
  const auto range = HWY_DYNAMIC_DISPATCH(SumSquaresRange);
  for_each_chunk(pool, n, chunk,
                 [&](int64_t k, int64_t i0, int64_t i1) { partial[k] = range(x + i0, i1 - i0); });
  double s = 0;
  for (int64_t k = 0; k < kMaxChunks; ++k) s += partial[k];
  return s;
}

}  // namespace tessera::cpu
#endif  // HWY_ONCE
