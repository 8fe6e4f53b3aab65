// The CUDA paged decode attention (flash-decoding splits, GQA, f32/f16/bf16 caches) against
// the CPU reference kernel, its optional output quantization against matmul_wt's own quantizer,
// the prompt tiles (planner on the host, tensor-core kernel against a float64 reference), and
// the argument checks (which run without a GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cpu/paged_attention.h"
#include "backend/cpu/ref/ref_kernels.h"
#include "backend/cuda/attention.h"
#include "core/dtype.h"
#include "core/error.h"
#include "cuda_test_util.h"

namespace tessera {
namespace {

using cuda::test::DeviceArray;
using cuda::test::random_16bit;
using cuda::test::to_16bit;

TEST(CudaPagedDecodeArgs, RejectsBadArguments) {
  // The argument checks run before any device access (the pointers are never
  // read), so a zero head count is named, not left to fail at launch.
  cuda::PagedDecodeArgs d;
  alignas(16) float dummy[4] = {};
  int32_t ids[1] = {};
  d.out = dummy, d.q = dummy, d.kv = dummy, d.block_tables = ids, d.n_keys = ids;
  d.rows = 1, d.H = 0, d.Hkv = 1, d.D = 64, d.block_tokens = 16, d.table_stride = 1;
  d.max_keys = 1;
  try {
    cuda::paged_decode_attention(d, nullptr);
    ADD_FAILURE() << "H=0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("heads H=0"), std::string::npos) << e.what();
  }
  // quantize_out must match the output's shape and take blocks of 32.
  d.H = 2, d.v_offset = 16 * 64, d.block_stride = 2 * 16 * 64;
  int8_t qbytes[4] = {};
  int32_t sums[1] = {};
  cuda::QuantizedActs qa;
  qa.q = qbytes, qa.d = dummy, qa.s = sums, qa.M = 1, qa.K = 64, qa.block = 32;
  d.quantize_out = &qa;
  try {
    cuda::paged_decode_attention(d, nullptr);
    ADD_FAILURE() << "quantize_out of the wrong width accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("quantize_out is for (1, 64)"), std::string::npos)
        << e.what();
  }
  qa.K = 128, qa.block = 256;
  try {
    cuda::paged_decode_attention(d, nullptr);
    ADD_FAILURE() << "quantize_out in blocks of 256 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("blocks of 32"), std::string::npos) << e.what();
  }
}

// ---- Paged decode ----

struct PagedCase {
  DType kv_dtype;
  int64_t D, block_tokens;
  std::vector<int32_t> n_keys;
  bool workspace;
  int64_t window = 0;  // > 0: each row reads its last `window` keys only
};

std::string paged_case_name(const PagedCase& c) {
  return std::string(dtype_name(c.kv_dtype)) + "_D" + std::to_string(c.D) + "_bt" +
         std::to_string(c.block_tokens) + (c.workspace ? "_split" : "_nosplit") +
         (c.window > 0 ? "_window" + std::to_string(c.window) : "");
}
// gtest (and so the ctest names) would print the struct's bytes: the vector's pointers.
void PrintTo(const PagedCase& c, std::ostream* os) {
  *os << paged_case_name(c) << "_keys";
  for (int32_t n : c.n_keys) *os << "_" << n;
}

// Tolerance: cache values are the same on both sides (the reference reads them as f32), so
// only f32 accumulation differs: score errors ~D * 2^-24 * scale * sum|q||k| (~1e-5 here) move
// each weight by that relative amount, and the running sums over up to 32k keys (split into
// many short runs) add ~1e-6 relative; 1e-4 * max|v| covers both with margin while a wrong key,
// block or split would be off by O(max|v|).
void run_paged_case(const PagedCase& c) {
  std::mt19937 rng(static_cast<uint32_t>(c.D + c.block_tokens + c.n_keys.size()));
  const int64_t rows = static_cast<int64_t>(c.n_keys.size()), H = 8, Hkv = 2, D = c.D;
  const int64_t bt = c.block_tokens;
  const int64_t max_keys = *std::max_element(c.n_keys.begin(), c.n_keys.end());
  const int64_t table_stride = (max_keys + bt - 1) / bt;
  int64_t total_blocks = 0;
  for (int32_t nk : c.n_keys) total_blocks += (nk + bt - 1) / bt;
  total_blocks += 5;  // unused blocks in between
  const int64_t half = Hkv * bt * D, block_stride = 2 * half;
  // Cache values rounded to the cache type; the host copy is f32 for the CPU reference.
  std::vector<float> kv_f = random_16bit(size_t(total_blocks * block_stride), -1, 1,
                                         c.kv_dtype == DType::f16 ? DType::f16 : DType::bf16, rng);
  std::vector<float> q(size_t(rows * H * D));
  std::uniform_real_distribution<float> u(-2, 2);
  for (auto& x : q) x = u(rng);
  // Random block tables: a shuffled pool, each row takes what it needs. Rows with a shared
  // prefix (multi-token decode) are not needed for correctness: each row is independent.
  std::vector<int32_t> pool(static_cast<size_t>(total_blocks));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  std::vector<int32_t> tables(size_t(rows * table_stride), -1);
  size_t next = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < (c.n_keys[size_t(r)] + bt - 1) / bt; ++b)
      tables[size_t(r * table_stride + b)] = pool[next++];
  // Rows that share a table (a small multi-token step): the last row reuses row 0's blocks.
  if (rows >= 2 && c.n_keys.back() <= c.n_keys[0])
    std::copy(tables.begin(), tables.begin() + table_stride, tables.end() - table_stride);

  std::vector<float> want(q.size());
  ops::PagedAttentionArgs ra;
  ra.out = want.data();
  ra.q = q.data();
  ra.rows = rows;
  ra.H = H;
  ra.Hkv = Hkv;
  ra.D = D;
  ra.kv = kv_f.data();
  ra.block_tokens = bt;
  ra.block_stride = block_stride;
  ra.v_offset = half;
  ra.block_tables = tables.data();
  ra.table_stride = table_stride;
  ra.n_keys = c.n_keys.data();
  std::vector<int32_t> first(c.n_keys.size(), 0);
  if (c.window > 0) {
    for (size_t r = 0; r < first.size(); ++r)
      first[r] = static_cast<int32_t>(std::max<int64_t>(0, c.n_keys[r] - c.window));
    ra.first_key = first.data();
  }
  ra.scale = 1.0f / std::sqrt(float(D));
  cpu::ref::paged_attention(ra);

  std::unique_ptr<DeviceArray<float>> d_f32;
  std::unique_ptr<DeviceArray<uint16_t>> d_16;
  const void* kv_dev = nullptr;
  if (c.kv_dtype == DType::f32) {
    d_f32 = std::make_unique<DeviceArray<float>>(kv_f);
    kv_dev = d_f32->get();
  } else {
    d_16 = std::make_unique<DeviceArray<uint16_t>>(to_16bit(kv_f, c.kv_dtype));
    kv_dev = d_16->get();
  }
  DeviceArray<float> d_q(q), d_out(q.size());
  DeviceArray<int32_t> d_tables(tables), d_nk(c.n_keys), d_first(first);
  const int64_t ws_floats = c.workspace ? cuda::paged_decode_workspace_floats(rows, H, D, 64) : 0;
  DeviceArray<float> d_ws(size_t(std::max<int64_t>(ws_floats, 1)));
  cuda::PagedDecodeArgs a;
  a.out = d_out.get();
  a.q = d_q.get();
  a.rows = rows;
  a.H = H;
  a.Hkv = Hkv;
  a.D = D;
  a.kv = kv_dev;
  a.kv_dtype = c.kv_dtype;
  a.block_tokens = bt;
  a.block_stride = block_stride;
  a.v_offset = half;
  a.block_tables = d_tables.get();
  a.table_stride = table_stride;
  a.n_keys = d_nk.get();
  a.max_keys = max_keys;
  if (c.window > 0) {
    a.first_key = d_first.get();
    a.max_span = std::min(max_keys, c.window);
  }
  a.scale = ra.scale;
  a.workspace = c.workspace ? d_ws.get() : nullptr;
  a.workspace_floats = ws_floats;
  cuda::paged_decode_attention(a, nullptr);
  const auto got = d_out.download();
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 10; ++i) {
    if (!(std::fabs(got[i] - want[i]) <= 1e-4)) {
      ++bad;
      ADD_FAILURE() << "out[" << i << "] (row " << i / size_t(H * D) << ") = " << got[i]
                    << ", want " << want[i];
    }
  }
  if (rows > cuda::kMatvecMaxRows) return;
  // Once more quantizing the output for a q4_0 product (split and unsplit paths): the same
  // output bits, and the workspace bytes and product matmul_wt gives from that output.
  const int64_t K = H * D, N = 24;
  std::vector<float> wf(size_t(N * K));
  for (auto& x : wf) x = u(rng);
  std::vector<uint8_t> wq(size_t(dtype_bytes(DType::q4_0, N * K)));
  from_f32(DType::q4_0, wf.data(), wq.data(), N * K);
  DeviceArray<uint8_t> d_w(wq);
  const size_t ws_bytes = cuda::matmul_wt_workspace_bytes(rows, K, DType::q4_0);
  DeviceArray<uint8_t> ws1(ws_bytes), ws2(ws_bytes);
  DeviceArray<float> y1(size_t(rows * N)), y2(size_t(rows * N)), d_out2(q.size());
  cuda::matmul_wt(y1.get(), N, d_out.get(), rows, K, d_w.get(), DType::q4_0, N, nullptr, ws1.get(),
                  ws_bytes, nullptr);
  const cuda::QuantizedActs qa =
      cuda::quantized_acts_view(ws2.get(), ws_bytes, rows, K, DType::q4_0);
  a.out = d_out2.get();
  a.quantize_out = &qa;
  cuda::paged_decode_attention(a, nullptr);
  cuda::matmul_wt_quantized(y2.get(), N, qa, d_w.get(), DType::q4_0, N, nullptr, nullptr);
  ASSERT_EQ(d_out2.download(), got) << "quantizing changed the output";
  ASSERT_EQ(ws2.download(), ws1.download()) << "quantized output differs from matmul_wt's";
  ASSERT_EQ(y2.download(), y1.download());
}

class CudaPagedDecode : public ::testing::TestWithParam<PagedCase> {};
TEST_P(CudaPagedDecode, MatchesCpuReference) {
  TS_REQUIRE_CUDA_DEVICE();
  run_paged_case(GetParam());
}
std::vector<PagedCase> paged_cases() {
  std::vector<PagedCase> cases;
  for (DType t : {DType::f32, DType::f16, DType::bf16})
    for (int64_t D : {64, 128})
      for (bool ws : {false, true}) {
        // Contexts ending mid-block, a single key, and a long one that forces splits; the last
        // row shares row 0's blocks with one key fewer (a multi-token step).
        cases.push_back({t, D, 16, {1000, 1, 37, 517, 999}, ws});
        cases.push_back({t, D, 32, {5000, 4097, 33}, ws});
        // A window of 1000 keys (still split in four), starting mid-block.
        cases.push_back({t, D, 32, {5000, 4097, 33, 1001}, ws, 1000});
      }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Caches, CudaPagedDecode, ::testing::ValuesIn(paged_cases()),
                         [](const auto& info) { return paged_case_name(info.param); });

// ---- Prompt tiles (plan_paged_prefill and the tensor-core kernel) ----

// A chunk the engine could build: sequence A continues a prompt (70 rows at positions 100..169),
// B is decoding (1 row), C starts a prompt (16 rows from 0), D takes a 3-token step (too few for
// a tile), E a 15-row run (one short of a tile). Tables are per row, S entries each, with each
// sequence's rows sharing one table.
struct ChunkRows {
  std::vector<int32_t> n_keys, tables;
  std::vector<int> seq;  // which sequence each row belongs to
  int64_t S = 0;
};
ChunkRows engine_like_chunk(int64_t block_tokens) {
  struct Run {
    int start, rows;
  };
  const std::vector<Run> runs = {{100, 70}, {299, 1}, {0, 16}, {40, 3}, {7, 15}};
  ChunkRows c;
  int max_len = 0;
  for (const Run& r : runs) max_len = std::max(max_len, r.start + r.rows);
  c.S = (max_len + block_tokens - 1) / block_tokens;
  int next_block = 3;  // blocks 0..2 unused
  for (size_t i = 0; i < runs.size(); ++i) {
    std::vector<int32_t> table(static_cast<size_t>(c.S), 0);
    const int len = runs[i].start + runs[i].rows;
    for (int64_t b = 0; b < (len + block_tokens - 1) / block_tokens; ++b) {
      table[static_cast<size_t>(b)] = next_block;
      next_block += 2;  // every other block: a sequence's blocks are not contiguous
    }
    for (int r = 0; r < runs[i].rows; ++r) {
      c.n_keys.push_back(runs[i].start + r + 1);
      c.tables.insert(c.tables.end(), table.begin(), table.end());
      c.seq.push_back(static_cast<int>(i));
    }
  }
  return c;
}

TEST(CudaPagedPrefillPlan, TilesRunsOfOneTableAndListsTheRest) {
  const ChunkRows c = engine_like_chunk(16);
  const int64_t rows = static_cast<int64_t>(c.n_keys.size());
  const cuda::PagedPrefillPlan plan =
      cuda::plan_paged_prefill(rows, c.n_keys.data(), nullptr, c.tables.data(), c.S, 16);
  // A's 70 rows in tiles of 64 and 6, C's 16 in one; B, D and E (1 + 3 + 15 rows) decode.
  ASSERT_EQ(plan.tiles.size(), 3u);
  std::vector<int> covered(static_cast<size_t>(rows), 0);
  for (const cuda::PagedPrefillTile& t : plan.tiles) {
    ASSERT_GE(t.rows, 1);
    ASSERT_LE(t.rows, cuda::kPrefillTileRows);
    int32_t lo = INT32_MAX, hi = 0;
    for (int r = t.row0; r < t.row0 + t.rows; ++r) {
      ++covered[static_cast<size_t>(r)];
      EXPECT_EQ(c.seq[static_cast<size_t>(r)], c.seq[static_cast<size_t>(t.row0)])
          << "tile at row " << t.row0 << " mixes sequences";
      lo = std::min(lo, c.n_keys[static_cast<size_t>(r)]);
      hi = std::max(hi, c.n_keys[static_cast<size_t>(r)]);
    }
    EXPECT_EQ(t.min_keys, lo);
    EXPECT_EQ(t.max_keys, hi);
  }
  for (int32_t r : plan.decode_rows) ++covered[static_cast<size_t>(r)];
  for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(covered[static_cast<size_t>(r)], 1) << "row " << r;
  EXPECT_EQ(plan.decode_rows.size(), 19u);
  EXPECT_TRUE(std::is_sorted(plan.decode_rows.begin(), plan.decode_rows.end()));
  // Heaviest first: A's second tile (keys up to 170), A's first (164), then C's (16).
  EXPECT_EQ(plan.tiles[0].row0, 64);
  EXPECT_EQ(plan.tiles[0].max_keys, 170);
  EXPECT_EQ(plan.tiles[1].row0, 0);
  EXPECT_EQ(plan.tiles[2].rows, 16);
  EXPECT_EQ(plan.tiles[2].max_keys, 16);

  // A higher threshold leaves C to the decode kernel; min_rows 1 tiles every row.
  EXPECT_EQ(cuda::plan_paged_prefill(rows, c.n_keys.data(), nullptr, c.tables.data(), c.S, 17)
                .tiles.size(),
            2u);
  const cuda::PagedPrefillPlan all =
      cuda::plan_paged_prefill(rows, c.n_keys.data(), nullptr, c.tables.data(), c.S, 1);
  EXPECT_TRUE(all.decode_rows.empty());
  EXPECT_EQ(all.tiles.size(), 6u);
  EXPECT_THROW(cuda::plan_paged_prefill(rows, c.n_keys.data(), nullptr, c.tables.data(), 0, 16),
               Error);
  // With a window of 40 keys, the tiles carry their rows' first keys: A's second tile starts
  // at keys 125..130, past its first 64-key tile.
  std::vector<int32_t> first(c.n_keys.size());
  for (size_t r = 0; r < first.size(); ++r) first[r] = std::max(0, c.n_keys[r] - 40);
  const cuda::PagedPrefillPlan windowed =
      cuda::plan_paged_prefill(rows, c.n_keys.data(), first.data(), c.tables.data(), c.S, 16);
  ASSERT_EQ(windowed.tiles.size(), 3u);
  EXPECT_EQ(windowed.tiles[0].min_first, 125);
  EXPECT_EQ(windowed.tiles[0].max_first, 130);
  EXPECT_EQ(windowed.tiles[1].min_first, 61);
  EXPECT_EQ(windowed.tiles[2].max_first, 0);
}

TEST(CudaPagedPrefillArgs, RejectsWhatTheTilesCannotTake) {
  alignas(16) float dummy[4] = {};
  int32_t ids[4] = {};
  cuda::PagedPrefillTile tile;
  cuda::PagedDecodeArgs d;
  d.out = dummy, d.q = dummy, d.kv = dummy, d.block_tables = ids, d.n_keys = ids;
  d.rows = 2, d.H = 2, d.Hkv = 1, d.D = 64, d.block_tokens = 16, d.table_stride = 1;
  d.max_keys = 1, d.v_offset = 16 * 64, d.block_stride = 2 * 16 * 64;
  d.prefill_tiles = &tile, d.n_prefill_tiles = 1, d.decode_rows = ids, d.n_decode_rows = 1;
  auto refused = [&](const char* want) {
    try {
      cuda::paged_decode_attention(d, nullptr);
      ADD_FAILURE() << "accepted; wanted an error with: " << want;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  d.kv_dtype = DType::f32;
  refused("prefill tiles need a 16-bit cache");
  d.kv_dtype = DType::f16;
  d.n_prefill_tiles = 3;
  refused("n_prefill_tiles=3 must be in [0, rows=2]");
  d.n_prefill_tiles = 1;
  d.decode_rows = nullptr;
  refused("need the decode_rows list");
  d.decode_rows = ids;
  d.n_decode_rows = -1;
  refused("n_decode_rows=-1");
  d.n_decode_rows = 1;
  d.q = reinterpret_cast<const float*>(reinterpret_cast<const char*>(dummy) + 4);
  refused("16-byte aligned q");
}

// The chunk above through the tiles (and the decode kernel for the other rows) against a float64
// reference. For tile rows the reference rounds q * scale to the cache type as the kernel does,
// so what remains is the rounding of each weight p to 16 bits before P V (relative u each, so at
// most u * sum_j p_j |v_j| / sum_j p_j per output) and f32 accumulation (1e-4 * max|v| covers
// the score sums of D products and the running rescales). A key read from the wrong block or a
// mask off by one key moves an output by ~|v| / n_keys, which is 10-100x more at these lengths.
// With a sliding window of W keys (W > 0) every row reads only its last W keys.
void run_prefill_case(DType kv_dtype, int64_t D, int64_t bt, int64_t W) {
  std::mt19937 rng(static_cast<uint32_t>(7 * D + bt + W));
  const ChunkRows c = engine_like_chunk(bt);
  const int64_t rows = static_cast<int64_t>(c.n_keys.size()), H = 8, Hkv = 2;
  std::vector<int32_t> first(c.n_keys.size(), 0);
  if (W > 0)
    for (size_t r = 0; r < first.size(); ++r)
      first[r] = static_cast<int32_t>(std::max<int64_t>(0, c.n_keys[r] - W));
  const int64_t half = Hkv * bt * D, block_stride = 2 * half;
  const int64_t n_blocks = *std::max_element(c.tables.begin(), c.tables.end()) + 2;
  const std::vector<float> kv = random_16bit(size_t(n_blocks * block_stride), -1, 1, kv_dtype, rng);
  std::vector<float> q(size_t(rows * H * D));
  std::uniform_real_distribution<float> u(-2, 2);
  for (auto& x : q) x = u(rng);
  const float scale = 1.0f / std::sqrt(float(D));
  const cuda::PagedPrefillPlan plan = cuda::plan_paged_prefill(
      rows, c.n_keys.data(), W > 0 ? first.data() : nullptr, c.tables.data(), c.S, 16);
  std::vector<char> tiled(size_t(rows), 0);
  for (const cuda::PagedPrefillTile& t : plan.tiles)
    for (int r = t.row0; r < t.row0 + t.rows; ++r) tiled[size_t(r)] = 1;
  const double unit = kv_dtype == DType::f16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
  auto round16 = [&](float x) {
    return kv_dtype == DType::f16 ? f16_to_f32(f32_to_f16(x)) : bf16_to_f32(f32_to_bf16(x));
  };

  std::vector<double> want(q.size()), bound(q.size());
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t nk = c.n_keys[size_t(r)], fk = first[size_t(r)];
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / Hkv);
      auto elem = [&](int64_t j, int64_t d) {  // key j's dim d; values half later
        const int64_t blk = c.tables[size_t(r * c.S + j / bt)];
        return blk * block_stride + (g * bt + j % bt) * D + d;
      };
      std::vector<double> s(static_cast<size_t>(nk));
      double mx = -INFINITY;
      for (int64_t j = fk; j < nk; ++j) {
        double acc = 0;
        for (int64_t d = 0; d < D; ++d) {
          const float qd = q[size_t((r * H + h) * D + d)];
          const double qs = tiled[size_t(r)] ? round16(qd * scale) : double(qd) * scale;
          acc += qs * kv[size_t(elem(j, d))];
        }
        s[size_t(j)] = acc;
        mx = std::max(mx, acc);
      }
      double sum = 0;
      std::vector<double> o(size_t(D), 0.0), mag(size_t(D), 0.0);
      for (int64_t j = fk; j < nk; ++j) {
        const double p = std::exp(s[size_t(j)] - mx);
        sum += p;
        for (int64_t d = 0; d < D; ++d) {
          const double v = kv[size_t(elem(j, d) + half)];
          o[size_t(d)] += p * v;
          mag[size_t(d)] += p * std::fabs(v);
        }
      }
      for (int64_t d = 0; d < D; ++d) {
        const size_t i = size_t((r * H + h) * D + d);
        want[i] = o[size_t(d)] / sum;
        bound[i] = (tiled[size_t(r)] ? unit * mag[size_t(d)] / sum : 0.0) + 1e-4;
      }
    }
  }

  DeviceArray<uint16_t> d_kv(to_16bit(kv, kv_dtype));
  DeviceArray<float> d_q(q), d_out(q.size());
  DeviceArray<int32_t> d_tables(c.tables), d_nk(c.n_keys), d_rows(plan.decode_rows), d_first(first);
  DeviceArray<cuda::PagedPrefillTile> d_tiles(plan.tiles);
  const int64_t ws_floats = cuda::paged_decode_workspace_floats(rows, H, D, 8);
  DeviceArray<float> d_ws(static_cast<size_t>(ws_floats));
  cuda::PagedDecodeArgs a;
  a.out = d_out.get();
  a.q = d_q.get();
  a.rows = rows;
  a.H = H;
  a.Hkv = Hkv;
  a.D = D;
  a.kv = d_kv.get();
  a.kv_dtype = kv_dtype;
  a.block_tokens = bt;
  a.block_stride = block_stride;
  a.v_offset = half;
  a.block_tables = d_tables.get();
  a.table_stride = c.S;
  a.n_keys = d_nk.get();
  a.max_keys = *std::max_element(c.n_keys.begin(), c.n_keys.end());
  a.scale = scale;
  if (W > 0) {
    a.first_key = d_first.get();
    a.max_span = W;
  }
  a.workspace = d_ws.get();
  a.workspace_floats = ws_floats;
  a.prefill_tiles = d_tiles.get();
  a.n_prefill_tiles = static_cast<int64_t>(plan.tiles.size());
  a.decode_rows = d_rows.get();
  a.n_decode_rows = static_cast<int64_t>(plan.decode_rows.size());
  cuda::paged_decode_attention(a, nullptr);
  const std::vector<float> got = d_out.download();
  int bad = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - want[i]);
    worst = std::max(worst, err / bound[i]);
    if (!(err <= bound[i]) && ++bad <= 10) {
      const size_t row = i / size_t(H * D);
      ADD_FAILURE() << "out[" << i << "] (row " << row << ", " << (tiled[row] ? "tile" : "decode")
                    << ") = " << got[i] << ", want " << want[i] << " +- " << bound[i];
    }
  }
  std::printf("worst error / bound: %.3f\n", worst);
}

class CudaPagedPrefill
    : public ::testing::TestWithParam<std::tuple<DType, int64_t, int64_t, int64_t>> {};
TEST_P(CudaPagedPrefill, MatchesFloat64Reference) {
  TS_REQUIRE_CUDA_DEVICE();
  const auto& [t, D, bt, W] = GetParam();
  run_prefill_case(t, D, bt, W);
}
// Block sizes of 16 and 32 (the engine's default), and 7, which puts block edges inside every
// 16-key fragment; no window, and one of 40 keys (a tile's rows then start their keys inside a
// tile, the later ones past the first tile, which the kernel skips).
INSTANTIATE_TEST_SUITE_P(Caches, CudaPagedPrefill,
                         ::testing::Combine(::testing::Values(DType::f16, DType::bf16),
                                            ::testing::Values(int64_t{64}, int64_t{128}),
                                            ::testing::Values(int64_t{16}, int64_t{32}, int64_t{7}),
                                            ::testing::Values(int64_t{0}, int64_t{40})),
                         [](const auto& info) {
                           return std::string(dtype_name(std::get<0>(info.param))) + "_D" +
                                  std::to_string(std::get<1>(info.param)) + "_bt" +
                                  std::to_string(std::get<2>(info.param)) + "_window" +
                                  std::to_string(std::get<3>(info.param));
                         });

}  // namespace
}  // namespace tessera
