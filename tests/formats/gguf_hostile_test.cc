// GGUF reader vs hostile files: truncation at every byte, byte flips, and one hand-built
// mutation per validation rule; each must throw a one-line Error naming the file and field.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "formats/gguf.h"

namespace tessera::formats {
namespace {

constexpr uint32_t kMagic = 0x46554747;
constexpr uint64_t kHuge = uint64_t{1} << 60;

// Little-endian byte builder for hand-made files.
struct Raw {
  std::vector<uint8_t> b;
  template <typename T>
  Raw& put(T x) {
    const size_t n = b.size();
    b.resize(n + sizeof(T));
    std::memcpy(b.data() + n, &x, sizeof(T));
    return *this;
  }
  Raw& str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
};

struct Kv {
  std::string key;
  uint32_t type;
  std::vector<uint8_t> value;  // encoded value bytes
};
struct Ti {
  std::string name;
  std::vector<uint64_t> dims;
  uint32_t type;
  uint64_t offset;
};
// A whole file; each test changes one field of the valid baseline.
struct Spec {
  uint32_t magic = kMagic;
  uint32_t version = 3;
  std::optional<uint64_t> n_tensors, n_kv;  // override the true counts
  std::vector<Kv> kv;
  std::vector<Ti> tensors;
  uint64_t pad_to = 32;   // padding after the tensor infos
  size_t data_bytes = 0;  // bytes of tensor data after the padding
};

std::vector<uint8_t> u32v(uint32_t x) {
  return Raw().put(x).b;
}
std::vector<uint8_t> strv(const std::string& s) {
  return Raw().str(s).b;
}
std::vector<uint8_t> arrv(uint32_t elem_type, uint64_t count, const std::vector<uint8_t>& items) {
  Raw r;
  r.put(elem_type).put(count);
  r.b.insert(r.b.end(), items.begin(), items.end());
  return r.b;
}

Spec baseline() {
  Spec s;
  s.kv.push_back({"general.architecture", 8, strv("llama")});
  s.kv.push_back({"general.alignment", 4, u32v(32)});
  s.kv.push_back({"tokenizer.ggml.scores", 9, arrv(6, 2, Raw().put(0.5f).put(-1.0f).b)});
  s.tensors.push_back({"a", {5, 3}, 0, 0});    // F32, 60 bytes at 0
  s.tensors.push_back({"b", {32, 2}, 8, 64});  // Q8_0, 2 blocks = 68 bytes at 64
  s.data_bytes = 64 + 68;
  return s;
}

std::vector<uint8_t> build(const Spec& s) {
  Raw r;
  r.put(s.magic).put(s.version);
  r.put<uint64_t>(s.n_tensors.value_or(s.tensors.size()));
  r.put<uint64_t>(s.n_kv.value_or(s.kv.size()));
  for (const Kv& kv : s.kv) {
    r.str(kv.key).put(kv.type);
    r.b.insert(r.b.end(), kv.value.begin(), kv.value.end());
  }
  for (const Ti& t : s.tensors) {
    r.str(t.name).put(static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) r.put(d);
    r.put(t.type).put(t.offset);
  }
  r.b.resize((r.b.size() + s.pad_to - 1) / s.pad_to * s.pad_to, 0);
  r.b.resize(r.b.size() + s.data_bytes, 0x5a);
  return r.b;
}

std::string expect_rejected(const std::vector<uint8_t>& bytes,
                            const std::vector<std::string>& needles) {
  const std::string name = "hostile.gguf";
  try {
    formats::GgufFile f = formats::GgufFile::from_memory(bytes, name);
    ADD_FAILURE() << "accepted hostile file";
    return "";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("[gguf] " + name + ": ", 0), 0u) << msg;
    for (const auto& n : needles)
      EXPECT_NE(msg.find(n), std::string::npos) << "wanted '" << n << "' in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "message must be one line: " << msg;
    return msg;
  }
}

TEST(GgufHostile, BaselineIsValid) {
  const formats::GgufFile f = formats::GgufFile::from_memory(build(baseline()), "base");
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.at("b").bytes, 68);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
}

// A valid file truncated anywhere must be rejected: the writer puts the last tensor's last byte
// at the end of the file, so every strict prefix loses something.
TEST(GgufHostile, EveryTruncationThrows) {
  formats::GgufWriter w;
  w.set("general.name", "tiny");
  w.set("tokens", formats::gguf_array<std::string>(formats::GgufType::string, {"a", "bc", ""}));
  w.set("nested", formats::GgufValue(formats::GgufArray{
                      formats::GgufType::array,
                      {formats::gguf_array<uint64_t>(formats::GgufType::u64, {1, 2})}}));
  w.set("f", 2.5);
  const std::vector<float> x(40, 1.0f);
  std::vector<uint8_t> q(34 * 2, 1);
  w.add_tensor("w", DType::f32, {5, 8}, x.data());
  w.add_tensor("q", formats::GgmlType::q8_0, {2, 32}, q.data());
  const std::vector<uint8_t> full = w.serialize();
  ASSERT_NO_THROW(formats::GgufFile::from_memory(full, "full"));
  for (size_t n = 0; n < full.size(); ++n) {
    // Exact-size copies so that AddressSanitizer sees any read past the end.
    std::vector<uint8_t> cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_THROW(formats::GgufFile::from_memory(std::move(cut), "cut"), Error) << "prefix " << n;
  }
  // The same through a real mapped file, at a few points.
  const std::string path = cat(::testing::TempDir(), "/gguf_hostile_", ::getpid(), ".gguf");
  for (size_t n : {size_t{0}, size_t{3}, size_t{24}, full.size() / 2, full.size() - 1}) {
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(full.data()), static_cast<std::streamsize>(n));
    try {
      formats::GgufFile f(path);
      ADD_FAILURE() << "accepted prefix " << n;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
  std::remove(path.c_str());
}

// Every byte of the header set to a few values: the reader may accept or reject, never crash
// or read out of bounds (this is what the sanitizer build checks).
TEST(GgufHostile, ByteFlipsNeverCrash) {
  const std::vector<uint8_t> base = build(baseline());
  const formats::GgufFile ok = formats::GgufFile::from_memory(base, "ok");
  const size_t header = static_cast<size_t>(ok.data_section_offset());
  int rejected = 0;
  for (size_t i = 0; i < header; ++i) {
    for (uint8_t v : {uint8_t{0x00}, uint8_t{0x01}, uint8_t{0x7f}, uint8_t{0xff}}) {
      std::vector<uint8_t> m = base;
      if (m[i] == v) continue;
      m[i] = v;
      try {
        formats::GgufFile f = formats::GgufFile::from_memory(std::move(m), "flip");
      } catch (const Error&) {
        ++rejected;
      }
    }
  }
  EXPECT_GT(rejected, 0);
}

TEST(GgufHostile, Header) {
  expect_rejected({}, {"end of file", "magic"});
  Spec s = baseline();
  s.magic = 0x46554746;
  expect_rejected(build(s), {"bad magic"});
  for (uint32_t v : {1u, 4u, 0x03000000u}) {
    s = baseline();
    s.version = v;
    expect_rejected(build(s), {"unsupported version", std::to_string(v)});
  }
  s = baseline();
  s.n_kv = kHuge;
  expect_rejected(build(s), {"metadata_kv_count"});
  s = baseline();
  s.n_tensors = kHuge;
  expect_rejected(build(s), {"tensor_count"});
  s = baseline();
  s.n_tensors = 3;  // one more info than present: reads into the padding/data and fails there
  expect_rejected(build(s), {});
}

TEST(GgufHostile, Metadata) {
  Spec s = baseline();
  s.kv[0].value = Raw().put<uint64_t>(kHuge).b;  // string length 2^60, no bytes follow
  expect_rejected(build(s), {"length", "key 'general.architecture'"});
  s = baseline();
  s.kv[2].value = arrv(6, kHuge, {});  // 2^60 floats: must fail before allocating
  expect_rejected(build(s), {"array count", "key 'tokenizer.ggml.scores'"});
  s = baseline();
  s.kv[2].value = arrv(8, kHuge, {});  // 2^60 strings
  expect_rejected(build(s), {"array count"});
  s = baseline();
  s.kv[0].type = 13;
  expect_rejected(build(s), {"unknown value type 13", "key 'general.architecture'"});
  s = baseline();
  s.kv[2].value = arrv(99, 0, {});
  expect_rejected(build(s), {"unknown value type 99", "key 'tokenizer.ggml.scores'"});
  s = baseline();
  s.kv.push_back({"b", 7, {2}});
  expect_rejected(build(s), {"bool value 2", "key 'b'"});
  s = baseline();
  s.kv.push_back({"general.architecture", 4, u32v(1)});
  expect_rejected(build(s), {"duplicate key", "key 'general.architecture'"});
  s = baseline();
  s.kv.push_back({"", 4, u32v(1)});
  expect_rejected(build(s), {"empty key"});
  // Arrays nested 5 deep: [[[[[u8]]]]]; 4 deep is accepted.
  for (int levels : {4, 5}) {
    std::vector<uint8_t> v = arrv(0, 1, {7});
    for (int i = 1; i < levels; ++i) v = arrv(9, 1, v);
    s = baseline();
    s.kv.push_back({"deep", 9, v});
    if (levels == 4)
      EXPECT_NO_THROW(formats::GgufFile::from_memory(build(s), "deep4"));
    else
      expect_rejected(build(s), {"nested", "key 'deep'"});
  }
}

// Metadata memory is capped: 1000 u8 values cost 1000 GgufValues (tens of KB), over a 10 KB cap.
TEST(GgufHostile, MetadataMemoryCap) {
  Spec s = baseline();
  s.kv.push_back({"big", 9, arrv(0, 1000, std::vector<uint8_t>(1000, 1))});
  formats::GgufOptions small;
  small.max_metadata_bytes = 10000;
  EXPECT_NO_THROW(formats::GgufFile::from_memory(build(s), "default cap"));
  try {
    formats::GgufFile::from_memory(build(s), "capped", small);
    ADD_FAILURE() << "cap not enforced";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_metadata_bytes"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("key 'big'"), std::string::npos) << e.what();
  }
  // A long key string counts too.
  s = baseline();
  s.kv.push_back({std::string(20000, 'k'), 4, u32v(1)});
  EXPECT_THROW(formats::GgufFile::from_memory(build(s), "long key", small), Error);
}

TEST(GgufHostile, Alignment) {
  for (uint32_t a : {0u, 3u, 48u}) {
    Spec s = baseline();
    s.kv[1].value = u32v(a);
    expect_rejected(build(s), {"power of two", "key 'general.alignment'"});
  }
  Spec s = baseline();
  s.kv[1] = {"general.alignment", 10, Raw().put<uint64_t>(32).b};
  expect_rejected(build(s), {"must be u32", "key 'general.alignment'"});
  // Alignment 64: the data section must start at a multiple of 64, offsets likewise.
  s = baseline();
  s.kv[1].value = u32v(64);
  s.pad_to = 64;
  const formats::GgufFile f = formats::GgufFile::from_memory(build(s), "a64");
  EXPECT_EQ(f.data_section_offset() % 64, 0u);
  s.tensors[1].offset = 32;  // fine for 32, misaligned for 64 (and overlaps 'a' anyway)
  expect_rejected(build(s), {"not a multiple of the alignment 64", "tensor 'b'"});
}

TEST(GgufHostile, TensorInfos) {
  Spec s = baseline();
  s.tensors[0].dims = {};
  expect_rejected(build(s), {"n_dims 0", "tensor 'a'"});
  s.tensors[0].dims = {1, 1, 1, 1, 15};
  expect_rejected(build(s), {"n_dims 5", "tensor 'a'"});
  s = baseline();
  s.tensors[1].dims = {32, 0};
  expect_rejected(build(s), {"dim 1 is zero", "tensor 'b'"});
  s = baseline();
  s.tensors[0].dims = {uint64_t{1} << 32, uint64_t{1} << 32};  // 2^64 elements
  expect_rejected(build(s), {"overflows", "tensor 'a'"});
  s.tensors[0].dims = {uint64_t{1} << 63};
  expect_rejected(build(s), {"overflows", "tensor 'a'"});
  s.tensors[0].dims = {uint64_t{1} << 62};  // count fits, f32 bytes 2^64 do not
  expect_rejected(build(s), {"byte size overflows", "tensor 'a'"});
  s = baseline();
  s.tensors[1].dims = {16, 4};  // Q8_0 rows must be whole 32-element blocks
  expect_rejected(build(s), {"row length 16", "Q8_0", "tensor 'b'"});
  // Ids ggml retired (4, 5), types this reader does not take (Q8_K 15, IQ2_XXS 16, IQ4_NL 20),
  // and beyond.
  for (uint32_t t : {4u, 5u, 15u, 16u, 20u, 31u, 1000u}) {
    s = baseline();
    s.tensors[0].type = t;
    expect_rejected(build(s), {"unsupported ggml type " + std::to_string(t), "tensor 'a'"});
  }
  // The 5-bit and low-bit k-quant types are known, and their rows must be whole blocks too
  // (tensor 'a' has 5).
  for (const auto& [t, name] :
       {std::pair{6u, "Q5_0 block size 32"}, std::pair{7u, "Q5_1"},
        std::pair{13u, "Q5_K block size 256"}, std::pair{10u, "Q2_K"}, std::pair{11u, "Q3_K"}}) {
    s = baseline();
    s.tensors[0].type = t;
    expect_rejected(build(s), {"row length 5", name, "tensor 'a'"});
  }
  s = baseline();
  s.tensors[1].name = "a";
  expect_rejected(build(s), {"duplicate tensor name", "tensor 'a'"});
  s = baseline();
  s.tensors[0].name = std::string();
  expect_rejected(build(s), {"empty tensor name"});
  // One tensor info whose name claims 2^60 bytes.
  s = baseline();
  s.tensors.clear();
  s.n_tensors = 1;
  s.pad_to = 1;
  s.data_bytes = 0;
  std::vector<uint8_t> bytes = build(s);
  const std::vector<uint8_t> name_len = Raw().put<uint64_t>(kHuge).b;
  bytes.insert(bytes.end(), name_len.begin(), name_len.end());
  bytes.resize(bytes.size() + 64, 0);
  expect_rejected(bytes, {"tensor name length"});
}

TEST(GgufHostile, TensorRanges) {
  Spec s = baseline();
  s.tensors[1].offset = 48;  // not a multiple of 32
  expect_rejected(build(s), {"offset 48 is not a multiple of the alignment 32", "tensor 'b'"});
  s = baseline();
  s.tensors[1].offset = 96;  // 96 + 68 > 132 bytes of data
  expect_rejected(build(s), {"past end", "tensor 'b'"});
  s.tensors[1].offset = uint64_t{1} << 63;  // far past the end, and offset + bytes must not wrap
  expect_rejected(build(s), {"past end", "tensor 'b'"});
  s.tensors[1].offset = std::numeric_limits<uint64_t>::max() - 31;  // aligned, wraps if added
  expect_rejected(build(s), {"past end", "tensor 'b'"});
  s = baseline();
  s.data_bytes = 64 + 67;  // file one byte short
  expect_rejected(build(s), {"past end", "tensor 'b'"});
  s = baseline();
  s.tensors[0].dims = {32, 3};  // 384 bytes at 0 now overlap 'b' at 64
  s.data_bytes = 512;
  expect_rejected(build(s), {"overlaps tensor 'a'", "tensor 'b'"});
  s = baseline();
  s.tensors[1].offset = 0;  // same start
  s.data_bytes = 128;
  expect_rejected(build(s), {"overlaps"});
  s = baseline();
  s.pad_to = 1;        // no padding: the header end is not aligned; the data are read at the wrong
  s.data_bytes = 132;  // place and the last tensor runs past the end
  expect_rejected(build(s), {});
}

}  // namespace
}  // namespace tessera::formats
