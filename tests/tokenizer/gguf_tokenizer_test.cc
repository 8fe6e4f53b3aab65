// Tokenizers from GGUF metadata: a hand-made SentencePiece vocabulary with scores (merge by score,
// ties leftmost, byte fallback, prefix space), and errors that name the GGUF key.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/file_io.h"
#include "formats/gguf.h"
#include "test_util/expect_error.h"
#include "tokenizer/tokenizer.h"

namespace tessera::tokenizer {
namespace {

const std::string kDir = std::string(TESSERA_SOURCE_DIR) + "/tests/data/tokenizer/";
const std::string kMeta = "\xE2\x96\x81";  // U+2581

// ids: 0 <unk>, 1 <s>, 2 </s>, 3..258 <0x00>..<0xFF>, then the pieces below.
constexpr int32_t kSpace = 259, kA = 260, kB = 261, kC = 262, kAB = 263, kBC = 264, kSpaceA = 265,
                  kSpaceAB = 266, kABC = 267;

// user_defined: also "\n" (268) and "  " (269) as USER_DEFINED tokens, as Gemma's vocabulary
// has its runs of newlines and spaces.
formats::GgufWriter spm_writer(bool user_defined = false) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  std::vector<float> scores = {0, 0, 0};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    tokens.push_back(name);
    types.push_back(6);
    scores.push_back(0);
  }
  // "ab" and "bc" share a score, so the leftmost of the two merges first.
  const std::vector<std::pair<std::string, float>> pieces = {
      {kMeta, -1}, {"a", -2},  {"b", -3},         {"c", -4},
      {"ab", -5},  {"bc", -5}, {kMeta + "a", -6}, {kMeta + "ab", -0.5f},
      {"abc", -7}};
  for (const auto& [p, s] : pieces) {
    tokens.push_back(p);
    types.push_back(1);
    scores.push_back(s);
  }
  if (user_defined)
    for (const char* p : {"\n", "  "}) {
      tokens.push_back(p);
      types.push_back(4);
      scores.push_back(0);
    }
  formats::GgufWriter w;
  w.set("tokenizer.ggml.model", "llama");
  w.set("tokenizer.ggml.tokens", formats::gguf_array(formats::GgufType::string, tokens));
  w.set("tokenizer.ggml.token_type", formats::gguf_array(formats::GgufType::i32, types));
  w.set("tokenizer.ggml.scores", formats::gguf_array(formats::GgufType::f32, scores));
  w.set("tokenizer.ggml.bos_token_id", uint32_t{1});
  w.set("tokenizer.ggml.eos_token_id", uint32_t{2});
  return w;
}

tokenizer::Tokenizer load(const formats::GgufWriter& w) {
  return tokenizer::Tokenizer::from_gguf(formats::GgufFile::from_memory(w.serialize(), "t.gguf"));
}

using Ids = std::vector<int32_t>;

TEST(GgufTokenizer, SentencePieceMergesByScore) {
  const tokenizer::Tokenizer tok = load(spm_writer());
  EXPECT_EQ(tok.model(), tokenizer::TokenizerModel::sentencepiece_bpe);
  EXPECT_TRUE(tok.special_tokens().add_bos);  // llama default
  EXPECT_EQ(tok.special_tokens().unk, 0);
  // "_abc": ab (-5) beats bc (-5) by position, then _ab (-0.5) beats abc (-7).
  EXPECT_EQ(tok.encode("abc"), (Ids{kSpaceAB, kC}));
  EXPECT_EQ(tok.encode("bcab"), (Ids{kSpace, kBC, kAB}));
  EXPECT_EQ(tok.encode("a a"), (Ids{kSpaceA, kSpaceA}));
  // Characters outside the vocabulary fall back to their UTF-8 bytes.
  EXPECT_EQ(tok.encode("\xC3\xA9"), (Ids{kSpace, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(tok.decode(tok.encode("\xC3\xA9")), "\xC3\xA9");
  EXPECT_EQ(tok.decode({kSpaceAB, kC}), "abc");
  EXPECT_EQ(tok.decode_token(kSpaceAB), " ab");
  EXPECT_EQ(tok.decode_token(3 + 'A'), "A");
  // Every text segment after an added token gets the prefix (llama.cpp, HF legacy Llama).
  EXPECT_EQ(tok.encode("<s>a</s>a"), (Ids{1, kSpaceA, 2, kSpaceA}));
  EXPECT_EQ(tok.decode({1, kSpaceA}), "<s> a");
  EXPECT_EQ(tok.decode({1, kSpaceA}, true), "a");
  EXPECT_EQ(tok.encode(""), Ids{});
  EXPECT_EQ(tok.end_of_generation_tokens(), Ids{2});
}

TEST(GgufTokenizer, SentencePieceScoresRoundTrip) {
  const tokenizer::Tokenizer tok = load(spm_writer());
  formats::GgufWriter w;
  tok.to_gguf(w);
  const formats::GgufFile f = formats::GgufFile::from_memory(w.serialize(), "back.gguf");
  EXPECT_FALSE(f.has("tokenizer.ggml.merges"));  // score-derived merges stay implicit
  const tokenizer::Tokenizer back = tokenizer::Tokenizer::from_gguf(f);
  for (const char* text : {"abc", "bcab", "a a", "\xC3\xA9 abcabc", "<s>a</s>a"})
    EXPECT_EQ(back.encode(text), tok.encode(text)) << text;
  const formats::GgufArray& types = f.get_array("tokenizer.ggml.token_type");
  EXPECT_EQ(types.items[0], formats::GgufValue(int32_t{2}));  // <unk>
  EXPECT_EQ(types.items[1], formats::GgufValue(int32_t{3}));  // <s>
  EXPECT_EQ(types.items[3], formats::GgufValue(int32_t{6}));  // <0x00>
  EXPECT_EQ(types.items[kA], formats::GgufValue(int32_t{1}));
}

// llama.cpp's reading of a converted vocabulary: scores only, no merges. For a vocabulary that
// BPE training built merge by merge, merging by the score of the merged piece gives HF's ids.
TEST(GgufTokenizer, ScoresAloneMatchHuggingFaceLegacyLlama) {
  formats::GgufWriter full;
  tokenizer::Tokenizer::load_json(kDir + "spm_legacy.json").to_gguf(full);
  const formats::GgufFile f = formats::GgufFile::from_memory(full.serialize(), "full.gguf");
  formats::GgufWriter w;
  for (const auto& [k, v] : f.metadata())
    if (k != "tokenizer.ggml.merges") w.set(k, v);
  const tokenizer::Tokenizer tok = load(w);
  const auto g = nlohmann::json::parse(read_text_file(kDir + "real_golden.json"));
  for (const auto& t : g["tokenizers"]) {
    if (t["tokenizer"] != "spm_legacy.json") continue;
    for (const auto& c : t["cases"])
      EXPECT_EQ(tok.encode(c["text"].get<std::string>()), c["ids"].get<Ids>()) << c["text"];
  }
}

TEST(GgufTokenizer, NoSpacePrefix) {
  formats::GgufWriter w = spm_writer();
  w.set("tokenizer.ggml.add_space_prefix", false);
  const tokenizer::Tokenizer tok = load(w);
  EXPECT_EQ(tok.encode("ab"), (Ids{kAB}));
  EXPECT_EQ(tok.decode({kSpaceA}), " a");  // nothing to strip when no prefix was added
}

// USER_DEFINED tokens are matched in the raw text even when special tokens are not (llama.cpp
// with parse_special off, HF with split_special_tokens): Gemma's "\n" and runs of spaces.
TEST(GgufTokenizer, UserDefinedTokensMatchedInOrdinaryText) {
  formats::GgufWriter w = spm_writer(true);
  w.set("tokenizer.ggml.add_space_prefix", false);
  const tokenizer::Tokenizer tok = load(w);
  constexpr int32_t kNewline = 268, kTwoSpaces = 269;
  EXPECT_EQ(tok.encode_ordinary("ab\n  a"), (Ids{kAB, kNewline, kTwoSpaces, kA}));
  EXPECT_EQ(tok.encode("ab\n  a"), (Ids{kAB, kNewline, kTwoSpaces, kA}));
  // A control token's text stays ordinary text in encode_ordinary, and is matched by encode.
  EXPECT_EQ(tok.encode_ordinary("a<s>"), (Ids{kA, 3 + '<', 3 + 's', 3 + '>'}));  // byte fallback
  EXPECT_EQ(tok.encode("a<s>"), (Ids{kA, 1}));
  EXPECT_EQ(tok.decode(tok.encode_ordinary("ab\n  a")), "ab\n  a");
}

// llama.cpp's other names for the pre-tokenizers we have (starcoder, refact and command-r split
// like smollm; mpt like gpt2) load as those, and the file's name is what is written back.
TEST(GgufTokenizer, PreTokenizerAliasesKeepTheirName) {
  const formats::GgufFile base(kDir + "smollm2.gguf");
  const tokenizer::Tokenizer smollm = tokenizer::Tokenizer::from_gguf(base);
  ASSERT_EQ(smollm.pre_tokenizer(), tokenizer::PreTokenizer::smollm);
  for (const char* alias : {"starcoder", "refact", "command-r"}) {
    formats::GgufWriter w;
    for (const auto& [k, v] : base.metadata())
      if (k.starts_with("tokenizer.")) w.set(k, v);
    w.set("tokenizer.ggml.pre", std::string(alias));
    const tokenizer::Tokenizer tok = load(w);
    EXPECT_EQ(tok.pre_tokenizer(), tokenizer::PreTokenizer::smollm) << alias;
    EXPECT_EQ(tok.encode_ordinary("abc 12345 it's"), smollm.encode_ordinary("abc 12345 it's"));
    formats::GgufWriter back;
    tok.to_gguf(back);
    EXPECT_EQ(
        formats::GgufFile::from_memory(back.serialize(), "b.gguf").get_string("tokenizer.ggml.pre"),
        alias);
  }
}

// GGUF model "gemma4": SentencePiece-style BPE (here by score) whose merges never cross the edge
// of a newline run, and which is written back as "gemma4".
TEST(GgufTokenizer, Gemma4SplitsAtNewlineRuns) {
  const formats::GgufFile base = formats::GgufFile::from_memory(spm_writer().serialize(), "b.gguf");
  std::vector<std::string> tokens = base.get_string_array("tokenizer.ggml.tokens");
  std::vector<int32_t> types;
  for (const formats::GgufValue& v : base.get_array("tokenizer.ggml.token_type").items)
    types.push_back(*v.get_if<int32_t>());
  std::vector<float> scores;
  for (const formats::GgufValue& v : base.get_array("tokenizer.ggml.scores").items)
    scores.push_back(*v.get_if<float>());
  const auto newline = static_cast<int32_t>(tokens.size()), b_newline = newline + 1;
  for (const auto& [p, score] : {std::pair<std::string, float>{"\n", -1.5f}, {"b\n", -0.1f}}) {
    tokens.push_back(p);
    types.push_back(1);
    scores.push_back(score);
  }
  auto writer = [&](const char* model) {
    formats::GgufWriter w;
    for (const auto& [k, v] : base.metadata()) w.set(k, v);
    w.set("tokenizer.ggml.model", model);
    w.set("tokenizer.ggml.add_space_prefix", false);
    w.set("tokenizer.ggml.tokens", formats::gguf_array(formats::GgufType::string, tokens));
    w.set("tokenizer.ggml.token_type", formats::gguf_array(formats::GgufType::i32, types));
    w.set("tokenizer.ggml.scores", formats::gguf_array(formats::GgufType::f32, scores));
    return w;
  };
  // "b\n" outscores "ab": without the split it merges first.
  EXPECT_EQ(load(writer("llama")).encode_ordinary("ab\nb"), (Ids{kA, b_newline, kB}));
  const tokenizer::Tokenizer gemma = load(writer("gemma4"));
  EXPECT_EQ(gemma.encode_ordinary("ab\nb"), (Ids{kAB, newline, kB}));
  EXPECT_EQ(gemma.encode_ordinary("a b"), (Ids{kA, kSpace, kB}));
  formats::GgufWriter back;
  gemma.to_gguf(back);
  EXPECT_EQ(
      formats::GgufFile::from_memory(back.serialize(), "g.gguf").get_string("tokenizer.ggml.model"),
      "gemma4");
}

// Command-R's vocabulary holds raw emoji beside its byte-level tokens: they load, are never
// produced by encoding (HF's byte-level encoding cannot reach them), decode to their text and
// are written back as they were.
TEST(GgufTokenizer, TokensOutsideTheByteAlphabetStayVerbatim) {
  const formats::GgufFile base(kDir + "smollm2.gguf");
  const tokenizer::Tokenizer smollm = tokenizer::Tokenizer::from_gguf(base);
  std::vector<std::string> tokens = base.get_string_array("tokenizer.ggml.tokens");
  std::vector<int32_t> types;
  for (const formats::GgufValue& v : base.get_array("tokenizer.ggml.token_type").items)
    types.push_back(*v.get_if<int32_t>());
  const auto id = static_cast<int32_t>(tokens.size());
  tokens.push_back("\u2122");  // TRADE MARK SIGN as itself, not as its bytes' alphabet characters
  types.push_back(1);
  formats::GgufWriter w;
  for (const auto& [k, v] : base.metadata())
    if (k.starts_with("tokenizer.")) w.set(k, v);
  w.set("tokenizer.ggml.tokens", formats::gguf_array(formats::GgufType::string, tokens));
  w.set("tokenizer.ggml.token_type", formats::gguf_array(formats::GgufType::i32, types));
  const tokenizer::Tokenizer tok = load(w);
  EXPECT_EQ(tok.vocab_size(), id + 1);
  EXPECT_EQ(tok.encode_ordinary("a \u2122 b"), smollm.encode_ordinary("a \u2122 b"));
  EXPECT_EQ(tok.decode_token(id), "\u2122");
  formats::GgufWriter back;
  tok.to_gguf(back);
  EXPECT_EQ(formats::GgufFile::from_memory(back.serialize(), "b.gguf")
                .get_string_array("tokenizer.ggml.tokens")[id],
            "\u2122");
}

TEST(GgufTokenizer, Errors) {
  auto with = [](const std::string& key, formats::GgufValue v) {
    formats::GgufWriter w = spm_writer();
    w.set(key, std::move(v));
    return w;
  };
  using test::expect_error;
  expect_error([&] { load(with("tokenizer.ggml.model", "t5")); }, "tokenizer.ggml.model");
  expect_error([&] { load(with("tokenizer.ggml.model", "t5")); }, "t5");
  expect_error([] { load(formats::GgufWriter()); }, "tokenizer.ggml.model");
  expect_error(
      [&] {
        load(with("tokenizer.ggml.token_type",
                  formats::gguf_array(formats::GgufType::i32, std::vector<int32_t>{1})));
      },
      "tokenizer.ggml.token_type");
  expect_error(
      [&] {
        load(with("tokenizer.ggml.scores",
                  formats::gguf_array(formats::GgufType::f32, std::vector<float>{1.f})));
      },
      "tokenizer.ggml.scores");
  expect_error([&] { load(with("tokenizer.ggml.bos_token_id", uint32_t{999})); },
               "tokenizer.ggml.bos_token_id");
  expect_error(
      [&] {
        load(with("tokenizer.ggml.tokens",
                  formats::gguf_array(formats::GgufType::i32, std::vector<int32_t>{1})));
      },
      "tokenizer.ggml.tokens");
  {
    std::vector<int32_t> types(268, 1);
    types[5] = 9;
    expect_error(
        [&] {
          load(with("tokenizer.ggml.token_type",
                    formats::gguf_array(formats::GgufType::i32, types)));
        },
        "tokenizer.ggml.token_type[5]");
    types[5] = 6;
    types[kA] = 6;  // "a" is no <0xNN> name
    expect_error(
        [&] {
          load(with("tokenizer.ggml.token_type",
                    formats::gguf_array(formats::GgufType::i32, types)));
        },
        "tokenizer.ggml.tokens[260]");
  }
  // A byte-level vocabulary: pre-tokenizer names and merges are checked.
  const formats::GgufFile smol(kDir + "smollm2.gguf");
  auto smol_with = [&](const std::string& key, formats::GgufValue v) {
    formats::GgufWriter w;
    for (const auto& [k, val] : smol.metadata()) w.set(k, val);
    w.set(key, std::move(v));
    return w;
  };
  expect_error([&] { load(smol_with("tokenizer.ggml.pre", "foo")); }, "tokenizer.ggml.pre");
  expect_error([&] { load(smol_with("tokenizer.ggml.pre", "foo")); }, "'foo'");
  expect_error(
      [&] {
        load(smol_with("tokenizer.ggml.merges",
                       formats::gguf_array(formats::GgufType::string,
                                           std::vector<std::string>{"a b", "x nosuch"})));
      },
      "tokenizer.ggml.merges[1]");
  expect_error(
      [&] {
        load(smol_with(
            "tokenizer.ggml.merges",
            formats::gguf_array(formats::GgufType::string, std::vector<std::string>{"ab"})));
      },
      "tokenizer.ggml.merges[0]");
  expect_error([&] { load(with("tokenizer.ggml.model", "gpt2")); }, "tokenizer.ggml");
}

}  // namespace
}  // namespace tessera::tokenizer
