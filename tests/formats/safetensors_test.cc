// safetensors writer/reader round trip and the reader's rejection of hostile files.
#include "formats/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"

namespace tessera::formats {
namespace {

std::string temp_path(const std::string& name) {
  return cat(::testing::TempDir(), "/st_", ::getpid(), "_", name, ".safetensors");
}

// Writes an 8-byte little-endian header length, the header text and `data_bytes` zero bytes.
std::string write_raw(const std::string& name, const std::string& header, size_t data_bytes,
                      uint64_t header_len_override = 0) {
  const std::string path = temp_path(name);
  std::ofstream f(path, std::ios::binary);
  const uint64_t n = header_len_override ? header_len_override : header.size();
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>(n >> (8 * i)));
  f << header;
  f << std::string(data_bytes, '\0');
  return path;
}

// Expects the reader to throw an Error whose message names the file and contains `needle`.
void expect_rejected(const std::string& path, const std::string& needle) {
  try {
    formats::SafetensorsReader r(path);
    ADD_FAILURE() << "accepted hostile file " << path;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << "wanted '" << needle << "' in: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "message must be one line: " << msg;
  }
  std::remove(path.c_str());
}

TEST(Safetensors, RoundTripAllDtypes) {
  const std::vector<float> a = {1.5f, -2.25f, 3.0f, 0.0f, 1e-3f, -7.0f};
  std::vector<uint16_t> b16(4), h16(3);
  const float b_vals[4] = {1.0f, -0.5f, 256.0f, 3.0f};
  const float h_vals[3] = {0.25f, -1.0f, 1000.0f};  // all exact in bf16 / f16
  for (int i = 0; i < 4; ++i) b16[static_cast<size_t>(i)] = f32_to_bf16(b_vals[i]);
  for (int i = 0; i < 3; ++i) h16[static_cast<size_t>(i)] = f32_to_f16(h_vals[i]);
  const std::vector<int32_t> ints = {7, -1, 1 << 30};

  formats::SafetensorsWriter w;
  w.add("z.a", DType::f32, {2, 3}, a.data());
  w.add("b", DType::bf16, {4}, b16.data());
  w.add("h", DType::f16, {1, 3}, h16.data());
  w.add("i", DType::i32, {3}, ints.data());
  w.add("empty", DType::f32, {0, 5}, nullptr);
  w.set_metadata("format", "pt");
  EXPECT_THROW(w.add("b", DType::f32, {1}, a.data()), Error);    // duplicate name
  EXPECT_THROW(w.add("q", DType::q8_0, {32}, a.data()), Error);  // no safetensors encoding
  const std::string path = temp_path("roundtrip");
  w.write(path);

  formats::SafetensorsReader r(path);
  EXPECT_EQ(r.entries().size(), 5u);
  EXPECT_EQ(r.metadata().at("format"), "pt");
  std::vector<float> out(6);
  r.read_f32("z.a", {2, 3}, out.data());
  EXPECT_EQ(out, a);
  r.read_f32("b", {4}, out.data());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out[static_cast<size_t>(i)], b_vals[i]);
  r.read_f32("h", {1, 3}, out.data());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out[static_cast<size_t>(i)], h_vals[i]);
  const formats::SafetensorsEntry& ie = r.at("i");
  EXPECT_EQ(ie.dtype, DType::i32);
  ASSERT_EQ(ie.bytes, 12);
  std::vector<int32_t> iout(3);
  std::memcpy(iout.data(), ie.data, 12);
  EXPECT_EQ(iout, ints);
  EXPECT_EQ(r.at("empty").bytes, 0);
  EXPECT_EQ(r.at("empty").shape, (Shape{0, 5}));
  // Shape mismatch and wrong-type reads name file and tensor.
  try {
    r.read_f32("z.a", {3, 2}, out.data());
    ADD_FAILURE() << "shape mismatch accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'z.a'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  EXPECT_THROW(r.read_f32("i", {3}, out.data()), Error);
  EXPECT_THROW(r.at("missing"), Error);
  std::remove(path.c_str());
}

TEST(Safetensors, HeaderPaddedToEightBytes) {
  const float x = 1.0f;
  for (int len = 1; len <= 9; ++len) {  // names of varying length shift the header size
    formats::SafetensorsWriter w;
    w.add(std::string(static_cast<size_t>(len), 'n'), DType::f32, {1}, &x);
    const std::string path = temp_path(cat("pad", len));
    w.write(path);
    std::ifstream f(path, std::ios::binary);
    uint8_t b[8];
    f.read(reinterpret_cast<char*>(b), 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | b[i];
    EXPECT_EQ((8 + n) % 8, 0u);
    formats::SafetensorsReader r(path);
    float y = 0;
    r.read_f32(std::string(static_cast<size_t>(len), 'n'), {1}, &y);
    EXPECT_EQ(y, 1.0f);
    std::remove(path.c_str());
  }
}

TEST(Safetensors, RejectsHostileFiles) {
  const std::string ok_entry = R"("t":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]})";
  // Sanity: the well-formed version of the file loads.
  {
    const std::string path = write_raw("valid", "{" + ok_entry + "}", 16);
    formats::SafetensorsReader r(path);
    EXPECT_EQ(r.at("t").bytes, 16);
    std::remove(path.c_str());
  }
  {  // truncated: fewer than 8 bytes
    const std::string path = temp_path("tiny");
    std::ofstream(path, std::ios::binary) << "abc";
    expect_rejected(path, "too short");
  }
  expect_rejected(write_raw("pastend", "{" + ok_entry + "}", 16, 1000), "past the end");
  expect_rejected(write_raw("absurd", "{}", 0, uint64_t{1} << 40), "exceeds the limit");
  expect_rejected(write_raw("badjson", "{\"t\": {", 0), "not valid JSON");
  expect_rejected(write_raw("notobj", "[1,2]", 0), "must be a JSON object");
  // Data section shorter than the tensors it declares (file truncated after the header).
  expect_rejected(write_raw("truncdata", "{" + ok_entry + "}", 8), "larger than the data section");
  expect_rejected(
      write_raw("offpast", R"({"t":{"dtype":"F32","shape":[2,2],"data_offsets":[0,64]}})", 16),
      "'t'");
  expect_rejected(write_raw("shapemismatch",
                            R"({"t":{"dtype":"F32","shape":[3,2],"data_offsets":[0,16]}})", 32),
                  "needs 24");
  expect_rejected(
      write_raw("reversed", R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 16),
      "reversed");
  expect_rejected(write_raw("overlap",
                            R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                            16),
                  "overlaps");
  expect_rejected(
      write_raw("dtype", R"({"t":{"dtype":"F8_E9","shape":[2],"data_offsets":[0,2]}})", 16),
      "unsupported dtype 'F8_E9'");
  expect_rejected(
      write_raw("negdim", R"({"t":{"dtype":"F32","shape":[-2,2],"data_offsets":[0,16]}})", 16),
      "shape");
  // Dims whose product overflows 64 bits must be caught, not wrapped to a small size.
  expect_rejected(
      write_raw("overflow",
                R"({"t":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,0]}})",
                16),
      "larger than the data section");
  expect_rejected(write_raw("types", R"({"t":{"dtype":5,"shape":[2],"data_offsets":[0,8]}})", 16),
                  "dtype");
  expect_rejected(
      write_raw("offtypes", R"({"t":{"dtype":"F32","shape":[2],"data_offsets":["0",8]}})", 16),
      "data_offsets");
  expect_rejected(write_raw("meta", R"({"__metadata__":{"k":1}})", 0), "__metadata__");
  expect_rejected(write_raw("entry", R"({"t":[1]})", 0), "'t'");
}

TEST(Safetensors, MissingFileNamesPath) {
  const std::string path = temp_path("does_not_exist");
  try {
    formats::SafetensorsReader r(path);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera::formats
