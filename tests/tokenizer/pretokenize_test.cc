// GPT-2 pre-tokenization by hand: pattern cases, Unicode classes, invalid UTF-8, byte alphabet
// (the classes of single code points: tests/unicode/char_class_test.cc).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/rng.h"
#include "tokenizer/pretokenize.h"

namespace tessera::tokenizer {
namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string_view> v;
  tokenizer::pretokenize(s, &v);
  return {v.begin(), v.end()};
}

using V = std::vector<std::string>;

TEST(Pretokenize, WordsNumbersPunctuation) {
  EXPECT_EQ(split("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(split("abc123def"), (V{"abc", "123", "def"}));
  EXPECT_EQ(split(" 42 !? x"), (V{" 42", " !?", " x"}));
  EXPECT_EQ(split("a,b.c"), (V{"a", ",", "b", ".", "c"}));
  EXPECT_EQ(split(""), V{});
}

TEST(Pretokenize, Contractions) {
  EXPECT_EQ(split("it's we've I'll"), (V{"it", "'s", " we", "'ve", " I", "'ll"}));
  // Case-sensitive, as in GPT-2: "'S" is punctuation then a letter.
  EXPECT_EQ(split("IT'S"), (V{"IT", "'", "S"}));
  // A run of apostrophes is one "other" piece; the contraction needs the apostrophe first.
  EXPECT_EQ(split("''s"), (V{"''", "s"}));
  EXPECT_EQ(split(" 's"), (V{" '", "s"}));
  EXPECT_EQ(split("'"), (V{"'"}));
}

TEST(Pretokenize, WhitespaceRuns) {
  // \s+(?!\S) leaves the last space of a run to lead the next word.
  EXPECT_EQ(split("a   b"), (V{"a", "  ", " b"}));
  // At the end of text the whole run is one piece.
  EXPECT_EQ(split("a   "), (V{"a", "   "}));
  // A tab cannot lead a word (only U+0020 can), so a lone tab falls to \s+.
  EXPECT_EQ(split("\t\tfoo"), (V{"\t", "\t", "foo"}));
  EXPECT_EQ(split("x\n\ny"), (V{"x", "\n", "\n", "y"}));
  EXPECT_EQ(split("x \n y"), (V{"x", " \n", " y"}));
  // U+3000 (3 bytes) is whitespace: the backtrack steps back one code point, not one byte.
  EXPECT_EQ(split("a\u3000\u3000b"), (V{"a", "\u3000", "\u3000", "b"}));
  EXPECT_EQ(split("a\u3000 b"), (V{"a", "\u3000", " b"}));
}

TEST(Pretokenize, UnicodeClasses) {
  EXPECT_EQ(split("caf\u00e9 \u0434\u044f\u043a\u0443\u044e"),
            (V{"caf\u00e9", " \u0434\u044f\u043a\u0443\u044e"}));
  // Arabic-Indic digits and superscript two are \p{N}; the em dash is neither L nor N.
  EXPECT_EQ(split("x\u0661\u0662 \u00b2\u2014"), (V{"x", "\u0661\u0662", " \u00b2", "\u2014"}));
}

TEST(Pretokenize, InvalidUtf8BytesAreOther) {
  // Each invalid byte is a code point of class other (unicode/char_class.h).
  EXPECT_EQ(split("ab\xFF\xFE cd"), (V{"ab", "\xFF\xFE", " cd"}));
  EXPECT_EQ(split(" \x80x"), (V{" \x80", "x"}));
}

TEST(Pretokenize, PiecesCoverAnyByteString) {
  Rng rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string s(rng.below(40), '\0');
    // Mostly bytes that exercise the classes: space, tab, newline, letters, digits, quote, high.
    const char kAlphabet[] = " \t\n'aZ09.,\xC3\xA9\xE3\x80\x80\xF0\x9F\x8C\x8A\x80\xFF";
    for (char& ch : s)
      ch = rng.below(4) ? kAlphabet[rng.below(sizeof(kAlphabet) - 1)]
                        : static_cast<char>(rng.below(256));
    std::vector<std::string_view> v;
    tokenizer::pretokenize(s, &v);
    std::string joined;
    for (const auto piece : v) {
      ASSERT_FALSE(piece.empty());
      ASSERT_EQ(piece.data(), s.data() + joined.size());  // contiguous, in order
      joined += piece;
    }
    ASSERT_EQ(joined, s);
  }
}

TEST(ByteAlphabet, Gpt2Mapping) {
  EXPECT_EQ(byte_to_code_point('A'), uint32_t{'A'});
  EXPECT_EQ(byte_to_code_point(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(byte_to_code_point('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(byte_to_code_point(0xAD), 0x143u);  // soft hyphen is the last remapped byte
  for (int b = 0; b < 256; ++b) EXPECT_EQ(tokenizer::code_point_to_byte(byte_to_code_point(b)), b);
  EXPECT_EQ(tokenizer::code_point_to_byte(0x144), -1);
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  std::string back;
  ASSERT_TRUE(tokenizer::vocab_string_to_bytes(tokenizer::bytes_to_vocab_string(all), &back));
  EXPECT_EQ(back, all);
  EXPECT_EQ(tokenizer::bytes_to_vocab_string(" the"), "\u0120the");
  EXPECT_FALSE(tokenizer::vocab_string_to_bytes("\u4e2d", &back));  // outside the alphabet
  EXPECT_FALSE(tokenizer::vocab_string_to_bytes("\xC4", &back));    // truncated UTF-8
}

}  // namespace
}  // namespace tessera::tokenizer
