// Token shards (round trip, corrupt files), document splitting, and the loaders' determinism
// and saved positions.
#include "train/data.h"

#include <gtest/gtest.h>

#include "test_util/expect_error.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "core/file_io.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  const std::string d = ::testing::TempDir() + "tessera_data_test_" + name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<int32_t> iota_tokens(int64_t n, int64_t vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7) % vocab);
  return t;
}

using tessera::test::expect_error;

TEST(Shard, RoundTripU16AndU32) {
  const std::string d = fresh_dir("roundtrip");
  for (int64_t vocab : {300, 65535, 70000}) {
    const auto tokens = iota_tokens(1000, vocab);
    const std::string p = d + "/s.bin";
    write_shard(p, tokens, vocab);
    const int64_t width = vocab <= 65535 ? 2 : 4;
    EXPECT_EQ(static_cast<int64_t>(fs::file_size(p)), kShardHeaderBytes + 1000 * width);
    const Shard s = read_shard(p);
    EXPECT_EQ(s.vocab, vocab);
    EXPECT_EQ(s.tokens, tokens);
  }
}

TEST(Shard, WriteRejectsTokenOutsideVocab) {
  const std::string d = fresh_dir("badtok");
  expect_error([&] { write_shard(d + "/s.bin", {1, 2, 10}, 10); }, "token 10");
}

void patch(const std::string& path, size_t at, const std::string& bytes) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST(Shard, CorruptFilesNameFileAndField) {
  const std::string d = fresh_dir("corrupt");
  const std::string p = d + "/train_000.bin";
  const auto tokens = iota_tokens(100, 50);
  auto fresh = [&] { write_shard(p, tokens, 50); };

  fresh();
  fs::resize_file(p, fs::file_size(p) - 1);
  expect_error([&] { read_shard(p); }, "token count");
  fresh();
  fs::resize_file(p, 20);
  expect_error([&] { read_shard(p); }, "header");
  fresh();
  patch(p, 0, "XXXX");
  expect_error([&] { read_shard(p); }, "magic");
  fresh();
  patch(p, 4, std::string("\x09\0\0\0", 4));
  expect_error([&] { read_shard(p); }, "version");
  fresh();
  patch(p, 8, std::string("\x03\0\0\0", 4));
  expect_error([&] { read_shard(p); }, "token width");
  fresh();
  patch(p, kShardHeaderBytes + 10, std::string("\x01", 1));  // flip a token
  expect_error([&] { read_shard(p); }, "checksum");
  fresh();
  patch(p, 24, std::string("\x05\0\0\0\0\0\0\0", 8));  // vocab 5 < tokens present
  expect_error([&] { read_shard(p); }, "outside vocab");
  // Every message names the file.
  expect_error([&] { read_shard(p); }, p);
}

TEST(Data, SplitDocumentsOnPercentAndBlankLines) {
  const auto docs = split_documents("one\nline two\n%\nthree\n\n\nfour\n%\n%\n");
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0], "one\nline two");
  EXPECT_EQ(docs[1], "three");
  EXPECT_EQ(docs[2], "four");
  EXPECT_TRUE(split_documents("\n%\n\n").empty());
}

TEST(Data, LoadSplitErrors) {
  expect_error([] { load_split("/nonexistent/tessera_data", "train"); },
               "/nonexistent/tessera_data");
  const std::string d = fresh_dir("noshards");
  expect_error([&] { load_split(d, "train"); }, "no train_*.bin");
  write_shard(d + "/train_000.bin", iota_tokens(10, 20), 20);
  write_shard(d + "/train_001.bin", iota_tokens(5, 30), 30);
  const TokenData td = load_split(d, "train");
  EXPECT_EQ(td.tokens.size(), 15u);
  EXPECT_EQ(td.vocab, 30);
  expect_error([&] { BatchLoader(td, 15, 1); }, "fewer than one sequence");
}

TEST(BatchLoader, EpochVisitsEveryWindowOnceAndTargetsShift) {
  TokenData td;
  td.tokens = iota_tokens(1 + 8 * 10, 1000);  // exactly 10 windows of T=8
  td.vocab = 1000;
  BatchLoader l(td, 8, 42);
  ASSERT_EQ(l.num_windows(), 10);
  std::vector<int32_t> in(16), tg(16);
  std::set<int32_t> starts;
  for (int i = 0; i < 5; ++i) {
    l.next(2, in.data(), tg.data());
    for (int b = 0; b < 2; ++b) {
      starts.insert(in[static_cast<size_t>(b * 8)]);
      for (int t = 0; t < 8; ++t) {
        // In iota_tokens, token i is 7i mod 1000, so the successor of x is x + 7 (mod 1000).
        EXPECT_EQ(tg[static_cast<size_t>(b * 8 + t)],
                  (in[static_cast<size_t>(b * 8 + t)] + 7) % 1000);
      }
    }
  }
  EXPECT_EQ(starts.size(), 10u);
  EXPECT_EQ(l.position().epoch, 0);
  EXPECT_EQ(l.position().index, 10);
  l.next(1, in.data(), tg.data());
  EXPECT_EQ(l.position().epoch, 1);
}

TEST(BatchLoader, SameSeedSameStreamAndPositionRestores) {
  TokenData td;
  td.tokens = iota_tokens(2000, 500);
  td.vocab = 500;
  BatchLoader a(td, 16, 7), b(td, 16, 7), c(td, 16, 8);
  std::vector<int32_t> ia(48), ta(48), ib(48), tb(48);
  bool differs = false;
  for (int i = 0; i < 50; ++i) {  // crosses several epochs (124 windows, 3 per batch)
    a.next(3, ia.data(), ta.data());
    b.next(3, ib.data(), tb.data());
    ASSERT_EQ(ia, ib);
    c.next(3, ib.data(), tb.data());
    differs |= ia != ib;
  }
  EXPECT_TRUE(differs) << "a different seed must give a different order";

  // Save mid-epoch, keep going, restore into a fresh loader: the streams continue identically.
  for (int i = 0; i < 30; ++i) a.next(3, ia.data(), ta.data());
  const LoaderPosition pos = a.position();
  std::vector<std::vector<int32_t>> expect;
  for (int i = 0; i < 60; ++i) {
    a.next(3, ia.data(), ta.data());
    expect.push_back(ia);
  }
  BatchLoader r(td, 16, 999);
  r.set_position(pos);
  for (int i = 0; i < 60; ++i) {
    r.next(3, ib.data(), tb.data());
    ASSERT_EQ(ib, expect[static_cast<size_t>(i)]) << i;
  }
  LoaderPosition bad = pos;
  bad.index = r.num_windows() + 1;
  EXPECT_THROW(r.set_position(bad), Error);
}

TEST(ValLoader, FixedWindowsInOrder) {
  TokenData td;
  td.tokens = iota_tokens(1 + 4 * 3, 100);  // 3 windows of T=4
  td.vocab = 100;
  ValLoader v(td, 4);
  EXPECT_EQ(v.num_windows(), 3);
  std::vector<int32_t> in(8), tg(8);
  v.batch(1, 2, in.data(), tg.data());  // windows 2 and 0 (cycled)
  EXPECT_EQ(in[0], td.tokens[8]);
  EXPECT_EQ(in[4], td.tokens[0]);
  EXPECT_EQ(tg[3], td.tokens[12]);
}

}  // namespace
}  // namespace tessera::train
