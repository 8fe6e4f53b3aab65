// AVX2 matmul against stored-format weights: activation quantization to int8 blocks, the
// per-format tile loops (quant_avx2_*.cc) and the split of weight rows over threads.
#include "backend/cpu/quant_matmul_avx2.h"

#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/fixed_chunks.h"
#include "backend/cpu/quant_avx2_common.h"
#include "backend/cpu/quant_avx512.h"
#include "core/interleave.h"

namespace tessera::cpu {

namespace avx2 {
namespace {

// Quantizes the 32 values at xb with inverse scale id (as quantize_act_rows: round to nearest
// even, clamp to [-127, 127]) into q, and returns the sums of elements 0-15 and 16-31.
TS_AVX2 inline void quantize32(const float* xb, float id, int8_t* q, int32_t* sum_lo,
                               int32_t* sum_hi) {
  const __m256 vid = _mm256_set1_ps(id);
  const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
  __m256i i[4];
  for (int k = 0; k < 4; ++k) {
    const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(xb + 8 * k), vid);
    const __m256 r = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    i[k] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(r, lo), hi));
  }
  // packs work within 128-bit halves: the permute restores element order.
  const __m256i p =
      _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  const __m256i h = _mm256_hadd_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
  const __m256i h2 = _mm256_hadd_epi32(h, h);
  const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(h2), _mm256_extracti128_si256(h2, 1));
  *sum_lo = _mm_cvtsi128_si32(s);
  *sum_hi = _mm_extract_epi32(s, 1);
}

// max |x| over n (a multiple of 8) values and whether all are finite.
TS_AVX2 inline float abs_max(const float* xb, int64_t n, bool* finite) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 amax = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
  for (int64_t k = 0; k < n; k += 8) {
    const __m256 v = _mm256_loadu_ps(xb + k);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v));
    // v - v is NaN exactly for infinities and NaN.
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(_mm256_sub_ps(v, v), _mm256_setzero_ps(), _CMP_NEQ_UQ));
  }
  *finite = _mm256_movemask_ps(bad) == 0;
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

TS_AVX2 void quantize_rows(const float* x, const ActsQ8& qa, int64_t m0, int64_t m1) {
  const int64_t K = qa.K, bs = qa.block, nb = K / bs;
  for (int64_t m = m0; m < m1; ++m) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + m * K + b * bs;
      bool finite;
      const float amax = abs_max(xb, bs, &finite);
      // As quantize_act_rows: a non-finite block gets a NaN scale and zero quants.
      const float d = finite ? amax / 127.0f : __builtin_nanf("");
      const float id = finite && d > 0 ? 1.0f / d : 0.0f;
      qa.d[m * nb + b] = d;
      for (int64_t g = b * bs / 32; g < (b + 1) * bs / 32; ++g) {
        int32_t s_lo, s_hi;
        quantize32(x + m * K + g * 32, id, qa.q + m * K + g * 32, &s_lo, &s_hi);
        if (!finite) s_lo = s_hi = 0;
        qa.sum16[m * (K / 16) + 2 * g] = static_cast<int16_t>(s_lo);
        qa.sum16[m * (K / 16) + 2 * g + 1] = static_cast<int16_t>(s_hi);
        qa.sum32[m * (K / 32) + g] = static_cast<int16_t>(s_lo + s_hi);
        qa.dsum[m * (K / 32) + g] = d * static_cast<float>(s_lo + s_hi);
      }
      if (!finite) std::fill(qa.q + m * K + b * bs, qa.q + m * K + (b + 1) * bs, int8_t{0});
    }
  }
}

using RowsFn = void (*)(float*, int64_t, int64_t, const float*, int64_t, int64_t, const TileArgs&);

// q4_kx8 / q5_kx8 / q6_kx8 where the AVX512-VNNI kernels are switched off (tests; the loader makes
// them only where those run): each group of 8 rows is read back into plain rows and run on the
// plain type's tiles.
template <DType kX8, RowsFn kPlainRows>
void rows_as_plain(float* y, int64_t ldy, int64_t M, const float* bias, int64_t n0, int64_t n1,
                   const TileArgs& args) {
  thread_local std::vector<uint8_t> plain;
  plain.resize(static_cast<size_t>(kInterleaveRows * args.row_bytes));
  for (int64_t n = n0; n < n1; n += kInterleaveRows) {
    for (int64_t r = 0; r < kInterleaveRows; ++r)
      deinterleave_row(kX8, args.w, args.K, n + r, plain.data() + r * args.row_bytes);
    TileArgs group = args;
    group.w = plain.data();
    kPlainRows(y + n, ldy, M, bias ? bias + n : nullptr, 0, kInterleaveRows, group);
  }
}

RowsFn rows_fn(DType t) {
  // The 8-row interleaved layouts (null for every other type).
  if (RowsFn x8 = quant_avx512_vnni_active() ? avx512::x8_rows_fn(t) : x8_rows_fn(t)) return x8;
  if (quant_avx512_vnni_active()) {
    if (RowsFn k = avx512::kquant_x8_rows_fn(t)) return k;
    if (RowsFn k = avx512::kquant_rows_fn(t)) return k;
  }
  switch (t) {
    case DType::q8_0:
      return rows_q8_0;
    case DType::q4_0:
      return rows_q4_0;
    case DType::q4_1:
      return rows_q4_1;
    case DType::q5_0:
      return rows_q5_0;
    case DType::q5_1:
      return rows_q5_1;
    case DType::q4_k:
      return rows_q4_k;
    case DType::q4_kx8:
      return rows_as_plain<DType::q4_kx8, rows_q4_k>;
    case DType::q5_kx8:
      return rows_as_plain<DType::q5_kx8, rows_q5_k>;
    case DType::q6_kx8:
      return rows_as_plain<DType::q6_kx8, rows_q6_k>;
    case DType::q5_k:
      return rows_q5_k;
    case DType::q6_k:
      return rows_q6_k;
    case DType::f32:
      return rows_f32;
    case DType::f16:
      return rows_f16;
    case DType::f16x16:
      return rows_f16x16;
    case DType::bf16:
      return rows_bf16;
    default:
      return nullptr;  // Q2_K, Q3_K: no AVX2 tiles (matmul_wt_avx2 hands them to Highway)
  }
}

}  // namespace
}  // namespace avx2

namespace {
bool avx512_vnni_allowed = true;
}  // namespace

bool quant_avx512_vnni_active() {
  const CpuFeatures& f = cpu_features();
  return avx512_vnni_allowed && f.avx512f && f.avx512bw && f.avx512vl && f.avx512_vnni &&
         quant_avx2_supported();
}

void set_quant_avx512_vnni_allowed(bool allowed) {
  avx512_vnni_allowed = allowed;
}

bool quant_avx2_supported() {
  const CpuFeatures& f = cpu_features();
  return f.avx2 && f.fma && f.f16c;
}

void quantize_acts_q8_avx2(const float* x, const ActsQ8& qa, int64_t m0, int64_t m1) {
  avx2::quantize_rows(x, qa, m0, m1);
}

namespace {
// Rows of row_bytes making about target_bytes of weights: a multiple of 8 rows and of `group`
// (an interleaved layout's group is never split), at least one such unit.
int64_t whole_group_rows(int64_t target_bytes, int64_t row_bytes, int64_t group) {
  const int64_t unit = std::max<int64_t>(8, group);
  return std::max<int64_t>(unit, target_bytes / row_bytes / unit * unit);
}
}  // namespace

int64_t quant_rows_per_task(int64_t M, int64_t row_bytes, int64_t N, int64_t group) {
  // A decode product this small takes a few microseconds on one core, less than waking and
  // joining another thread (far less than a descheduled one on a loaded machine).
  if (M <= 4 && N * row_bytes <= (int64_t{128} << 10)) return std::max<int64_t>(N, 1);
  const int64_t target = M <= 4 ? (int64_t{32} << 10) : (int64_t{64} << 10);
  return whole_group_rows(target, row_bytes, group);
}

void matmul_wt_avx2(ThreadPool& pool, float* y, int64_t ldy, const float* x, int64_t M, int64_t K,
                    const void* w, DType w_type, int64_t N, const float* bias) {
  if (M == 0 || N == 0) return;
  if (!avx2::rows_fn(w_type)) return matmul_wt_highway(pool, y, ldy, x, M, K, w, w_type, N, bias);
  if (w_type == DType::bf16) x = bf16_rounded_acts(x, M, K);
  ActsQ8 acts;
  const int64_t block = act_block_elems(w_type);
  if (block > 0) {
    acts = acts_q8_buffer(M, K, block);
    // A few rows are quantized faster than a hand-off to another thread.
    if (M <= 4) {
      quantize_acts_q8_avx2(x, acts, 0, M);
    } else {
      for_each_chunk(pool, M, 4, [&](int64_t, int64_t m0, int64_t m1) {
        quantize_acts_q8_avx2(x, acts, m0, m1);
      });
    }
  }
  const int64_t row_bytes = dtype_bytes(w_type, K);
  const avx2::TileArgs args{static_cast<const uint8_t*>(w), row_bytes, &acts, x, K, 0};
  const avx2::RowsFn rows = avx2::rows_fn(w_type);
  const int64_t rows_per_task =
      quant_rows_per_task(M, row_bytes, N, traits(w_type).interleave_rows);
  auto task = [&](int64_t, int64_t n0, int64_t n1) { rows(y, ldy, M, bias, n0, n1, args); };
  // Decode streams the matrix from memory: one lane per thread (see for_each_chunk_in_lanes).
  if (M <= 4)
    for_each_chunk_in_lanes(pool, N, rows_per_task, task);
  else
    for_each_chunk(pool, N, rows_per_task, task);
}

void matmul_wt_group_avx2(ThreadPool& pool, const float* x, int64_t M, int64_t K,
                          const ops::WtProduct* products, int64_t n_products) {
  if (M == 0 || n_products == 0) return;
  // One quantization of x serves the whole group only when every product takes the same
  // activation blocks (the buffer is per thread, so two layouts cannot live side by side).
  const int64_t block = act_block_elems(products[0].w_type);
  int64_t total_bytes = 0;
  bool shared = true;
  for (int64_t p = 0; p < n_products; ++p) {
    // A type without AVX2 tiles goes through matmul_wt_avx2's hand-off to Highway.
    shared = shared && act_block_elems(products[p].w_type) == block &&
             avx2::rows_fn(products[p].w_type) != nullptr;
    total_bytes += products[p].N * dtype_bytes(products[p].w_type, K);
  }
  if (!shared || M > 4) {
    for (int64_t p = 0; p < n_products; ++p) {
      const ops::WtProduct& w = products[p];
      matmul_wt_avx2(pool, w.y, w.ldy, x, M, K, w.w, w.w_type, w.N, w.bias);
    }
    return;
  }
  ActsQ8 acts;
  if (block > 0) {
    acts = acts_q8_buffer(M, K, block);
    quantize_acts_q8_avx2(x, acts, 0, M);
  }
  // bf16 products read x rounded to bf16 (once for all of them), the other float types x itself.
  bool any_bf16 = false;
  for (int64_t p = 0; p < n_products; ++p) any_bf16 = any_bf16 || products[p].w_type == DType::bf16;
  const float* x_bf16 = any_bf16 ? bf16_rounded_acts(x, M, K) : nullptr;
  auto run = [&](const ops::WtProduct& w, int64_t n0, int64_t n1) {
    const float* xw = w.w_type == DType::bf16 ? x_bf16 : x;
    const avx2::TileArgs args{
        static_cast<const uint8_t*>(w.w), dtype_bytes(w.w_type, K), &acts, xw, K, 0};
    avx2::rows_fn(w.w_type)(w.y, w.ldy, M, w.bias, n0, n1, args);
  };
  // A group small enough for one core runs here (a hand-off would cost more than it saves);
  // otherwise each product is cut as matmul_wt_avx2 cuts a large one, and the threads share out
  // the rows of all products in one hand-off.
  if (total_bytes <= (int64_t{128} << 10)) {
    for (int64_t p = 0; p < n_products; ++p) run(products[p], 0, products[p].N);
    return;
  }
  struct Task {
    int64_t p, n0, n1;
  };
  thread_local std::vector<Task> tasks;
  tasks.clear();
  for (int64_t p = 0; p < n_products; ++p) {
    const int64_t N = products[p].N;
    const DType t = products[p].w_type;
    const int64_t rows =
        whole_group_rows(int64_t{32} << 10, dtype_bytes(t, K), traits(t).interleave_rows);
    for (int64_t n0 = 0; n0 < N; n0 += rows) tasks.push_back({p, n0, std::min(N, n0 + rows)});
  }
  const std::vector<Task>& all = tasks;  // the pool's threads read the caller's list
  for_each_chunk_in_lanes(pool, static_cast<int64_t>(all.size()), 1,
                          [&](int64_t, int64_t t0, int64_t t1) {
                            for (int64_t t = t0; t < t1; ++t) {
                              const Task& task = all[static_cast<size_t>(t)];
                              run(products[task.p], task.n0, task.n1);
                            }
                          });
}

}  // namespace tessera::cpu
