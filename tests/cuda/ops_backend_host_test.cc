// The CUDA ops backend's host-side answers, which need no GPU and so run on every machine that
// builds CUDA: the attention plan it stages (ops::plan_paged_attention) holds plan_paged_prefill's
// tiles and decode rows where the op reads them, under the key that gives their counts; an f32
// cache or TESSERA_CUDA_PAGED_PREFILL=0 plans nothing, and a bad value is refused naming the
// variable; quantized rows (ops::quantized_rows_bytes) exist for the block types at the matvec's
// rows, as big as matmul_wt's own workspace, and nowhere else.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cuda/attention.h"
#include "backend/cuda/ops_backend.h"
#include "backend/cuda/quant_matvec.h"
#include "ops/backend.h"
#include "ops/paged_attention.h"
#include "ops/quant.h"
#include "test_util/expect_error.h"

namespace tessera {
namespace {

ops::Context cuda_context() {
  cuda::register_ops_backend();  // no device is needed until an op or an allocation
  ops::Context ctx;
  ctx.device = ops::Device::cuda;
  return ctx;
}

// One chunk as the engine stages it: a 40-row prompt of sequence 0 (positions 10..49), two decode
// rows of sequences 1 and 2, then a 20-row prompt of sequence 3; every row's table in full.
struct Chunk {
  int64_t S = 8;
  std::vector<int32_t> n_keys, tables;
  int64_t rows() const { return static_cast<int64_t>(n_keys.size()); }
};
Chunk chunk() {
  Chunk c;
  auto add = [&](int seq, int first_pos, int count) {
    for (int i = 0; i < count; ++i) {
      c.n_keys.push_back(first_pos + i + 1);
      for (int64_t b = 0; b < c.S; ++b) c.tables.push_back(seq * 100 + static_cast<int32_t>(b));
    }
  };
  add(0, 10, 40);
  add(1, 90, 1);
  add(2, 30, 1);
  add(3, 0, 20);
  return c;
}

ops::PagedAttentionArgs args(const Chunk& c, DType kv_type) {
  ops::PagedAttentionArgs a;
  a.kv_type = kv_type;
  a.Hkv = 2, a.D = 64, a.block_tokens = 16, a.block_stride = 2 * 2 * 16 * 64, a.v_offset = 2048;
  a.rows = c.rows(), a.H = 4;
  a.block_tables = c.tables.data();
  a.table_stride = c.S;
  a.n_keys = c.n_keys.data();
  return a;
}

TEST(CudaOpsBackendHost, PlansPromptTilesWhereTheOpReadsThem) {
  const ops::Context ctx = cuda_context();
  unsetenv("TESSERA_CUDA_PAGED_PREFILL");
  const Chunk c = chunk();
  const int64_t bytes = ops::paged_attention_plan_bytes(ctx, c.rows());
  ASSERT_GT(bytes, 0);
  std::vector<uint8_t> plan(static_cast<size_t>(bytes));
  const int64_t key = ops::plan_paged_attention(ctx, args(c, DType::f16), plan.data());

  const cuda::PagedPrefillPlan want =
      cuda::plan_paged_prefill(c.rows(), c.n_keys.data(), nullptr, c.tables.data(), c.S, 16);
  ASSERT_EQ(want.tiles.size(), 2u);  // the two prompts, 40 and 20 rows
  ASSERT_EQ(want.decode_rows.size(), 2u);
  EXPECT_EQ(key >> 32, 2);
  EXPECT_EQ(key & 0xffffffff, 2);
  // The tiles first, then (16-byte aligned) the decode rows: as paged_attention reads the plan.
  const size_t tiles = want.tiles.size() * sizeof(cuda::PagedPrefillTile);
  EXPECT_EQ(std::memcmp(plan.data(), want.tiles.data(), tiles), 0);
  const size_t rows_at =
      (static_cast<size_t>(c.rows()) * sizeof(cuda::PagedPrefillTile) + 15) / 16 * 16;
  ASSERT_LE(rows_at + want.decode_rows.size() * 4, plan.size());
  EXPECT_EQ(std::memcmp(plan.data() + rows_at, want.decode_rows.data(),
                        want.decode_rows.size() * sizeof(int32_t)),
            0);
  EXPECT_EQ(bytes % 16, 0) << "kinds' plans sit side by side";

  // An f32 cache has no tiles; the variable turns them off; a bad value names itself.
  EXPECT_EQ(ops::plan_paged_attention(ctx, args(c, DType::f32), plan.data()), 0);
  setenv("TESSERA_CUDA_PAGED_PREFILL", "0", 1);
  EXPECT_EQ(ops::plan_paged_attention(ctx, args(c, DType::f16), plan.data()), 0);
  setenv("TESSERA_CUDA_PAGED_PREFILL", "maybe", 1);
  test::expect_error([&] { ops::plan_paged_attention(ctx, args(c, DType::f16), plan.data()); },
                     "TESSERA_CUDA_PAGED_PREFILL=maybe");
  unsetenv("TESSERA_CUDA_PAGED_PREFILL");
  ops::register_backend(ops::Device::cuda, nullptr);
}

TEST(CudaOpsBackendHost, QuantizedRowsForTheBlockTypesAtTheMatvecsRows) {
  const ops::Context ctx = cuda_context();
  for (DType t : {DType::q8_0, DType::q4_0, DType::q4_1, DType::q5_0, DType::q5_1, DType::q4_k,
                  DType::q5_k, DType::q6_k})
    for (int64_t rows = 1; rows <= cuda::kMatvecMaxRows; ++rows)
      EXPECT_EQ(ops::quantized_rows_bytes(ctx, rows, 512, t),
                static_cast<int64_t>(cuda::matmul_wt_workspace_bytes(rows, 512, t)))
          << dtype_name(t) << " rows " << rows;
  EXPECT_GT(ops::quantized_rows_bytes(ctx, 1, 512, DType::q4_0), 0);
  EXPECT_EQ(ops::quantized_rows_bytes(ctx, cuda::kMatvecMaxRows + 1, 512, DType::q4_0), 0);
  EXPECT_EQ(ops::quantized_rows_bytes(ctx, 4, 512, DType::f16), 0);
  EXPECT_EQ(ops::quantized_rows_bytes(ctx, 4, 512, DType::f32), 0);
  EXPECT_EQ(ops::quantized_rows_bytes(ctx, 4, 500, DType::q8_0), 0);  // not whole blocks
  // An op given rows the device has no format for is refused, naming the op.
  ops::QuantizedRows q{reinterpret_cast<void*>(64), DType::f16, 1, 512};
  test::expect_error([&] { ops::check_quantized_rows(ctx, &q, 1, 512, "glu_forward"); },
                     "[glu_forward] cuda has no quantized rows");
  ops::register_backend(ops::Device::cuda, nullptr);
}

}  // namespace
}  // namespace tessera
