// Our tokenizer against Hugging Face `tokenizers` on tricky strings (golden ids and pre-token
// pieces from scripts/gen_tokenizer_golden.py), and training determinism against the committed
// tokenizer.json.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/file_io.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"

namespace tessera::tokenizer {
namespace {

const std::string kDir = std::string(TESSERA_SOURCE_DIR) + "/tests/data/tokenizer/";

nlohmann::json golden() {
  return nlohmann::json::parse(read_text_file(kDir + "golden.json"));
}

void expect_matches_hf(const tokenizer::Tokenizer& tok, const nlohmann::json& g) {
  ASSERT_GE(g["cases"].size(), 40u);
  for (const auto& c : g["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const auto want = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text), want) << "text: " << testing::PrintToString(text);
    EXPECT_EQ(tok.decode(want), text);
  }
}

TEST(Golden, HuggingFaceLoadedOurJson) {
  const auto g = golden();
  // The generator only records this after HF's Tokenizer.from_file accepted our file.
  EXPECT_TRUE(g["hf_loaded_our_json"].get<bool>());
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::load_json(kDir + "tok512.json");
  EXPECT_EQ(g["hf_vocab_size"].get<int32_t>(), tok.vocab_size());
}

TEST(Golden, IdsMatchHuggingFace) {
  expect_matches_hf(tokenizer::Tokenizer::load_json(kDir + "tok512.json"), golden());
}

// The same tokenizer as serialized by HF (merges as ["a", "b"] pairs, its own field order).
TEST(Golden, HuggingFaceWrittenJsonLoads) {
  const tokenizer::Tokenizer ours = tokenizer::Tokenizer::load_json(kDir + "tok512.json");
  const tokenizer::Tokenizer theirs = tokenizer::Tokenizer::load_json(kDir + "tok512_hf.json");
  EXPECT_EQ(theirs.to_json_text(), ours.to_json_text());
  expect_matches_hf(theirs, golden());
}

TEST(Golden, PiecesMatchHuggingFacePreTokenizer) {
  const auto g = golden();  // kept alive: a range-for over golden()["cases"] would dangle
  for (const auto& c : g["cases"]) {
    const std::string text = c["text"].get<std::string>();
    std::vector<std::string_view> pieces;
    tokenizer::pretokenize(text, &pieces);
    std::vector<std::string> mapped;
    for (const auto p : pieces) mapped.push_back(tokenizer::bytes_to_vocab_string(p));
    EXPECT_EQ(mapped, c["pieces"].get<std::vector<std::string>>())
        << "text: " << testing::PrintToString(text);
  }
}

// train_bpe is deterministic: retraining on the committed text reproduces the committed file
// byte for byte (so the golden ids keep testing what training produces today).
TEST(Golden, TrainingReproducesCommittedJson) {
  const std::string text = read_text_file(kDir + "train.txt");
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::train_bpe(text, 512);
  EXPECT_EQ(tok.to_json_text(), read_text_file(kDir + "tok512.json"));
}

}  // namespace
}  // namespace tessera::tokenizer
