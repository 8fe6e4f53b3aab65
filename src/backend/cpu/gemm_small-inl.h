// Small-M GEMM (decode-time matrix-vector products): streams op(B) once without packing it.
// Compiled once per SIMD target (included from gemm.cc after gemm_pack-inl.h).
#if defined(TESSERA_BACKEND_CPU_GEMM_SMALL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TESSERA_BACKEND_CPU_GEMM_SMALL_INL_H_
#undef TESSERA_BACKEND_CPU_GEMM_SMALL_INL_H_
#else
#define TESSERA_BACKEND_CPU_GEMM_SMALL_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/cpu/gemm.h"
#include "core/thread_pool.h"
#include "hwy/highway.h"
#include "ops/ops.h"

HWY_BEFORE_NAMESPACE();
namespace tessera::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// At most this many rows of A take the small path: with m <= 4 the packed path would spend more
// time packing B (every element, every call) than multiplying, while this path reads B once.
constexpr int64_t kSmallM = 4;

// Returns n elements of operand x starting at element i as contiguous f32: the source itself
// for plain f32, else a conversion into scratch (n floats).
inline const float* f32_run(const Operand& x, int64_t i, int64_t n, float* scratch) {
  switch (x.src) {
    case Src::f32:
      return static_cast<const float*>(x.p) + i;
    case Src::f32_round_bf16:
      load_row<Src::f32_round_bf16>(x.p, i, n, scratch);
      return scratch;
    case Src::bf16:
      load_row<Src::bf16>(x.p, i, n, scratch);
      return scratch;
  }
  return nullptr;
}

// op(B) = B^T: B stored (N,K), so c[i][j] = dot(a_i, b_j) with both rows contiguous along K.
// Each dot product uses two vector accumulators over K (even/odd vectors, to cover FMA latency),
// then a scalar tail, in a fixed order: results depend on the SIMD width but never on threads.
void small_m_bt(int64_t m, const float* a_rows, const Operand& b, int64_t j0, int64_t j1, int64_t k,
                float* c, int64_t ldc, const float* bias, bool accumulate, float* scratch) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t k2 = k / (2 * L) * (2 * L);
  for (int64_t j = j0; j < j1; ++j) {
    const float* bj = f32_run(b, j * b.ld, k, scratch);
    for (int64_t i = 0; i < m; ++i) {
      const float* ai = a_rows + i * k;
      VF s0 = hn::Zero(d), s1 = hn::Zero(d);
      for (int64_t p = 0; p < k2; p += 2 * L) {
        s0 = hn::MulAdd(hn::LoadU(d, ai + p), hn::LoadU(d, bj + p), s0);
        s1 = hn::MulAdd(hn::LoadU(d, ai + p + L), hn::LoadU(d, bj + p + L), s1);
      }
      float sum = hn::GetLane(hn::SumOfLanes(d, hn::Add(s0, s1)));
      for (int64_t p = k2; p < k; ++p) sum += ai[p] * bj[p];
      float& out = c[i * ldc + j];
      out = sum + (accumulate ? out : 0.0f) + (bias ? bias[j] : 0.0f);
    }
  }
}

// op(B) = B: B stored (K,N), so rows of C are sums of B rows: C[i][j..] += a[i][p] * B[p][j..].
// B is streamed row by row over a chunk of columns (contiguous, prefetch-friendly; a narrow
// column strip would touch a new page per row), with the m x chunk partial sums (kAccFloats,
// 16 KiB) kept in L1.
// Each output is one FMA chain over p per depth block of kc (scalar tails use std::fma), added
// to C after each block: the same arithmetic as the packed path, so results agree bit for bit.
constexpr int64_t kAccFloats = 4096;
inline int64_t bn_chunk(int64_t m) {
  return kAccFloats / m / 64 * 64;
}

void small_m_bn(int64_t m, const float* a_rows, const Operand& b, int64_t j0, int64_t j1, int64_t k,
                int64_t kc, float* c, int64_t ldc, const float* bias, bool accumulate,
                float* scratch) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  HWY_ALIGN float acc[kAccFloats];
  const int64_t chunk = bn_chunk(m);
  for (int64_t j = j0; j < j1; j += chunk) {
    const int64_t w = std::min(chunk, j1 - j);
    const int64_t wv = w / L * L;
    for (int64_t pc = 0; pc < k; pc += kc) {
      const int64_t pe = std::min(k, pc + kc);
      std::fill(acc, acc + m * chunk, 0.0f);
      for (int64_t p = pc; p < pe; ++p) {
        const float* bp = f32_run(b, p * b.ld + j, w, scratch);
        for (int64_t r = 0; r < m; ++r) {
          const float ar = a_rows[r * k + p];
          const VF av = hn::Set(d, ar);
          float* ac = acc + r * chunk;
          for (int64_t t = 0; t < wv; t += L)
            hn::Store(hn::MulAdd(av, hn::LoadU(d, bp + t), hn::Load(d, ac + t)), d, ac + t);
          for (int64_t t = wv; t < w; ++t) ac[t] = std::fma(ar, bp[t], ac[t]);
        }
      }
      const bool load_c = pc > 0 || accumulate;
      for (int64_t r = 0; r < m; ++r) {
        float* cr = c + r * ldc + j;
        const float* ac = acc + r * chunk;
        for (int64_t t = 0; t < w; ++t) {
          float x = ac[t];
          if (load_c) x += cr[t];
          if (pc == 0 && bias) x += bias[j + t];
          cr[t] = x;
        }
      }
    }
  }
}

// c (m,N) for m <= kSmallM: converts op(A) to m contiguous f32 rows once, then threads take
// disjoint column ranges of C.
void gemm_small_m(ThreadPool& pool, const Operand& a, const Operand& b, int64_t m, int64_t n,
                  int64_t k, int64_t kc, float* c, int64_t ldc, const float* bias,
                  bool accumulate) {
  float* a_rows = gemm_detail::pack_buffer(0, static_cast<size_t>(m * k));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p) {
      const int64_t idx = a.trans ? p * a.ld + i : i * a.ld + p;
      switch (a.src) {
        case Src::f32:
          a_rows[i * k + p] = load_elem<Src::f32>(a.p, idx);
          break;
        case Src::f32_round_bf16:
          a_rows[i * k + p] = load_elem<Src::f32_round_bf16>(a.p, idx);
          break;
        case Src::bf16:
          a_rows[i * k + p] = load_elem<Src::bf16>(a.p, idx);
          break;
      }
    }
  // Work items: ~256 KiB of B rows (B^T), or a column chunk (B) no wider than an even share
  // per thread, to amortize the hand-off while keeping every thread busy.
  const int64_t share = (n + pool.size() - 1) / pool.size();
  const int64_t grain = b.trans ? std::max<int64_t>(8, 65536 / std::max<int64_t>(k, 1))
                                : std::min(bn_chunk(m), (share + 63) / 64 * 64);
  const bool threaded = 2.0 * m * n * k >= 1e6;
  auto body = [&](int64_t j0, int64_t j1) {
    // Scratch holds one converted row of B: k floats (B^T) or one chunk (B).
    float* scratch = gemm_detail::pack_buffer(1, static_cast<size_t>(std::max(k, kAccFloats)));
    if (b.trans) {
      small_m_bt(m, a_rows, b, j0, j1, k, c, ldc, bias, accumulate, scratch);
    } else {
      small_m_bn(m, a_rows, b, j0, j1, k, kc, c, ldc, bias, accumulate, scratch);
    }
  };
  if (!threaded) {
    body(0, n);
    return;
  }
  // Each column of C is computed whole by one thread, so the split never changes results.
  const int64_t chunks = (n + grain - 1) / grain;
  pool.parallel_for(chunks, 1,
                    [&](int64_t c0, int64_t c1) { body(c0 * grain, std::min(n, c1 * grain)); });
}

}  // namespace tessera::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard toggle
