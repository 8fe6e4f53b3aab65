// model::use_cpu_layout: which matrices it rearranges (q4_0 / q4_1 / q8_0 ones with rows in 8s,
// k-quant ones too where the AVX512-VNNI kernels run, f16 ones with rows in 16s, the token
// embedding and its tied head included), that the bytes hold the same rows afterwards, that it is
// idempotent, and that two views of the same bytes are rearranged once.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/quant_matmul_avx2.h"
#include "core/interleave.h"
#include "model/decoder.h"
#include "model/synthetic.h"
#include "ops/quant.h"
#include "test_util/expect_error.h"

namespace tessera::model {
namespace {

std::vector<uint8_t> row_bytes_of(const WeightRef& r, int64_t row) {
  const DType plain = plain_type(r.type);
  std::vector<uint8_t> out(static_cast<size_t>(dtype_bytes(plain, r.cols())));
  if (is_interleaved(r.type))
    deinterleave_row(r.type, r.data, r.cols(), row, out.data());
  else
    std::memcpy(out.data(), static_cast<const uint8_t*>(r.data) + row * out.size(), out.size());
  return out;
}

TEST(CpuLayout, RearrangesBlockMatricesAndTheTiedEmbedding) {
  for (DType t : {DType::q4_1, DType::q8_0, DType::f16}) {
    DecoderModel m = make_synthetic_decoder("synthetic:135m:" + std::string(dtype_name(t)));
    ASSERT_EQ(m.weights.output.data, m.weights.tok_embd.data) << "the 135m shape ties its head";
    const WeightRef wq = m.weights.layers[3].wq, wk = m.weights.layers[3].wk;
    std::vector<std::vector<uint8_t>> rows;
    for (int64_t r : {0, 5, 13, 575}) rows.push_back(row_bytes_of(wq, r));
    const std::vector<uint8_t> k_row = row_bytes_of(wk, 191);
    const std::vector<uint8_t> embd_row = row_bytes_of(m.weights.tok_embd, 49151);
    std::vector<float> embd_f32(576), embd_after(576);
    ops::dequantize_row(m.weights.tok_embd.data, t, 576, 49152, 49151, embd_f32.data());
    const int64_t bytes = use_cpu_layout(m);
    const DType want = ops::cpu_preferred_layout(t, 576);
    const DecoderLayer& l = m.weights.layers[3];
    EXPECT_EQ(l.wq.type, want);
    EXPECT_EQ(l.w_down.type, want);
    EXPECT_EQ(m.weights.tok_embd.type, want);  // the engine looks rows up in any layout
    EXPECT_EQ(m.weights.output.type, want);    // the tied head: the same bytes, retyped once
    if (want == t) GTEST_SKIP() << "no AVX2: the CPU keeps the plain layout";
    EXPECT_EQ(want, interleaved_type(t));
    int64_t matrices = m.weights.tok_embd.bytes();
    for (const DecoderLayer& x : m.weights.layers)
      for (const WeightRef* r : x.matrices()) {
        EXPECT_EQ(r->type, want);
        matrices += r->bytes();
      }
    EXPECT_EQ(bytes, matrices) << "each matrix once, the tied head not twice";
    int i = 0;
    for (int64_t r : {0, 5, 13, 575}) EXPECT_EQ(row_bytes_of(l.wq, r), rows[i++]) << "row " << r;
    EXPECT_EQ(row_bytes_of(l.wk, 191), k_row);
    EXPECT_EQ(row_bytes_of(m.weights.tok_embd, 49151), embd_row);
    ops::dequantize_row(m.weights.tok_embd.data, want, 576, 49152, 49151, embd_after.data());
    EXPECT_EQ(embd_after, embd_f32) << "the engine's embedding lookup reads the new layout";
    EXPECT_EQ(use_cpu_layout(m), 0) << "a second call must change nothing";
  }
}

TEST(CpuLayout, GroupsNeedWholeMultiplesOfTheirRows) {
  if (ops::cpu_preferred_layout(DType::q4_0, 576) == DType::q4_0) GTEST_SKIP() << "no AVX2";
  EXPECT_EQ(ops::cpu_preferred_layout(DType::q4_0, 24), DType::q4_0x8);
  EXPECT_EQ(ops::cpu_preferred_layout(DType::q4_0, 12), DType::q4_0);
  EXPECT_EQ(ops::cpu_preferred_layout(DType::f16, 32), DType::f16x16);
  EXPECT_EQ(ops::cpu_preferred_layout(DType::f16, 24), DType::f16);  // 8s are not 16s
  EXPECT_EQ(ops::cpu_preferred_layout(DType::bf16, 32), DType::bf16);
  // The k-quant layouts have AVX512-VNNI kernels only.
  const bool vnni = cpu::quant_avx512_vnni_active();
  EXPECT_EQ(ops::cpu_preferred_layout(DType::q4_k, 32), vnni ? DType::q4_kx8 : DType::q4_k);
  EXPECT_EQ(ops::cpu_preferred_layout(DType::q5_k, 32), vnni ? DType::q5_kx8 : DType::q5_k);
  EXPECT_EQ(ops::cpu_preferred_layout(DType::q6_k, 32), vnni ? DType::q6_kx8 : DType::q6_k);
  EXPECT_EQ(ops::cpu_preferred_layout(DType::q4_k, 36), DType::q4_k);
  cpu::set_quant_avx512_vnni_allowed(false);
  EXPECT_EQ(ops::cpu_preferred_layout(DType::q4_k, 32), DType::q4_k);
  EXPECT_EQ(ops::cpu_preferred_layout(DType::q5_k, 32), DType::q5_k);
  EXPECT_EQ(ops::cpu_preferred_layout(DType::q6_k, 32), DType::q6_k);
  cpu::set_quant_avx512_vnni_allowed(true);
}

TEST(CpuLayout, SharedBytesAreRearrangedOnce) {
  DecoderModel m = make_synthetic_decoder("synthetic:135m:q4_0");
  if (ops::cpu_preferred_layout(DType::q4_0, 576) == DType::q4_0) GTEST_SKIP() << "no AVX2";
  DecoderLayer& a = m.weights.layers[0];
  DecoderLayer& b = m.weights.layers[1];
  b.wo = a.wq;  // same shape and type: one matrix named twice
  const std::vector<uint8_t> row = row_bytes_of(a.wq, 9);
  use_cpu_layout(m);
  EXPECT_EQ(b.wo.type, DType::q4_0x8);
  EXPECT_EQ(row_bytes_of(a.wq, 9), row);
  EXPECT_EQ(row_bytes_of(b.wo, 9), row);

  DecoderModel m2 = make_synthetic_decoder("synthetic:135m:q4_0");
  m2.weights.layers[1].w_up = m2.weights.layers[0].w_down;  // different shape, same bytes
  m2.weights.layers[1].w_up.shape = Shape({1536, 576});
  test::expect_error([&] { use_cpu_layout(m2); }, "share their bytes");
}

}  // namespace
}  // namespace tessera::model
