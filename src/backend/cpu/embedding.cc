// Highway token + position embedding. Forward runs over token rows; backward runs over column
// blocks, each walking all tokens in order, so rows of dwte hit by repeated tokens never race
// and the sums match the reference bit for bit.
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/fixed_chunks.h"
#include "core/error.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backend/cpu/embedding.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace tessera::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Column block for backward: 64 floats (256 bytes) per row keeps blocks on separate cache
// lines when C % 16 == 0 and still yields C / 64 independent tasks (12 for C = 768).
constexpr int64_t kColBlock = 64;

// dst (len) = a + b, or dst += a when b is null; whole vectors then a scalar tail (IEEE adds,
// so the result is the same as a scalar loop).
HWY_INLINE void AddRow(float* dst, const float* a, const float* b, int64_t len) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  int64_t c = 0;
  if (b) {
    for (; c + L <= len; c += L)
      hn::StoreU(hn::Add(hn::LoadU(d, a + c), hn::LoadU(d, b + c)), d, dst + c);
    for (; c < len; ++c) dst[c] = a[c] + b[c];
  } else {
    for (; c + L <= len; c += L)
      hn::StoreU(hn::Add(hn::LoadU(d, dst + c), hn::LoadU(d, a + c)), d, dst + c);
    for (; c < len; ++c) dst[c] += a[c];
  }
}

void EmbeddingForward(ThreadPool& pool, float* out, const int32_t* tokens, const float* wte,
                      const float* wpe, int64_t B, int64_t T, int64_t C, int64_t V) {
  const int64_t rows = std::max<int64_t>(1, 16384 / std::max<int64_t>(C, 1));
  for_each_chunk(pool, B * T, rows, [&](int64_t, int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const int32_t tok = tokens[n];
      TS_CHECK(tok >= 0 && tok < V, "[embedding_forward] tokens[", n, "] = ", tok,
               " is outside the vocabulary [0, ", V, ")");
      const float* e = wte + static_cast<int64_t>(tok) * C;
      if (wpe != nullptr)
        AddRow(out + n * C, e, wpe + (n % T) * C, C);
      else
        std::memcpy(out + n * C, e, static_cast<size_t>(C) * sizeof(float));
    }
  });
}

void EmbeddingBackward(ThreadPool& pool, float* dwte, float* dwpe, const float* dout,
                       const int32_t* tokens, int64_t B, int64_t T, int64_t C, int64_t V) {
  // Validate first: a bad token found mid-way would leave dwte partly updated.
  for (int64_t n = 0; n < B * T; ++n)
    TS_CHECK(tokens[n] >= 0 && tokens[n] < V, "[embedding_backward] tokens[", n, "] = ", tokens[n],
             " is outside the vocabulary [0, ", V, ")");
  for_each_chunk(pool, C, kColBlock, [&](int64_t, int64_t c0, int64_t c1) {
    for (int64_t n = 0; n < B * T; ++n) {
      const float* dy = dout + n * C + c0;
      AddRow(dwte + static_cast<int64_t>(tokens[n]) * C + c0, dy, nullptr, c1 - c0);
      if (dwpe != nullptr) AddRow(dwpe + (n % T) * C + c0, dy, nullptr, c1 - c0);
    }
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace tessera::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tessera::cpu {

HWY_EXPORT(EmbeddingForward);
HWY_EXPORT(EmbeddingBackward);

void embedding_forward(ThreadPool& pool, float* out, const int32_t* tokens, const float* wte,
                       const float* wpe, int64_t B, int64_t T, int64_t C, int64_t V) {
  TS_CHECK(B >= 0 && T >= 0 && C > 0, "[embedding_forward] bad shape B=", B, " T=", T, " C=", C);
  HWY_DYNAMIC_DISPATCH(EmbeddingForward)(pool, out, tokens, wte, wpe, B, T, C, V);
}

void embedding_backward(ThreadPool& pool, float* dwte, float* dwpe, const float* dout,
                        const int32_t* tokens, int64_t B, int64_t T, int64_t C, int64_t V) {
  TS_CHECK(B >= 0 && T >= 0 && C > 0, "[embedding_backward] bad shape B=", B, " T=", T, " C=", C);
  HWY_DYNAMIC_DISPATCH(EmbeddingBackward)(pool, dwte, dwpe, dout, tokens, B, T, C, V);
}

}  // namespace tessera::cpu
#endif  // HWY_ONCE
