// `prepare`: a corpus tokenized with a small BPE tokenizer becomes train/val shards whose tokens
// decode back to the documents, plus tokenizer.json and meta.json.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"
#include "tokenizer/tokenizer.h"
#include "train/data.h"

namespace tessera::train {
namespace {

namespace fs = std::filesystem;

TEST(Prepare, ShardsDecodeBackToDocuments) {
  const std::string d = ::testing::TempDir() + "tessera_prepare_test";
  fs::remove_all(d);
  fs::create_directories(d);
  std::string corpus;
  for (int i = 0; i < 40; ++i)
    corpus += "fortune number " + std::to_string(i) + " says hello\nworld\n%\n";
  write_file_atomic(d + "/corpus.txt", corpus);
  const auto tok = tokenizer::Tokenizer::train_bpe(corpus, 300);
  tok.save_json(d + "/tok.json");

  PrepareOptions o;
  o.tokenizer_path = d + "/tok.json";
  o.input_path = d + "/corpus.txt";
  o.out_dir = d + "/data";
  o.val_fraction = 0.25;
  o.min_tokens = 9;
  const PrepareStats st = prepare_data(o);
  EXPECT_EQ(st.documents, 40);
  EXPECT_EQ(st.vocab, tok.vocab_size());
  EXPECT_EQ(st.train_shards, 1);
  EXPECT_EQ(st.val_shards, 1);
  const TokenData tr = load_split(o.out_dir, "train"), va = load_split(o.out_dir, "val");
  EXPECT_EQ(static_cast<int64_t>(tr.tokens.size()), st.train_tokens);
  EXPECT_EQ(static_cast<int64_t>(va.tokens.size()), st.val_tokens);
  // val is the last ceil(25%) of the stream.
  const int64_t n = st.train_tokens + st.val_tokens;
  EXPECT_EQ(st.val_tokens, (n + 3) / 4);

  // Joined, the shards decode to the documents each followed by <|endoftext|>.
  std::vector<int32_t> all = tr.tokens;
  all.insert(all.end(), va.tokens.begin(), va.tokens.end());
  std::string expect;
  for (int i = 0; i < 40; ++i)
    expect += "fortune number " + std::to_string(i) + " says hello\nworld<|endoftext|>";
  EXPECT_EQ(tok.decode(all), expect);

  EXPECT_TRUE(file_exists(o.out_dir + "/tokenizer.json"));
  const auto meta = nlohmann::json::parse(read_text_file(o.out_dir + "/meta.json"));
  EXPECT_EQ(meta.at("documents").get<int64_t>(), 40);
  EXPECT_EQ(meta.at("vocab_size").get<int64_t>(), tok.vocab_size());

  // Too little text for one sequence in each split is an error naming the input.
  PrepareOptions big = o;
  big.min_tokens = n;
  EXPECT_THROW(prepare_data(big), Error);
  PrepareOptions bad = o;
  bad.val_fraction = 1.5;
  EXPECT_THROW(prepare_data(bad), Error);
}

}  // namespace
}  // namespace tessera::train
