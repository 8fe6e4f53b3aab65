// The core k-quant codecs (core/dtype) against the GGUF reader's own dequantizers (checked
// against gguf-py), and the ggml type table's k-quant entries.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "formats/gguf.h"

namespace tessera::formats {
namespace {

std::vector<float> gaussian(int64_t n, uint64_t seed, float scale) {
  Rng rng(seed);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = scale * rng.normal();
  return x;
}

TEST(GgufKQuant, CoreCodecsAgreeWithGgufDequantizers) {
  const int64_t n = 8 * kQK_K;
  for (float scale : {1.0f, 0.01f, 300.0f}) {
    std::vector<float> x = gaussian(n, 11, scale);
    x[3] = 0, x[300] = -4 * scale;  // a zero and an outlier
    std::vector<BlockQ4K> q4(n / kQK_K);
    std::vector<BlockQ6K> q6(n / kQK_K);
    from_f32(DType::q4_k, x.data(), q4.data(), n);
    from_f32(DType::q6_k, x.data(), q6.data(), n);
    std::vector<float> core(n), gguf(n);
    to_f32(DType::q4_k, q4.data(), core.data(), n);
    formats::dequantize_q4_k(q4.data(), gguf.data(), n);
    EXPECT_EQ(0, std::memcmp(core.data(), gguf.data(), n * 4)) << "q4_k scale " << scale;
    to_f32(DType::q6_k, q6.data(), core.data(), n);
    formats::dequantize_q6_k(q6.data(), gguf.data(), n);
    EXPECT_EQ(0, std::memcmp(core.data(), gguf.data(), n * 4)) << "q6_k scale " << scale;
    // And the round trip is a quantization, not garbage: error well under the data's RMS.
    double err = 0, ref = 0;
    for (int64_t i = 0; i < n; ++i) err += (gguf[i] - x[i]) * (gguf[i] - x[i]), ref += x[i] * x[i];
    EXPECT_LT(err, 0.001 * ref) << scale;
  }
}

TEST(GgufKQuant, TypeTableMapsNewerBlockTypesToDTypes) {
  const std::pair<formats::GgmlType, DType> pairs[] = {{formats::GgmlType::q5_0, DType::q5_0},
                                                       {formats::GgmlType::q5_1, DType::q5_1},
                                                       {formats::GgmlType::q5_k, DType::q5_k},
                                                       {formats::GgmlType::q2_k, DType::q2_k},
                                                       {formats::GgmlType::q3_k, DType::q3_k}};
  const char* names[] = {"Q5_0", "Q5_1", "Q5_K", "Q2_K", "Q3_K"};
  for (size_t i = 0; i < std::size(pairs); ++i) {
    const formats::GgmlTypeInfo* info =
        formats::ggml_type_info(static_cast<uint32_t>(pairs[i].first));
    ASSERT_TRUE(info) << names[i];
    EXPECT_EQ(info->name, names[i]);
    EXPECT_EQ(info->dtype, pairs[i].second);
    EXPECT_EQ(formats::ggml_type_of(pairs[i].second), pairs[i].first);
    EXPECT_EQ(info->block_bytes, traits(pairs[i].second).block_bytes);
    EXPECT_EQ(info->block_elems, traits(pairs[i].second).block_elems);
  }
  // ggml's ids: Q5_0 6, Q5_1 7, Q5_K 13, Q2_K 10, Q3_K 11; blocks of 22, 24, 176, 84, 110 bytes.
  EXPECT_EQ(formats::ggml_type_info(10)->block_bytes, 84);
  EXPECT_EQ(formats::ggml_type_info(11)->block_bytes, 110);
  EXPECT_EQ(formats::ggml_type_info(6)->block_bytes, 22);
  EXPECT_EQ(formats::ggml_type_info(7)->block_bytes, 24);
  EXPECT_EQ(formats::ggml_type_info(13)->block_bytes, 176);
}

TEST(GgufKQuant, TypeTableMapsKQuantsToDTypes) {
  const formats::GgmlTypeInfo* q4 =
      formats::ggml_type_info(static_cast<uint32_t>(formats::GgmlType::q4_k));
  const formats::GgmlTypeInfo* q6 =
      formats::ggml_type_info(static_cast<uint32_t>(formats::GgmlType::q6_k));
  ASSERT_TRUE(q4 && q6);
  EXPECT_EQ(q4->dtype, DType::q4_k);
  EXPECT_EQ(q6->dtype, DType::q6_k);
  EXPECT_EQ(formats::ggml_type_of(DType::q4_k), formats::GgmlType::q4_k);
  EXPECT_EQ(formats::ggml_type_of(DType::q6_k), formats::GgmlType::q6_k);
  EXPECT_EQ(q4->block_bytes, traits(DType::q4_k).block_bytes);
  EXPECT_EQ(q6->block_bytes, traits(DType::q6_k).block_bytes);
}

}  // namespace
}  // namespace tessera::formats
