// Paged attention: the online-softmax SIMD kernel against the double-precision reference, with
// scattered blocks, grouped heads, partial last blocks and several thread counts; and against a
// plain causal attention over contiguous keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "backend/cpu/paged_attention.h"
#include "kernel_test_util.h"

namespace tessera::cpu {
namespace {

namespace test_tables {
// Per-row block tables as one (rows, stride) array, as ops::PagedAttentionArgs takes them
// (entries past a row's own table are 0).
struct Dense {
  std::vector<int32_t> ids;
  int64_t stride = 0;
};
Dense dense(const std::vector<std::vector<int32_t>>& rows) {
  Dense d;
  for (const auto& t : rows) d.stride = std::max<int64_t>(d.stride, static_cast<int64_t>(t.size()));
  d.ids.assign(rows.size() * static_cast<size_t>(d.stride), 0);
  for (size_t r = 0; r < rows.size(); ++r)
    std::copy(rows[r].begin(), rows[r].end(), d.ids.begin() + static_cast<int64_t>(r) * d.stride);
  return d;
}
}  // namespace test_tables

using test::fill_normal;

// The argument block of a query batch over an f32 cache (kv_type and k_transposed left default).
ops::PagedAttentionArgs cache_args(const float* q, int64_t rows, int64_t H, int64_t Hkv, int64_t D,
                                   const float* kv, int64_t BT, int64_t stride, int64_t half,
                                   const test_tables::Dense& tables, const int32_t* n_keys) {
  ops::PagedAttentionArgs a;
  a.q = q;
  a.rows = rows;
  a.H = H;
  a.Hkv = Hkv;
  a.D = D;
  a.kv = kv;
  a.block_tokens = BT;
  a.block_stride = stride;
  a.v_offset = half;
  a.block_tables = tables.ids.data();
  a.table_stride = tables.stride;
  a.n_keys = n_keys;
  a.scale = 1.0f / std::sqrt(static_cast<float>(D));
  return a;
}

struct Case {
  int64_t rows, H, Hkv, D, BT;
  std::vector<int64_t> n_keys;  // per row
};

struct PagedSetup {
  std::vector<float> kv, q;
  std::vector<std::vector<int32_t>> tables;
  test_tables::Dense dense;  // row r: its sequence's table
  std::vector<int32_t> n_keys;
  ops::PagedAttentionArgs args;
};

// Every row gets its own sequence whose blocks are scattered through the arena in a shuffled
// order, so a kernel that assumed contiguous blocks would read the wrong keys.
PagedSetup make(const Case& c, uint64_t seed) {
  PagedSetup s;
  const int64_t half = c.Hkv * c.BT * c.D, stride = 2 * half + 7;  // padding between blocks
  int64_t total_blocks = 0;
  for (int64_t nk : c.n_keys) total_blocks += (nk + c.BT - 1) / c.BT;
  std::vector<int32_t> ids(static_cast<size_t>(total_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  Rng rng(seed);
  for (size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[rng.below(i)]);
  size_t next = 0;
  for (int64_t nk : c.n_keys) {
    std::vector<int32_t> t;
    for (int64_t b = 0; b < (nk + c.BT - 1) / c.BT; ++b) t.push_back(ids[next++]);
    s.tables.push_back(t);
    s.n_keys.push_back(static_cast<int32_t>(nk));
  }
  s.dense = test_tables::dense(s.tables);
  s.kv.resize(static_cast<size_t>(total_blocks * stride));
  fill_normal(s.kv.data(), static_cast<int64_t>(s.kv.size()), seed + 1);
  s.q.resize(static_cast<size_t>(c.rows * c.H * c.D));
  fill_normal(s.q.data(), static_cast<int64_t>(s.q.size()), seed + 2, 2.0f);
  s.args = cache_args(s.q.data(), c.rows, c.H, c.Hkv, c.D, s.kv.data(), c.BT, stride, half, s.dense,
                      s.n_keys.data());
  return s;
}

TEST(PagedAttention, MatchesReference) {
  const Case cases[] = {
      {1, 9, 3, 64, 32, {1}},
      {3, 9, 3, 64, 32, {33, 64, 100}},
      {2, 4, 4, 17, 5, {7, 23}},             // odd head dim, no grouping, tiny blocks
      {4, 8, 1, 128, 16, {1, 16, 17, 300}},  // multi-query
  };
  for (const Case& c : cases)
    for (bool transposed : {false, true}) {
      PagedSetup s = make(c, 42);
      s.args.k_transposed = transposed;
      std::vector<float> want(s.q.size()), got(s.q.size());
      s.args.out = want.data();
      ref::paged_attention(s.args);
      std::vector<float> first;
      for (int threads : {1, 2, 3}) {
        std::fill(got.begin(), got.end(), NAN);
        s.args.out = got.data();
        paged_attention(test::pool(threads), s.args);
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_NEAR(got[i], want[i], 2e-5 * (1 + std::fabs(want[i])))
              << "case D=" << c.D << " element " << i << " threads " << threads;
        if (first.empty()) first = got;
        EXPECT_EQ(got, first) << "result depends on the thread count";
      }
    }
}

// A row computed alone (one row: the kernel splits each KV head's query group over tasks, so
// heads share passes differently) equals the same row inside a batch, bit for bit: batched
// decode must give each sequence the tokens it would get alone. Groups of 3, 8 and 1 heads; head
// dims with vector and scalar tails; f32 and f16 caches, keys transposed or not.
TEST(PagedAttention, RowAloneEqualsRowInBatch) {
  const Case cases[] = {
      {3, 9, 3, 64, 32, {33, 64, 100}},
      {4, 8, 1, 17, 16, {1, 16, 17, 300}},
      {2, 4, 4, 20, 5, {7, 23}},
  };
  for (const Case& c : cases)
    for (bool transposed : {false, true})
      for (bool half : {false, true}) {
        PagedSetup s = make(c, 77);
        std::vector<uint16_t> h16(s.kv.size());
        if (half) {
          from_f32(DType::f16, s.kv.data(), h16.data(), static_cast<int64_t>(h16.size()));
          s.args.kv = h16.data();
          s.args.kv_type = DType::f16;
        }
        s.args.k_transposed = transposed;
        std::vector<float> batch(s.q.size());
        s.args.out = batch.data();
        paged_attention(test::pool(2), s.args);
        for (int64_t r = 0; r < c.rows; ++r) {
          ops::PagedAttentionArgs one = s.args;
          std::vector<float> alone(static_cast<size_t>(c.H * c.D));
          one.rows = 1;
          one.q = s.q.data() + r * c.H * c.D;
          one.out = alone.data();
          one.block_tables = s.dense.ids.data() + r * s.dense.stride;
          one.n_keys = s.n_keys.data() + r;
          paged_attention(test::pool(2), one);
          const std::vector<float> in_batch(batch.begin() + r * c.H * c.D,
                                            batch.begin() + (r + 1) * c.H * c.D);
          EXPECT_EQ(alone, in_batch)
              << "D=" << c.D << " row " << r << " transposed " << transposed << " f16 " << half;
        }
      }
}

// A sliding window: row r reads keys first_key[r] .. n_keys[r]-1; the window may start inside a
// block or on a block boundary.
TEST(PagedAttention, FirstKeyLimitsTheWindow) {
  const Case c{4, 6, 2, 32, 8, {9, 40, 17, 64}};
  for (bool transposed : {false, true}) {
    PagedSetup s = make(c, 13);
    s.args.k_transposed = transposed;
    const std::vector<int32_t> first = {3, 16, 0, 57};
    s.args.first_key = first.data();
    std::vector<float> want(s.q.size()), got(s.q.size()), full(s.q.size());
    s.args.out = want.data();
    ref::paged_attention(s.args);
    s.args.out = got.data();
    paged_attention(test::pool(2), s.args);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 2e-5 * (1 + std::fabs(want[i]))) << i;
    // The reference with a window equals the reference over a sequence that starts there: row 1
    // (keys 16..39) is blocks 2..4 of its table, i.e. a table without its first two blocks.
    PagedSetup t = make(c, 13);
    t.args.k_transposed = transposed;
    std::vector<int32_t> tail(t.tables[1].begin() + 2, t.tables[1].end());
    const int32_t nk[1] = {24};
    t.args.rows = 1;
    t.args.q = t.q.data() + c.H * c.D;
    t.args.block_tables = tail.data();
    t.args.table_stride = static_cast<int64_t>(tail.size());
    t.args.n_keys = nk;
    t.args.out = full.data();
    ref::paged_attention(t.args);
    for (int64_t i = 0; i < c.H * c.D; ++i) ASSERT_NEAR(want[c.H * c.D + i], full[i], 1e-6) << i;
  }
}

// Keys stored transposed within a block, (Hkv, D, block_tokens), give the same attention as the
// row layout holding the same keys (checked through the reference, which reads either layout).
TEST(PagedAttention, TransposedKeysEqualRowKeys) {
  const Case c{3, 8, 2, 16, 8, {5, 8, 21}};
  PagedSetup s = make(c, 9);
  std::vector<float> rows_out(s.q.size()), t_out(s.q.size());
  s.args.out = rows_out.data();
  ref::paged_attention(s.args);
  std::vector<float> t = s.kv;
  const int64_t nblocks = static_cast<int64_t>(s.kv.size()) / s.args.block_stride;
  for (int64_t b = 0; b < nblocks; ++b)
    for (int64_t g = 0; g < c.Hkv; ++g)
      for (int64_t j = 0; j < c.BT; ++j)
        for (int64_t d = 0; d < c.D; ++d) {
          const int64_t head = b * s.args.block_stride + g * c.BT * c.D;
          t[head + d * c.BT + j] = s.kv[head + j * c.D + d];
        }
  s.args.kv = t.data();
  s.args.k_transposed = true;
  s.args.out = t_out.data();
  ref::paged_attention(s.args);
  for (size_t i = 0; i < t_out.size(); ++i) ASSERT_NEAR(t_out[i], rows_out[i], 1e-6) << i;
  std::vector<float> simd(s.q.size());
  s.args.out = simd.data();
  paged_attention(test::pool(2), s.args);
  for (size_t i = 0; i < simd.size(); ++i)
    ASSERT_NEAR(simd[i], rows_out[i], 2e-5 * (1 + std::fabs(rows_out[i]))) << i;
}

// The reference itself against a direct causal softmax over contiguous keys: a row with n keys
// must equal attention of that query over the first n keys of an unpaged sequence.
TEST(PagedAttention, ReferenceEqualsPlainAttention) {
  const Case c{1, 2, 1, 8, 4, {10}};
  PagedSetup s = make(c, 7);
  std::vector<float> out(s.q.size());
  s.args.out = out.data();
  ref::paged_attention(s.args);
  const ops::PagedAttentionArgs& a = s.args;
  for (int64_t h = 0; h < c.H; ++h) {
    std::vector<double> scores;
    for (int64_t j = 0; j < 10; ++j) {
      const float* k = s.kv.data() + s.tables[0][j / 4] * a.block_stride + (j % 4) * c.D;
      double dot = 0;
      for (int64_t d = 0; d < c.D; ++d) dot += a.q[h * c.D + d] * k[d];
      scores.push_back(dot * a.scale);
    }
    const double mx = *std::max_element(scores.begin(), scores.end());
    double sum = 0;
    for (double& x : scores) sum += (x = std::exp(x - mx));
    for (int64_t d = 0; d < c.D; ++d) {
      double o = 0;
      for (int64_t j = 0; j < 10; ++j)
        o += scores[j] / sum *
             (s.kv.data() + s.tables[0][j / 4] * a.block_stride + a.v_offset + (j % 4) * c.D)[d];
      EXPECT_NEAR(out[h * c.D + d], o, 1e-6);
    }
  }
}

// An f16 cache: the SIMD kernel reads the same halves as the reference (so they agree as closely
// as with f32), and the result moves from the f32 cache's by about the halves' rounding (2^-11
// relative on each key and value; scores of size ~|q||k|/sqrt(D) move by that fraction).
TEST(PagedAttention, HalfPrecisionCache) {
  const Case cases[] = {
      {3, 9, 3, 64, 32, {33, 64, 100}},
      {2, 4, 4, 17, 5, {7, 23}},
      {4, 8, 1, 128, 16, {1, 16, 17, 300}},
  };
  for (const Case& c : cases)
    for (bool transposed : {false, true}) {
      PagedSetup s = make(c, 5);
      s.args.k_transposed = transposed;
      std::vector<float> f32_out(s.q.size()), want(s.q.size()), got(s.q.size());
      s.args.out = f32_out.data();
      ref::paged_attention(s.args);
      std::vector<uint16_t> half(s.kv.size());
      from_f32(DType::f16, s.kv.data(), half.data(), static_cast<int64_t>(half.size()));
      s.args.kv = half.data();
      s.args.kv_type = DType::f16;
      s.args.out = want.data();
      ref::paged_attention(s.args);
      for (int threads : {1, 2}) {
        s.args.out = got.data();
        paged_attention(test::pool(threads), s.args);
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_NEAR(got[i], want[i], 2e-5 * (1 + std::fabs(want[i])))
              << "case D=" << c.D << " element " << i << " threads " << threads;
          ASSERT_NEAR(want[i], f32_out[i], 1e-2 * (1 + std::fabs(f32_out[i])))
              << "case D=" << c.D << " element " << i;
        }
      }
      EXPECT_NE(want, f32_out) << "the f16 cache was not used";
    }
}

// Query rows that share sequences (chunked prefill): the kernel tiles consecutive rows of one
// block table and lets them share each block's loads. Every row must still match the reference,
// give the same bits whatever the thread count, and equal that row computed alone.
struct SharedCase {
  int64_t H, Hkv, D, BT;
  std::vector<int64_t> seq;     // per row: its sequence
  std::vector<int64_t> n_keys;  // per row
  int64_t window;               // > 0: row r reads its last `window` keys only
};

struct SharedSetup {
  std::vector<float> kv, q;
  std::vector<uint16_t> kv16;
  std::vector<std::vector<int32_t>> tables;  // per sequence
  test_tables::Dense dense;                  // per row: its sequence's table
  std::vector<int32_t> n_keys, first_key;
  ops::PagedAttentionArgs args;
};

// Each sequence's blocks are scattered through the arena; rows point at their sequence's table.
SharedSetup make_shared(const SharedCase& c, uint64_t seed) {
  SharedSetup s;
  const int64_t nseq = *std::max_element(c.seq.begin(), c.seq.end()) + 1;
  std::vector<int64_t> len(static_cast<size_t>(nseq), 1);
  for (size_t r = 0; r < c.seq.size(); ++r) len[c.seq[r]] = std::max(len[c.seq[r]], c.n_keys[r]);
  int64_t total = 0;
  for (int64_t l : len) total += (l + c.BT - 1) / c.BT;
  std::vector<int32_t> ids(static_cast<size_t>(total));
  std::iota(ids.begin(), ids.end(), 0);
  Rng rng(seed);
  for (size_t i = ids.size(); i > 1; --i) std::swap(ids[i - 1], ids[rng.below(i)]);
  size_t next = 0;
  for (int64_t l : len) {
    s.tables.emplace_back();
    for (int64_t b = 0; b < (l + c.BT - 1) / c.BT; ++b) s.tables.back().push_back(ids[next++]);
  }
  const int64_t rows = static_cast<int64_t>(c.seq.size());
  for (int64_t r = 0; r < rows; ++r) {
    s.n_keys.push_back(static_cast<int32_t>(c.n_keys[r]));
    s.first_key.push_back(
        static_cast<int32_t>(c.window > 0 ? std::max<int64_t>(0, c.n_keys[r] - c.window) : 0));
  }
  const int64_t half = c.Hkv * c.BT * c.D, stride = 2 * half + 8;
  s.kv.resize(static_cast<size_t>(total * stride));
  fill_normal(s.kv.data(), static_cast<int64_t>(s.kv.size()), seed + 1);
  s.kv16.resize(s.kv.size());
  from_f32(DType::f16, s.kv.data(), s.kv16.data(), static_cast<int64_t>(s.kv.size()));
  s.q.resize(static_cast<size_t>(rows * c.H * c.D));
  fill_normal(s.q.data(), static_cast<int64_t>(s.q.size()), seed + 2, 2.0f);
  std::vector<std::vector<int32_t>> per_row;
  for (int64_t r = 0; r < rows; ++r) per_row.push_back(s.tables[c.seq[r]]);
  s.dense = test_tables::dense(per_row);
  s.args = cache_args(s.q.data(), rows, c.H, c.Hkv, c.D, s.kv.data(), c.BT, stride, half, s.dense,
                      s.n_keys.data());
  if (c.window > 0) s.args.first_key = s.first_key.data();
  return s;
}

// Causal prefill rows 0-based at `pos0`: n_keys pos0+1 .. pos0+rows, all of sequence `seq`.
void add_prefill(SharedCase& c, int64_t seq, int64_t pos0, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) {
    c.seq.push_back(seq);
    c.n_keys.push_back(pos0 + r + 1);
  }
}

TEST(PagedAttention, RowsSharingASequence) {
  std::vector<SharedCase> cases;
  // Groups of 3 (SmolLM2), 8 (Llama 1B: one chunk of the AVX-512 kernels), 4 and 1; 13 and 7
  // rows (not multiples of a tile); chunks starting inside a block; block sizes 16 and 32; head
  // dims 32 and 64.
  for (const auto& [H, Hkv, D, BT] : std::vector<std::array<int64_t, 4>>{
           {9, 3, 64, 32}, {32, 4, 64, 32}, {8, 2, 32, 16}, {4, 4, 32, 16}, {3, 1, 64, 16}})
    for (int64_t window : {0, 20}) {
      SharedCase c{H, Hkv, D, BT, {}, {}, window};
      add_prefill(c, 0, 0, 13);  // a first chunk: keys 1 .. 13
      cases.push_back(c);
      SharedCase d{H, Hkv, D, BT, {}, {}, window};
      add_prefill(d, 0, 37, 7);  // a later chunk of the same sequence
      add_prefill(d, 1, 0, 3);   // another sequence's prompt
      d.seq.push_back(0);        // decode rows of both, the first sequence again
      d.n_keys.push_back(70);
      d.seq.push_back(1);
      d.n_keys.push_back(3);
      cases.push_back(d);
      // One sequence, keys out of order within tiles, full and partial blocks.
      cases.push_back({H, Hkv, D, BT, {0, 0, 0, 0, 0, 0, 0}, {40, 3, 17, 64, 33, 32, 1}, window});
    }
  for (const SharedCase& c : cases)
    for (bool transposed : {true, false})
      for (bool half : {false, true}) {
        SharedSetup s = make_shared(c, 31);
        s.args.k_transposed = transposed;  // the reference reads either layout
        if (half) {
          s.args.kv = s.kv16.data();
          s.args.kv_type = DType::f16;
        } else {
          s.args.kv = s.kv.data();
        }
        const std::string what =
            "H=" + std::to_string(c.H) + " Hkv=" + std::to_string(c.Hkv) +
            " rows=" + std::to_string(s.args.rows) + " window=" + std::to_string(c.window) +
            " transposed=" + std::to_string(transposed) + " f16=" + std::to_string(half);
        std::vector<float> want(s.q.size()), got(s.q.size()), first;
        s.args.out = want.data();
        ref::paged_attention(s.args);
        for (int threads : {1, 2, 3}) {
          std::fill(got.begin(), got.end(), NAN);
          s.args.out = got.data();
          paged_attention(test::pool(threads), s.args);
          for (size_t i = 0; i < got.size(); ++i)
            ASSERT_NEAR(got[i], want[i], 2e-5 * (1 + std::fabs(want[i])))
                << what << " element " << i << " threads " << threads;
          if (first.empty()) first = got;
          ASSERT_EQ(got, first) << what << ": result depends on the thread count";
        }
        const int64_t HD = c.H * c.D;
        for (int64_t r = 0; r < s.args.rows; ++r) {
          ops::PagedAttentionArgs one = s.args;
          std::vector<float> alone(static_cast<size_t>(HD));
          one.rows = 1;
          one.q = s.q.data() + r * HD;
          one.out = alone.data();
          one.block_tables = s.dense.ids.data() + r * s.dense.stride;
          one.n_keys = s.n_keys.data() + r;
          if (one.first_key) one.first_key = s.first_key.data() + r;
          for (int threads : {1, 2}) {
            paged_attention(test::pool(threads), one);
            ASSERT_EQ(alone,
                      std::vector<float>(first.begin() + r * HD, first.begin() + (r + 1) * HD))
                << what << " row " << r << " alone on " << threads << " threads";
          }
        }
      }
}

// Scores far below the running maximum (p under 1e-38) and keys whose score sets a new maximum
// late in the sequence: the rescaling and the flush of tiny p to 0 stay within the tolerance.
TEST(PagedAttention, WideScoreRange) {
  SharedCase c{3, 1, 32, 16, {}, {}, 0};
  add_prefill(c, 0, 60, 6);
  SharedSetup s = make_shared(c, 3);
  for (float& x : s.q) x *= 12.0f;  // scores spread over hundreds: exp underflows for many keys
  s.args.k_transposed = true;
  std::vector<float> want(s.q.size()), got(s.q.size());
  s.args.out = want.data();
  ref::paged_attention(s.args);
  s.args.out = got.data();
  paged_attention(test::pool(2), s.args);
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 2e-5 * (1 + std::fabs(want[i]))) << i;
}

}  // namespace
}  // namespace tessera::cpu
