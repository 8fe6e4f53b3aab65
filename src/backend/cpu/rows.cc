// Row movement on the CPU: strided copies, gathers, paged KV cache appends.
#include "backend/cpu/rows.h"

#include <algorithm>
#include <cstring>

#include "core/dtype.h"

namespace tessera::cpu {

void copy_rows(float* dst, int64_t ld_dst, const float* src, int64_t ld_src, int64_t rows,
               int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + r * ld_dst, src + r * ld_src, static_cast<size_t>(cols) * sizeof(float));
}

void gather_rows(float* dst, const float* src, const int32_t* index, int64_t n, int64_t C) {
  for (int64_t r = 0; r < n; ++r)
    std::memcpy(dst + r * C, src + index[r] * C, static_cast<size_t>(C) * sizeof(float));
}

void scatter_add_rows(float* dst, const float* src, const int32_t* index, const float* weight,
                      int64_t n, int64_t C) {
  for (int64_t r = 0; r < n; ++r) {
    float* d = dst + static_cast<int64_t>(index[r]) * C;
    const float* x = src + r * C;
    const float w = weight[r];
    for (int64_t i = 0; i < C; ++i) d[i] += w * x[i];
  }
}

void scatter_add_rows_backward(float* dsrc, float* dweight, const float* dy, const float* src,
                               const int32_t* index, const float* weight, int64_t n, int64_t C) {
  for (int64_t r = 0; r < n; ++r) {
    const float* g = dy + static_cast<int64_t>(index[r]) * C;
    const float* x = src + r * C;
    double dot = 0.0;
    for (int64_t i = 0; i < C; ++i) dot += static_cast<double>(g[i]) * x[i];
    dweight[r] = static_cast<float>(dot);
    const float w = weight[r];
    float* d = dsrc + r * C;  // may be x: read above
    for (int64_t i = 0; i < C; ++i) d[i] = w * g[i];
  }
}

void kv_append(const ops::KvAppendArgs& a) {
  const int64_t D = a.D, BT = a.block_tokens, eb = dtype_bytes(a.kv_type, 1);
  auto* base = static_cast<uint8_t*>(a.kv);
  for (int64_t r = 0; r < a.rows; ++r) {
    const int64_t block = a.slot[r] / BT, t = a.slot[r] % BT;
    uint8_t* blk = base + block * a.block_stride * eb;
    for (int64_t g = 0; g < a.Hkv; ++g) {
      const float* key = a.k + r * a.ldk + g * D;
      uint8_t* kd = blk + g * BT * D * eb;
      if (a.k_transposed) {
        // Keys as (D, block_tokens) per head: one element every block_tokens.
        if (a.kv_type == DType::f16) {
          auto* h = reinterpret_cast<uint16_t*>(kd) + t;
          for (int64_t d = 0; d < D; ++d) h[d * BT] = f32_to_f16(key[d]);
        } else {
          auto* f = reinterpret_cast<float*>(kd) + t;
          for (int64_t d = 0; d < D; ++d) f[d * BT] = key[d];
        }
      } else {
        from_f32(a.kv_type, key, kd + t * D * eb, D);
      }
      from_f32(a.kv_type, a.v + r * a.ldv + g * D, blk + (a.v_offset + g * BT * D + t * D) * eb, D);
    }
  }
}

// Threads split the columns, so each column is summed in row order by one thread: the result
// does not depend on the thread count.
void bias_grad(ThreadPool& pool, float* db, const float* dy, int64_t m, int64_t n) {
  constexpr int64_t kCols = 64;  // a 256-byte column strip per task keeps rows streaming
  pool.parallel_for((n + kCols - 1) / kCols, 1, [&](int64_t b, int64_t e) {
    for (int64_t blk = b; blk < e; ++blk) {
      const int64_t c0 = blk * kCols, c1 = std::min(n, c0 + kCols);
      float acc[kCols] = {};
      for (int64_t r = 0; r < m; ++r) {
        const float* row = dy + r * n;
        for (int64_t c = c0; c < c1; ++c) acc[c - c0] += row[c];
      }
      for (int64_t c = c0; c < c1; ++c) db[c] += acc[c - c0];
    }
  });
}

}  // namespace tessera::cpu
