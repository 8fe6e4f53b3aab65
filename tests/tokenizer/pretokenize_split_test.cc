// The pre-tokenizers of Qwen3.5, Falcon, DeepSeek Coder and DeepSeek LLM on hand-picked strings
// (digits, contractions, combining marks, CJK, punctuation, whitespace runs). The expected pieces
// are Hugging Face tokenizers 0.23.3's (pre_tokenize_str of the pre-tokenizer steps those models'
// tokenizer.json files list; Falcon's pieces as bytes, after its ByteLevel step).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tokenizer/pretokenize.h"

namespace tessera::tokenizer {
namespace {

struct Case {
  std::string text;
  std::vector<std::string> pieces;
};

void expect_pieces(PreTokenizer kind, const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    std::vector<std::string_view> got;
    pretokenize(kind, c.text, &got);
    EXPECT_EQ(std::vector<std::string>(got.begin(), got.end()), c.pieces)
        << pre_tokenizer_name(kind) << " on \"" << c.text << "\"";
  }
}

// Marks join letter runs (e + U+0301 stays whole, a lone mark leads a word); digits one by one.
TEST(PretokenizeSplit, Qwen35) {
  expect_pieces(
      PreTokenizer::qwen35,
      {
          {"Hello, world! 123", {"Hello", ",", " world", "!", " ", "1", "2", "3"}},
          {"I've  been 'told", {"I", "'ve", " ", " been", " '", "told"}},
          {"x = a+b <= 42;", {"x", " =", " a", "+b", " <=", " ", "4", "2", ";"}},
          {"ab1234567cd", {"ab", "1", "2", "3", "4", "5", "6", "7", "cd"}},
          {"e\u0301t\u00E9 r\u00E9sume\u0301", {"e\u0301t\u00E9", " r\u00E9sume\u0301"}},
          {"\u0915\u093F\u0924\u093E\u092C \u0301x",
           {"\u0915\u093F\u0924\u093E\u092C", " \u0301x"}},
          {"\u6211\u60F3\u5728apple\u5DE5\u4F5C1314\u5929\uFF5E",
           {"\u6211\u60F3\u5728apple\u5DE5\u4F5C", "1", "3", "1", "4", "\u5929", "\uFF5E"}},
          {"\u00BD \u00B2x", {"\u00BD", " ", "\u00B2", "x"}},
          {"\u3000\u3001\u300Ca\u300D", {"\u3000", "\u3001\u300C", "a", "\u300D"}},
          {"line1\r\n\n  line2  ", {"line", "1", "\r\n\n", " ", " line", "2", "  "}},
          {"--- ...!!", {"---", " ...!!"}},
          {"\u041F\u0440\u0438\u0432\u0435\u0442 \u03B1\u03B2\u03B3",
           {"\u041F\u0440\u0438\u0432\u0435\u0442", " \u03B1\u03B2\u03B3"}},
          {"\uAC00\uB098\uB2E4 \u3042\u3044", {"\uAC00\uB098\uB2E4", " \u3042\u3044"}},
          {"a\t\tb  \u00A0c", {"a", "\t", "\tb", "  ", "\u00A0c"}},
      });
}

// Punctuation runs split first (so contractions break apart); digit runs, then threes, are split
// after the byte-level mapping, where the UTF-8 bytes 0xB2 0xB3 0xB9 0xBC..0xBE read as numeric.
TEST(PretokenizeSplit, Falcon) {
  expect_pieces(PreTokenizer::falcon,
                {
                    {"Hello, world! 123", {"Hello", ",", " world", "!", " ", "123"}},
                    {"I've  been 'told", {"I", "'", "ve", " ", " been", " ", "'", "told"}},
                    {"x = a+b <= 42;", {"x", " ", "=", " a", "+", "b", " ", "<=", " ", "42", ";"}},
                    {"ab1234567cd", {"ab", "123", "456", "7", "cd"}},
                    {"e\u0301t\u00E9 r\u00E9sume\u0301",
                     {"e", "\u0301", "t\u00E9", " r\u00E9sume", "\u0301"}},
                    {"\u0915\u093F\u0924\u093E\u092C \u0301x",
                     {"\u0915", "\u093F", "\u0924", "\340\244", "\276", "\u092C", " \u0301", "x"}},
                    {"\u6211\u60F3\u5728apple\u5DE5\u4F5C1314\u5929\uFF5E",
                     {"\u6211\346\203", "\263", "\u5728apple\u5DE5\344", "\275", "\234", "131", "4",
                      "\u5929", "\357", "\275", "\236"}},
                    {"\u00BD \u00B2x", {"\302", "\275", " \302", "\262", "x"}},
                    {"\u3000\u3001\u300Ca\u300D", {"\u3000", "\u3001\u300C", "a", "\u300D"}},
                    {"line1\r\n\n  line2  ", {"line", "1", "\r\n\n ", " line", "2", "  "}},
                    {"--- ...!!", {"---", " ", "...!!"}},
                    {"\u041F\u0440\u0438\u0432\u0435\u0442 \u03B1\u03B2\u03B3",
                     {"\u041F\u0440\u0438\320", "\262", "\u0435\u0442", " \u03B1\316", "\262",
                      "\316", "\263"}},
                    {"\uAC00\uB098\uB2E4 \u3042\u3044", {"\uAC00\uB098\uB2E4", " \u3042\u3044"}},
                    {"a\t\tb  \u00A0c", {"a", "\t", "\t", "b", "  ", "\u00A0", "c"}},
                });
}

// Newlines alone; \\s?\\p{L}+ and \\s?\\p{P}+ (ASCII symbols such as = + < are \\p{S}, left
// between); CJK runs; single digits.
TEST(PretokenizeSplit, DeepseekCoder) {
  expect_pieces(
      PreTokenizer::deepseek_coder,
      {
          {"Hello, world! 123", {"Hello", ",", " world", "!", " ", "1", "2", "3"}},
          {"I've  been 'told", {"I", "'", "ve", " ", " been", " '", "told"}},
          {"x = a+b <= 42;", {"x", " =", " a", "+", "b", " <= ", "4", "2", ";"}},
          {"ab1234567cd", {"ab", "1", "2", "3", "4", "5", "6", "7", "cd"}},
          {"e\u0301t\u00E9 r\u00E9sume\u0301",
           {"e", "\u0301", "t\u00E9", " r\u00E9sume", "\u0301"}},
          {"\u0915\u093F\u0924\u093E\u092C \u0301x",
           {"\u0915", "\u093F", "\u0924", "\u093E", "\u092C", " \u0301", "x"}},
          {"\u6211\u60F3\u5728apple\u5DE5\u4F5C1314\u5929\uFF5E",
           {"\u6211\u60F3\u5728", "apple", "\u5DE5\u4F5C", "1", "3", "1", "4", "\u5929", "\uFF5E"}},
          {"\u00BD \u00B2x", {"\u00BD", " ", "\u00B2", "x"}},
          {"\u3000\u3001\u300Ca\u300D", {"\u3000\u3001\u300C", "a", "\u300D"}},
          {"line1\r\n\n  line2  ", {"line", "1", "\r", "\n", "\n", " ", " line", "2", "  "}},
          {"--- ...!!", {"---", " ...!!"}},
          {"\u041F\u0440\u0438\u0432\u0435\u0442 \u03B1\u03B2\u03B3",
           {"\u041F\u0440\u0438\u0432\u0435\u0442", " \u03B1\u03B2\u03B3"}},
          {"\uAC00\uB098\uB2E4 \u3042\u3044", {"\uAC00\uB098\uB2E4", " ", "\u3042\u3044"}},
          {"a\t\tb  \u00A0c", {"a", "\t", "\tb", "  ", "\u00A0c"}},
      });
}

// As DeepSeek Coder with its own letter and punctuation classes (Devanagari and kana are no
// letters there; U+3000..U+3002 are punctuation) and the trailing-whitespace split.
TEST(PretokenizeSplit, DeepseekLlm) {
  expect_pieces(
      PreTokenizer::deepseek_llm,
      {
          {"Hello, world! 123", {"Hello", ",", " world", "!", " ", "1", "2", "3"}},
          {"I've  been 'told", {"I", "'", "ve", " ", " been", " '", "told"}},
          {"x = a+b <= 42;", {"x", " =", " a", "+", "b", " <=", " ", "4", "2", ";"}},
          {"ab1234567cd", {"ab", "1", "2", "3", "4", "5", "6", "7", "cd"}},
          {"e\u0301t\u00E9 r\u00E9sume\u0301",
           {"e", "\u0301", "t", "\u00E9", " r", "\u00E9", "sume", "\u0301"}},
          {"\u0915\u093F\u0924\u093E\u092C \u0301x",
           {"\u0915\u093F\u0924\u093E\u092C", " \u0301", "x"}},
          {"\u6211\u60F3\u5728apple\u5DE5\u4F5C1314\u5929\uFF5E",
           {"\u6211\u60F3\u5728", "apple", "\u5DE5\u4F5C", "1", "3", "1", "4", "\u5929", "\uFF5E"}},
          {"\u00BD \u00B2x", {"\u00BD", " ", "\u00B2", "x"}},
          {"\u3000\u3001\u300Ca\u300D", {"\u3000\u3001", "\u300C", "a", "\u300D"}},
          {"line1\r\n\n  line2  ", {"line", "1", "\r", "\n", "\n", " ", " line", "2", "  "}},
          {"--- ...!!", {"---", " ...!!"}},
          {"\u041F\u0440\u0438\u0432\u0435\u0442 \u03B1\u03B2\u03B3",
           {"\u041F\u0440\u0438\u0432\u0435\u0442", " \u03B1\u03B2\u03B3"}},
          {"\uAC00\uB098\uB2E4 \u3042\u3044", {"\uAC00\uB098\uB2E4", " ", "\u3042\u3044"}},
          {"a\t\tb  \u00A0c", {"a", "\t", "\tb", "  ", "\u00A0c"}},
      });
}

TEST(PretokenizeSplit, NamesRoundTrip) {
  for (const PreTokenizer p : {PreTokenizer::qwen35, PreTokenizer::falcon,
                               PreTokenizer::deepseek_coder, PreTokenizer::deepseek_llm})
    EXPECT_EQ(parse_pre_tokenizer(pre_tokenizer_name(p), "test"), p);
  EXPECT_THROW(parse_pre_tokenizer("deepseek-v9", "test"), std::exception);
}

TEST(PretokenizeSplit, PiecesCoverInvalidUtf8) {
  const std::string text =
      "a\xff 12\xc3(\xe2\x82\n\xbd\xbd"
      "9";
  for (const PreTokenizer p : {PreTokenizer::qwen35, PreTokenizer::falcon,
                               PreTokenizer::deepseek_coder, PreTokenizer::deepseek_llm}) {
    std::vector<std::string_view> got;
    pretokenize(p, text, &got);
    std::string joined;
    for (const std::string_view v : got) {
      EXPECT_FALSE(v.empty()) << pre_tokenizer_name(p);
      joined += v;
    }
    EXPECT_EQ(joined, text) << pre_tokenizer_name(p);
  }
}

}  // namespace
}  // namespace tessera::tokenizer
