// WordPiece from a GGUF "bert" vocabulary: BERT normalization (cleaning, CJK spacing, accent
// stripping, lowercasing), whitespace/punctuation words and longest-prefix pieces. The expected
// ids are Hugging Face tokenizers 0.23.3's (BertNormalizer, BertPreTokenizer and WordPiece over
// the same vocabulary in its "##" form).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "formats/gguf.h"
#include "test_util/expect_error.h"
#include "tokenizer/tokenizer.h"

namespace tessera::tokenizer {
namespace {

using Ids = std::vector<int32_t>;

// HF's vocabulary; GGUF (llama.cpp's converter) writes a word's first piece as U+2581 + text and
// a "##" continuation bare.
const std::vector<std::string> kHfVocab = {"[PAD]",
                                           "[UNK]",
                                           "[CLS]",
                                           "hello",
                                           "world",
                                           "un",
                                           "##aff",
                                           "##able",
                                           "a",
                                           "##pf",
                                           "##el",
                                           "cafe",
                                           ",",
                                           "!",
                                           "'",
                                           "s",
                                           "i",
                                           "##\u0307",
                                           "\u043f\u0440\u0438",
                                           "##\u0432\u0435\u0442",
                                           "\u4e2d",
                                           "\u6587",
                                           "x",
                                           "##x",
                                           "$",
                                           "naive",
                                           "\u00e9"};

Tokenizer load(bool lowercase) {
  std::vector<std::string> names;
  std::vector<int32_t> types;
  for (const std::string& v : kHfVocab) {
    const bool special = v.front() == '[';
    names.push_back(special ? v : v.starts_with("##") ? v.substr(2) : "\u2581" + v);
    types.push_back(special ? 3 : 1);
  }
  formats::GgufWriter w;
  w.set("tokenizer.ggml.model", "bert");
  w.set("tokenizer.ggml.pre", "bert-bge");
  w.set("tokenizer.ggml.tokens", formats::gguf_array(formats::GgufType::string, names));
  w.set("tokenizer.ggml.token_type", formats::gguf_array(formats::GgufType::i32, types));
  w.set("tokenizer.ggml.unknown_token_id", uint32_t{1});
  if (!lowercase) w.set("tokenizer.ggml.normalizer.lowercase", false);
  return Tokenizer::from_gguf(formats::GgufFile::from_memory(w.serialize(), "bert.gguf"));
}

TEST(WordPiece, MatchesHuggingFaceUncased) {
  const Tokenizer tok = load(true);
  EXPECT_EQ(tok.model(), TokenizerModel::wordpiece);
  EXPECT_EQ(tok.encode_ordinary("Hello, World!"), (Ids{3, 12, 4, 13}));
  EXPECT_EQ(tok.encode_ordinary("unaffable"), (Ids{5, 6, 7}));
  // Accents go after NFD (Ä -> a, é -> e); U+0130 decomposes to I + U+0307, which goes too.
  EXPECT_EQ(tok.encode_ordinary("\u00c4pfel caf\u00e9"), (Ids{8, 9, 10, 11}));
  EXPECT_EQ(tok.encode_ordinary("\u0130"), (Ids{16}));
  EXPECT_EQ(tok.encode_ordinary("na\u00efve"), (Ids{25}));
  // Tab is whitespace; ZWJ (Cf) and NUL are dropped.
  EXPECT_EQ(tok.encode_ordinary(std::string("HELLO\tworld\u200d\0!", 16)), (Ids{3, 4, 13}));
  EXPECT_EQ(tok.encode_ordinary("\u041f\u0440\u0438\u0432\u0435\u0442"), (Ids{18, 19}));
  // CJK ideographs are words of their own.
  EXPECT_EQ(tok.encode_ordinary("x\u4e2d\u6587x"), (Ids{22, 20, 21, 22}));
  // $ and ' are ASCII punctuation: each its own word.
  EXPECT_EQ(tok.encode_ordinary("$hello's"), (Ids{24, 3, 14, 15}));
  // A word with a piece outside the vocabulary is one [UNK].
  EXPECT_EQ(tok.encode_ordinary("unknownword hello"), (Ids{1, 3}));
  EXPECT_EQ(tok.encode_ordinary(""), Ids{});
  EXPECT_EQ(tok.encode_ordinary("  \n "), Ids{});
}

TEST(WordPiece, WordsOverAHundredCharactersAreUnknown) {
  const Tokenizer tok = load(true);
  Ids hundred = {22};
  hundred.resize(100, 23);
  EXPECT_EQ(tok.encode_ordinary(std::string(100, 'x')), hundred);
  EXPECT_EQ(tok.encode_ordinary(std::string(101, 'x')), (Ids{1}));
}

TEST(WordPiece, CasedKeepsCaseAndAccents) {
  const Tokenizer tok = load(false);
  EXPECT_EQ(tok.encode_ordinary("Hello caf\u00e9"), (Ids{1, 1}));
  EXPECT_EQ(tok.encode_ordinary("hello caf\u00e9 \u00e9"), (Ids{3, 1, 26}));
}

TEST(WordPiece, DecodesAndRoundTripsThroughGguf) {
  const Tokenizer tok = load(true);
  EXPECT_EQ(tok.decode({5, 6, 7, 3}), "unaffable hello");
  formats::GgufWriter w;
  tok.to_gguf(w);
  const Tokenizer back =
      Tokenizer::from_gguf(formats::GgufFile::from_memory(w.serialize(), "back.gguf"));
  EXPECT_EQ(back.encode_ordinary("Hello, unaffable \u4e2d"), (Ids{3, 12, 5, 6, 7, 20}));
  EXPECT_EQ(load(false).encode_ordinary("Hello"), (Ids{1}));
  test::expect_error([&] { (void)tok.to_json_text(); }, "WordPiece");
}

}  // namespace
}  // namespace tessera::tokenizer
