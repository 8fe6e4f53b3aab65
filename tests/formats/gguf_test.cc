// GGUF writer/reader round trip (all metadata types, all tensor types, alignment), typed
// getters, conversion to f32, and the k-quant dequantizers against values from gguf-py.
#include "formats/gguf.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"

namespace tessera::formats {
namespace {

std::string temp_path(const std::string& name) {
  return cat(::testing::TempDir(), "/gguf_", ::getpid(), "_", name, ".gguf");
}

// Deterministic bytes that are not all alike, for raw (already quantized) tensor payloads.
std::vector<uint8_t> pattern_bytes(size_t n, int seed) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i)
    b[i] = static_cast<uint8_t>(i * 131 + static_cast<size_t>(seed) * 7 + 1);
  return b;
}

// Expects `fn` to throw an Error whose one-line message contains every needle.
template <typename Fn>
void expect_error(Fn fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "wanted '" << n << "' in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

formats::GgufValue nested_array() {
  // array of arrays of i16, second one empty, plus a third level: [[1,-2],[],[[3]]] is not
  // homogeneous, so the third level lives in its own key below.
  formats::GgufArray outer{formats::GgufType::array, {}};
  outer.items.push_back(formats::gguf_array<int16_t>(formats::GgufType::i16, {1, -2}));
  outer.items.push_back(formats::gguf_array<int16_t>(formats::GgufType::i16, {}));
  return formats::GgufValue(std::move(outer));
}

formats::GgufValue deep_array(int levels) {  // levels of arrays around one u8
  formats::GgufValue v = formats::gguf_array<uint8_t>(formats::GgufType::u8, {7});
  for (int i = 1; i < levels; ++i)
    v = formats::GgufValue(formats::GgufArray{formats::GgufType::array, {v}});
  return v;
}

std::vector<std::pair<std::string, formats::GgufValue>> all_metadata() {
  return {
      {"general.architecture", "llama"},
      {"t.u8", uint8_t{200}},
      {"t.i8", int8_t{-100}},
      {"t.u16", uint16_t{60000}},
      {"t.i16", int16_t{-30000}},
      {"t.u32", uint32_t{4000000000u}},
      {"t.i32", int32_t{-2000000000}},
      {"t.f32", 1.25e-7f},
      {"t.bool_true", true},
      {"t.bool_false", false},
      {"t.empty_string", ""},
      {"t.u64", uint64_t{0xfedcba9876543210ull}},
      {"t.i64", int64_t{std::numeric_limits<int64_t>::min()}},
      {"t.f64", -3.141592653589793},
      {"t.arr_u32", formats::gguf_array<uint32_t>(formats::GgufType::u32, {1, 2, 0xffffffffu})},
      {"t.arr_f32", formats::gguf_array<float>(formats::GgufType::f32, {0.5f, -1.0f})},
      {"t.arr_str",
       formats::gguf_array<std::string>(formats::GgufType::string, {"<s>", "", "héllo", "a\nb"})},
      {"t.arr_empty", formats::gguf_array<uint8_t>(formats::GgufType::u8, {})},
      {"t.arr_nested", nested_array()},
      {"t.arr_deep4", deep_array(4)},
  };
}

struct TensorSpec {
  std::string name;
  formats::GgmlType type;
  Shape shape;  // torch order
  std::vector<uint8_t> bytes;
};

std::vector<TensorSpec> all_tensors() {
  std::vector<TensorSpec> ts;
  auto add = [&](const std::string& name, formats::GgmlType type, Shape shape) {
    const formats::GgmlTypeInfo* info = formats::ggml_type_info(static_cast<uint32_t>(type));
    const size_t bytes = static_cast<size_t>(shape.numel() / info->block_elems * info->block_bytes);
    ts.push_back({name, type, shape, pattern_bytes(bytes, static_cast<int>(ts.size()))});
  };
  // Odd sizes so that every tensor but the last needs padding to the next aligned offset.
  add("tok_embd.weight", formats::GgmlType::f32, {3, 5});
  add("norm.weight", formats::GgmlType::f16, {7});
  add("blk.0.attn_q.weight", formats::GgmlType::bf16, {2, 3, 5});
  add("blk.0.ffn_up.weight", formats::GgmlType::q8_0, {3, 64});
  add("blk.0.ffn_down.weight", formats::GgmlType::q4_0, {5, 32});
  add("blk.0.ffn_gate.weight", formats::GgmlType::q4_1, {1, 2, 3, 32});
  add("blk.0.q4k", formats::GgmlType::q4_k, {3, 256});
  add("blk.0.q6k", formats::GgmlType::q6_k, {1, 256});
  return ts;
}

formats::GgufWriter make_writer(const std::vector<TensorSpec>& ts, uint32_t alignment) {
  formats::GgufWriter w;
  for (const auto& [k, v] : all_metadata()) w.set(k, v);
  if (alignment != 32) w.set_alignment(alignment);
  for (const auto& t : ts) w.add_tensor(t.name, t.type, t.shape, t.bytes.data());
  return w;
}

class GgufRoundTrip : public ::testing::TestWithParam<uint32_t> {};

TEST_P(GgufRoundTrip, LosslessAndAligned) {
  const uint32_t alignment = GetParam();
  const std::vector<TensorSpec> ts = all_tensors();
  const formats::GgufWriter w = make_writer(ts, alignment);
  const std::string path = temp_path(cat("roundtrip", alignment));
  w.write(path);
  // write() streams; serialize() builds in memory: both must give the same bytes.
  EXPECT_EQ(read_binary_file(path), w.serialize());

  // Both ways of opening: mapped, and read into a page-aligned buffer.
  for (bool mmap : {true, false}) {
    SCOPED_TRACE(mmap ? "mmap" : "read");
    formats::GgufOptions opts;
    opts.mmap = mmap;
    const formats::GgufFile f(path, opts);
    EXPECT_EQ(f.version(), 3u);
    EXPECT_EQ(f.alignment(), alignment);

    // Metadata identical and in order (general.alignment appended when not the default).
    auto want = all_metadata();
    if (alignment != 32) want.emplace_back("general.alignment", alignment);
    ASSERT_EQ(f.metadata().size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(f.metadata()[i].first, want[i].first);
      EXPECT_TRUE(f.metadata()[i].second == want[i].second) << want[i].first;
      EXPECT_EQ(f.metadata()[i].second.type(), want[i].second.type()) << want[i].first;
    }

    // Tensors: names, ggml-order dims, torch-order shape, bytes identical, aligned.
    ASSERT_EQ(f.tensors().size(), ts.size());
    EXPECT_EQ(f.data_section_offset() % alignment, 0u);
    for (size_t i = 0; i < ts.size(); ++i) {
      const formats::GgufTensorInfo& t = f.tensors()[i];
      EXPECT_EQ(t.name, ts[i].name);
      EXPECT_EQ(t.ggml_type, ts[i].type);
      EXPECT_EQ(t.shape(), ts[i].shape);
      EXPECT_EQ(t.dims.front(), ts[i].shape.dims.back()) << "ne0 must be the row length";
      EXPECT_EQ(t.n_elements, ts[i].shape.numel());
      ASSERT_EQ(t.bytes, static_cast<int64_t>(ts[i].bytes.size()));
      EXPECT_EQ(std::memcmp(t.data, ts[i].bytes.data(), ts[i].bytes.size()), 0) << t.name;
      EXPECT_EQ(t.offset % alignment, 0u) << t.name;
      // Both buffers start on a page boundary, so file alignment is pointer alignment.
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % alignment, 0u) << t.name;
      EXPECT_EQ(&f.at(t.name), &t);
    }
    EXPECT_EQ(f.find("missing"), nullptr);
    expect_error([&] { f.at("missing"); }, {path, "tensor 'missing'"});
  }
  std::remove(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(Alignments, GgufRoundTrip, ::testing::Values(32u, 64u));

TEST(Gguf, TypedGetters) {
  formats::GgufWriter w;
  for (const auto& [k, v] : all_metadata()) w.set(k, v);
  const formats::GgufFile f = formats::GgufFile::from_memory(w.serialize(), "mem.gguf");
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_u32("t.u32"), 4000000000u);
  EXPECT_EQ(f.get_i32("t.i32"), -2000000000);
  EXPECT_EQ(f.get_u64("t.u64"), 0xfedcba9876543210ull);
  EXPECT_EQ(f.get_f32("t.f32"), 1.25e-7f);
  EXPECT_TRUE(f.get_bool("t.bool_true"));
  EXPECT_FALSE(f.get_bool("t.bool_false"));
  EXPECT_EQ(f.get_int("t.i8"), -100);
  EXPECT_EQ(f.get_int("t.u16"), 60000);
  EXPECT_EQ(f.get_int("t.i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f.get_string_array("t.arr_str"),
            (std::vector<std::string>{"<s>", "", "héllo", "a\nb"}));
  EXPECT_EQ(f.get_array("t.arr_nested").items.size(), 2u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_TRUE(f.has("t.f64"));
  EXPECT_FALSE(f.has("nope"));
  expect_error([&] { f.get_u32("t.i32"); }, {"mem.gguf", "key 't.i32'", "expected u32", "i32"});
  expect_error([&] { f.get_string("nope"); }, {"mem.gguf", "key 'nope'", "missing"});
  expect_error([&] { f.get_int("t.u64"); }, {"key 't.u64'", "does not fit"});
  expect_error([&] { f.get_int("t.f32"); }, {"key 't.f32'", "integer"});
  expect_error([&] { f.get_string_array("t.arr_u32"); }, {"key 't.arr_u32'", "string"});
}

TEST(Gguf, NoTensorsAndVersion2) {
  formats::GgufWriter w;
  w.set("a", uint8_t{1});
  std::vector<uint8_t> bytes = w.serialize();
  EXPECT_EQ(formats::GgufFile::from_memory(bytes, "v3").tensors().size(), 0u);
  bytes[4] = 2;  // v2 has the v3 layout (64-bit counts)
  EXPECT_EQ(formats::GgufFile::from_memory(bytes, "v2").version(), 2u);
}

TEST(Gguf, WriterRejectsBadInput) {
  const float x[64] = {};
  formats::GgufWriter w;
  w.add_tensor("a", DType::f32, {2, 3}, x);
  expect_error([&] { w.add_tensor("a", DType::f32, {1}, x); }, {"duplicate", "tensor 'a'"});
  expect_error([&] { w.add_tensor("b", DType::f32, {1, 1, 1, 1, 1}, x); }, {"rank 5"});
  expect_error([&] { w.add_tensor("c", DType::f32, {2, 0}, x); }, {"bad shape", "tensor 'c'"});
  expect_error(
      [&] {
        w.add_tensor("d", DType::q8_0, {32, 2}, x);
      },
      {"row length 2", "Q8_0", "tensor 'd'"});
  expect_error([&] { w.add_tensor("e", DType::i32, {2}, x); }, {"i32"});
  expect_error([&] { w.add_tensor("f", DType::f32, {2}, nullptr); }, {"null data"});
  expect_error([&] { w.set_alignment(3); }, {"power of two"});
  expect_error([&] { w.set_alignment(0); }, {"power of two"});
  expect_error([&] { w.set("general.alignment", uint64_t{32}); }, {"must be u32"});
  expect_error([&] { w.set("", uint8_t{1}); }, {"empty"});
  formats::GgufArray mixed{formats::GgufType::u8,
                           {formats::GgufValue(uint8_t{1}), formats::GgufValue(int8_t{1})}};
  expect_error([&] { w.set("m", formats::GgufValue(mixed)); },
               {"key 'm'", "array of u8 holds a i8"});
  expect_error([&] { w.set("deep", deep_array(5)); }, {"key 'deep'", "nested"});
  // Replacing a key keeps its position and does not duplicate it.
  w.set("k1", uint8_t{1});
  w.set("k2", uint8_t{2});
  w.set("k1", "one");
  const formats::GgufFile f = formats::GgufFile::from_memory(w.serialize(), "mem");
  ASSERT_EQ(f.metadata().size(), 2u);
  EXPECT_EQ(f.metadata()[0].first, "k1");
  EXPECT_EQ(f.get_string("k1"), "one");
}

// For types with a DType the conversion must equal core's to_f32 on the same bytes.
TEST(Gguf, TensorToF32MatchesCore) {
  std::vector<float> src(2 * 64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = std::sin(0.37f * static_cast<float>(i)) * 3;
  formats::GgufWriter w;
  std::vector<std::vector<uint8_t>> bufs;
  const DType dts[] = {DType::f32,  DType::f16,  DType::bf16, DType::q8_0,
                       DType::q4_0, DType::q4_1, DType::q5_0, DType::q5_1};
  for (DType dt : dts) {
    bufs.emplace_back(static_cast<size_t>(dtype_bytes(dt, 128)));
    from_f32(dt, src.data(), bufs.back().data(), 128);
    w.add_tensor(std::string(dtype_name(dt)), dt, {2, 64}, bufs.back().data());
  }
  const formats::GgufFile f = formats::GgufFile::from_memory(w.serialize(), "mem");
  for (size_t i = 0; i < std::size(dts); ++i) {
    const formats::GgufTensorInfo& t = f.at(std::string(dtype_name(dts[i])));
    ASSERT_EQ(t.dtype, dts[i]);
    std::vector<float> got(128), want(128);
    formats::gguf_tensor_to_f32(t, got.data());
    to_f32(dts[i], bufs[i].data(), want.data(), 128);
    EXPECT_EQ(got, want) << t.name;
  }
}

// A Q4_K block built from chosen scales, mins and quants (packed here from the format's
// description) must dequantize to d*sc*q - dmin*m, computed in the same f32 operation order.
TEST(Gguf, Q4KFromPackedFields) {
  BlockQ4K b{};
  b.d = f32_to_f16(0.0625f);
  b.dmin = f32_to_f16(0.125f);
  int sc[8], mn[8], q[256];
  for (int j = 0; j < 8; ++j) {
    sc[j] = (j * 23 + 5) % 64;
    mn[j] = (j * 41 + 60) % 64;
  }
  for (int j = 0; j < 4; ++j) {
    b.scales[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    b.scales[j + 4] = static_cast<uint8_t>((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
    b.scales[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
  for (int i = 0; i < 256; ++i) q[i] = (i * 7 + i / 32) % 16;
  for (int i = 0; i < 256; ++i) {
    const int chunk = i / 64, r = i % 64;
    uint8_t& byte = b.qs[chunk * 32 + r % 32];
    byte = static_cast<uint8_t>(r < 32 ? (byte & 0xf0) | q[i] : (byte & 0x0f) | (q[i] << 4));
  }
  float y[256];
  formats::dequantize_q4_k(&b, y, 256);
  for (int i = 0; i < 256; ++i) {
    const int j = i / 32;
    const float want = 0.0625f * static_cast<float>(sc[j]) * static_cast<float>(q[i]) -
                       0.125f * static_cast<float>(mn[j]);
    ASSERT_EQ(y[i], want) << i;
  }
}

TEST(Gguf, Q6KFromPackedFields) {
  BlockQ6K b{};
  b.d = f32_to_f16(0.5f);
  for (int s = 0; s < 16; ++s) b.scales[s] = static_cast<int8_t>(s * 9 - 70);
  int q[256];
  for (int i = 0; i < 256; ++i) q[i] = (i * 29 + 3) % 64;
  // Element i: half h = i / 128, within it r = (i % 128) / 32 and l = i % 32.
  for (int i = 0; i < 256; ++i) {
    const int h = i / 128, r = (i % 128) / 32, l = i % 32;
    uint8_t& lo = b.ql[64 * h + l + 32 * (r & 1)];
    lo = static_cast<uint8_t>(r < 2 ? (lo & 0xf0) | (q[i] & 15) : (lo & 0x0f) | ((q[i] & 15) << 4));
    b.qh[32 * h + l] |= static_cast<uint8_t>((q[i] >> 4) << (2 * r));
  }
  float y[256];
  formats::dequantize_q6_k(&b, y, 256);
  for (int i = 0; i < 256; ++i) {
    const float want = 0.5f * static_cast<float>(b.scales[i / 16]) * static_cast<float>(q[i] - 32);
    ASSERT_EQ(y[i], want) << i;
  }
}

// Golden values produced once by scripts/gen_gguf_kquant_golden.py with gguf-py 0.19
// (gguf.quants.dequantize) from the same deterministic bytes as below, two blocks per type. gguf-py
// computes in f32 with another operation order, so each value may differ by a few f32 roundings of
// the largest term: |err| <= 4 eps (|d| 63 15 + |dmin| 63) for Q4_K and 4 eps |d| 128 32 for Q6_K,
// per block.
std::vector<uint8_t> golden_bytes(size_t n, int seed) {
  std::vector<uint8_t> b(n);
  for (size_t i = 0; i < n; ++i)
    b[i] = static_cast<uint8_t>((i * 37 + static_cast<size_t>(seed) * 11 + (i >> 3) * 5) & 0xff);
  return b;
}

struct Golden {
  int index;
  double value;
};

void check_golden(const std::vector<float>& y, const double* bound, const Golden* g, size_t n,
                  double sum, double abs_sum) {
  double s = 0, as = 0;
  for (float v : y) {
    s += v;
    as += std::fabs(v);
  }
  // Printed to 9 significant digits: add 1e-8 relative for the decimal rounding.
  for (size_t i = 0; i < n; ++i)
    EXPECT_NEAR(y[static_cast<size_t>(g[i].index)], g[i].value,
                bound[g[i].index / 256] + 1e-8 * std::fabs(g[i].value))
        << g[i].index;
  const double sum_tol = 256 * (bound[0] + bound[1]);
  EXPECT_NEAR(s, sum, sum_tol);
  EXPECT_NEAR(as, abs_sum, sum_tol);
}

TEST(Gguf, Q4KMatchesGgufPy) {
  std::vector<uint8_t> bytes;
  const float d[2] = {0.0125f, -0.5f}, dmin[2] = {0.003f, 0.25f};
  double bound[2];
  const double eps = std::numeric_limits<float>::epsilon();
  for (int b = 0; b < 2; ++b) {
    std::vector<uint8_t> blk = golden_bytes(144, b + 1);
    const uint16_t hd = f32_to_f16(d[b]), hm = f32_to_f16(dmin[b]);
    std::memcpy(blk.data(), &hd, 2);
    std::memcpy(blk.data() + 2, &hm, 2);
    bytes.insert(bytes.end(), blk.begin(), blk.end());
    bound[b] = 4 * eps * (std::fabs(f16_to_f32(hd)) * 63 * 15 + std::fabs(f16_to_f32(hm)) * 63);
  }
  std::vector<float> y(512);
  formats::dequantize_q4_k(reinterpret_cast<const BlockQ4K*>(bytes.data()), y.data(), 512);
  const Golden g[] = {{0, 1.76901245},   {1, 3.70603943},     {17, 1.38160706}, {31, 5.64306641},
                      {32, 0.212919235}, {63, 0.612821579},   {64, 4.60537338}, {100, 1.63256264},
                      {127, 1.63256264}, {128, 7.11225128},   {150, 2.7133255}, {191, 2.96874428},
                      {200, 9.34868431}, {255, -0.105009079}, {256, -0.75},     {300, -32.5},
                      {383, -137.5},     {400, -46.25},       {511, -12}};
  check_golden(y, bound, g, std::size(g), -35503.56118774414, 36953.64115524292);
}

TEST(Gguf, Q6KMatchesGgufPy) {
  std::vector<uint8_t> bytes;
  const float d[2] = {0.02f, -0.0078125f};
  double bound[2];
  const double eps = std::numeric_limits<float>::epsilon();
  for (int b = 0; b < 2; ++b) {
    std::vector<uint8_t> blk = golden_bytes(210, b + 3);
    const uint16_t hd = f32_to_f16(d[b]);
    std::memcpy(blk.data() + 208, &hd, 2);
    bytes.insert(bytes.end(), blk.begin(), blk.end());
    bound[b] = 4 * eps * std::fabs(f16_to_f32(hd)) * 128 * 32;
  }
  std::vector<float> y(512);
  formats::dequantize_q6_k(reinterpret_cast<const BlockQ6K*>(bytes.data()), y.data(), 512);
  const Golden g[] = {{0, -26.7057037},   {1, 10.6822815},   {17, -80.6572266}, {31, 68.0545349},
                      {32, 50.2307281},   {63, -16.8035889}, {64, -6.84146118}, {100, 6.60140991},
                      {127, -20.2443237}, {128, 17.0836487}, {150, 25.5054474}, {191, -5.06108093},
                      {200, -2.60055542}, {255, 47.6101685}, {256, 15.625},     {300, 10.890625},
                      {383, -4.828125},   {400, 8.09375},    {511, -16.03125}};
  check_golden(y, bound, g, std::size(g), 82.88427734375, 7977.476593017578);
}

TEST(Gguf, Q5KMatchesGgufPy) {
  std::vector<uint8_t> bytes;
  const float d[2] = {0.0125f, -0.5f}, dmin[2] = {0.003f, 0.25f};
  double bound[2];
  const double eps = std::numeric_limits<float>::epsilon();
  for (int b = 0; b < 2; ++b) {
    std::vector<uint8_t> blk = golden_bytes(176, b + 5);
    const uint16_t hd = f32_to_f16(d[b]), hm = f32_to_f16(dmin[b]);
    std::memcpy(blk.data(), &hd, 2);
    std::memcpy(blk.data() + 2, &hm, 2);
    bytes.insert(bytes.end(), blk.begin(), blk.end());
    bound[b] = 4 * eps * (std::fabs(f16_to_f32(hd)) * 63 * 31 + std::fabs(f16_to_f32(hm)) * 63);
  }
  std::vector<float> y(512);
  to_f32(DType::q5_k, bytes.data(), y.data(), 512);
  const Golden g[] = {{0, 2.77878571},    {1, 1.26665497},   {17, 0.441856384}, {31, 4.15345001},
                      {32, 2.37241173},   {63, 16.7688961},  {64, 2.22391129},  {100, 5.74157906},
                      {127, 17.338747},   {128, 20.2020359}, {150, 3.40613747}, {191, 2.18793297},
                      {200, 0.241905212}, {255, 1.06268692}, {256, -11.75},     {300, -34.5},
                      {383, -27.5},       {400, -463},       {511, -148.75}};
  check_golden(y, bound, g, std::size(g), -63239.37484741211, 66497.33659362793);
}

// Q2_K / Q3_K: two blocks each with the super-block scales set (Q2_K d, dmin at 80; Q3_K d at
// 108), the other bytes golden_bytes.
std::vector<float> low_k_golden_blocks(DType t, double* bound) {
  const bool q2 = t == DType::q2_k;
  const size_t size = q2 ? sizeof(BlockQ2K) : sizeof(BlockQ3K);
  const float d[2] = {q2 ? 0.0125f : 0.02f, q2 ? -0.5f : -0.0078125f}, dmin[2] = {0.003f, 0.25f};
  const double eps = std::numeric_limits<float>::epsilon();
  std::vector<uint8_t> bytes;
  for (int b = 0; b < 2; ++b) {
    std::vector<uint8_t> blk = golden_bytes(size, b + (q2 ? 11 : 13));
    const uint16_t hd = f32_to_f16(d[b]), hm = f32_to_f16(dmin[b]);
    std::memcpy(blk.data() + (q2 ? 80 : 108), &hd, 2);
    if (q2) std::memcpy(blk.data() + 82, &hm, 2);
    bytes.insert(bytes.end(), blk.begin(), blk.end());
    bound[b] = 4 * eps *
               (q2 ? std::fabs(f16_to_f32(hd)) * 15 * 3 + std::fabs(f16_to_f32(hm)) * 15
                   : std::fabs(f16_to_f32(hd)) * 32 * 4);
  }
  std::vector<float> y(512);
  to_f32(t, bytes.data(), y.data(), 512);
  return y;
}

TEST(Gguf, Q2KMatchesGgufPy) {
  double bound[2];
  const std::vector<float> y = low_k_golden_blocks(DType::q2_k, bound);
  const Golden g[] = {
      {0, 0.316415787},    {1, -0.0210018158},  {17, 0.322912216},  {31, 0.147954941},
      {32, -0.0360031128}, {63, 0.257923126},   {64, 0.162460327},  {100, 0.0724773407},
      {127, 0.128961563},  {128, 0.194942474},  {150, 0.376396179}, {191, -0.0030002594},
      {200, 0.365907669},  {255, -0.030002594}, {256, -6},          {300, -24},
      {383, -5.5},         {400, -3.25},        {511, -2.75}};
  check_golden(y, bound, g, std::size(g), -1832.1427001953125, 1899.8776473999023);
}

TEST(Gguf, Q3KMatchesGgufPy) {
  double bound[2];
  const std::vector<float> y = low_k_golden_blocks(DType::q3_k, bound);
  const Golden g[] = {{0, -1.26026917},
                      {1, 1.68035889},
                      {17, 0.640136719},
                      {31, -0.320068359},
                      {32, 0},
                      {63, -0.520111084},
                      {64, 0},
                      {100, 0.460098267},
                      {127, -0.120025635},
                      {128, 0.120025635},
                      {150, -0.580123901},
                      {191, 2.48052979},
                      {200, -0.760162354},
                      {255, 0.24005127},
                      {256, 0.34375},
                      {300, 0.375},
                      {383, -0.1796875},
                      {400, 0},
                      {511, -0.078125}};
  check_golden(y, bound, g, std::size(g), -15.822494506835938, 248.7788543701172);
}

// 16 q5_0 / q5_1 blocks: the first 8 with d = 0.0625 (m = -1.5), the last 8 with d = -0.013
// (m = 0.25); block b's bytes are golden_bytes(size, seed + b).
std::vector<float> q5_golden_blocks(DType t, int seed, double* bound) {
  const bool has_min = t == DType::q5_1;
  const size_t size = has_min ? sizeof(BlockQ5_1) : sizeof(BlockQ5_0);
  const double eps = std::numeric_limits<float>::epsilon();
  std::vector<uint8_t> bytes;
  for (int b = 0; b < 16; ++b) {
    std::vector<uint8_t> blk = golden_bytes(size, seed + b);
    const uint16_t hd = f32_to_f16(b < 8 ? 0.0625f : -0.013f),
                   hm = f32_to_f16(b < 8 ? -1.5f : 0.25f);
    std::memcpy(blk.data(), &hd, 2);
    if (has_min) std::memcpy(blk.data() + 2, &hm, 2);
    bytes.insert(bytes.end(), blk.begin(), blk.end());
    bound[b / 8] =
        4 * eps * (std::fabs(f16_to_f32(hd)) * 31 + (has_min ? std::fabs(f16_to_f32(hm)) : 0));
  }
  std::vector<float> y(512);
  to_f32(t, bytes.data(), y.data(), 512);
  return y;
}

TEST(Gguf, Q5_0MatchesGgufPy) {
  double bound[2];
  const std::vector<float> y = q5_golden_blocks(DType::q5_0, 7, bound);
  const Golden g[] = {{0, 0.6875},
                      {1, 0},
                      {17, -0.6875},
                      {31, -0.625},
                      {32, -0.625},
                      {63, -0.625},
                      {64, 0.0625},
                      {100, 0.3125},
                      {127, -0.5},
                      {128, 0.4375},
                      {150, -0.8125},
                      {191, -0.4375},
                      {200, -0.375},
                      {255, -0.375},
                      {256, -0.0390014648},
                      {300, -0.0520019531},
                      {383, 0.0390014648},
                      {400, -0.130004883},
                      {511, -0}};
  check_golden(y, bound, g, std::size(g), -7.0189208984375, 149.5040283203125);
}

TEST(Gguf, Q5_1MatchesGgufPy) {
  double bound[2];
  const std::vector<float> y = q5_golden_blocks(DType::q5_1, 9, bound);
  const Golden g[] = {{0, -0.5},
                      {1, -0.1875},
                      {17, -0.8125},
                      {31, -0.75},
                      {32, -0.8125},
                      {63, -0.75},
                      {64, -0.125},
                      {100, -0.1875},
                      {127, 0.375},
                      {128, 0.25},
                      {150, 0.0625},
                      {191, 0.4375},
                      {200, -0.5625},
                      {255, -0.5},
                      {256, -0.0620117188},
                      {300, -0.0100097656},
                      {383, 0.00299072266},
                      {400, 0.0289916992},
                      {511, 0.17199707}};
  check_golden(y, bound, g, std::size(g), -132.36248779296875, 191.40887451171875);
}

// gguf_tensor_to_f32 reaches the k-quant dequantizers through the file's tensor table.
TEST(Gguf, TensorToF32KQuants) {
  const std::vector<uint8_t> q4 = golden_bytes(144, 1), q6 = golden_bytes(210, 3);
  formats::GgufWriter w;
  w.add_tensor("q4", formats::GgmlType::q4_k, {256}, q4.data());
  w.add_tensor("q6", formats::GgmlType::q6_k, {256}, q6.data());
  const formats::GgufFile f = formats::GgufFile::from_memory(w.serialize(), "mem");
  std::vector<float> got(256), want(256);
  formats::gguf_tensor_to_f32(f.at("q4"), got.data());
  formats::dequantize_q4_k(reinterpret_cast<const BlockQ4K*>(q4.data()), want.data(), 256);
  EXPECT_EQ(got, want);
  formats::gguf_tensor_to_f32(f.at("q6"), got.data());
  formats::dequantize_q6_k(reinterpret_cast<const BlockQ6K*>(q6.data()), want.data(), 256);
  EXPECT_EQ(got, want);
  EXPECT_EQ(f.at("q4").dtype, DType::q4_k);
  EXPECT_EQ(f.at("q6").type_name, "Q6_K");
}

}  // namespace
}  // namespace tessera::formats
