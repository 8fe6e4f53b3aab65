// Tokenizers with Hugging Face's NFC normalizer (Qwen2-style) and with lstrip / rstrip added
// tokens against HF `tokenizers` (goldens from scripts/gen_nfc_tokenizer_golden.py), through
// tokenizer.json, our own JSON writer and GGUF.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/file_io.h"
#include "formats/gguf.h"
#include "test_util/expect_error.h"
#include "tokenizer/tokenizer.h"

namespace tessera::tokenizer {
namespace {

using nlohmann::json;

const std::string kDir = std::string(TESSERA_SOURCE_DIR) + "/tests/data/tokenizer/";

const json& cases_of(const std::string& file) {
  static const json g = json::parse(read_text_file(kDir + "nfc_strip_golden.json"));
  for (const auto& t : g["tokenizers"])
    if (t["tokenizer"] == file) return t;
  throw std::runtime_error("no goldens for " + file);
}

// HF decodes a non-special added token through its ByteLevel decoder, which mangles one that is
// not ASCII ("cafe\u0301" comes back with U+FFFD): decodes are compared where HF's has no U+FFFD.
// skip_id >= 0: cases whose ids hold that token are left out (GGUF cannot say "match it after
// normalization").
void expect_matches_hf(const tokenizer::Tokenizer& tok, const json& g, int32_t skip_id = -1) {
  ASSERT_GE(g["cases"].size(), 20u);
  EXPECT_EQ(tok.vocab_size(), g["vocab_size"].get<int32_t>());
  size_t checked = 0;
  for (const auto& c : g["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const auto want = c["ids"].get<std::vector<int32_t>>();
    if (std::find(want.begin(), want.end(), skip_id) != want.end()) continue;
    ++checked;
    EXPECT_EQ(tok.encode(text), want)
        << g["tokenizer"] << " text: " << testing::PrintToString(text);
    const std::string decoded = c["decoded"].get<std::string>();
    if (decoded.find("\xEF\xBF\xBD") != std::string::npos) continue;
    EXPECT_EQ(tok.decode(want), decoded) << testing::PrintToString(text);
    EXPECT_EQ(tok.decode(want, true), c["decoded_skip"].get<std::string>())
        << testing::PrintToString(text);
  }
  EXPECT_GE(checked + 5, g["cases"].size());
}

tokenizer::Tokenizer via_gguf(const tokenizer::Tokenizer& t) {
  formats::GgufWriter w;
  t.to_gguf(w);
  return tokenizer::Tokenizer::from_gguf(
      formats::GgufFile::from_memory(w.serialize(), "memory.gguf"));
}

TEST(NfcTokenizer, Qwen2StyleMatchesHuggingFace) {
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::load_json(kDir + "qwen2_nfc.json");
  EXPECT_EQ(tok.pre_tokenizer(), tokenizer::PreTokenizer::qwen2);
  expect_matches_hf(tok, cases_of("qwen2_nfc.json"));
}

TEST(NfcTokenizer, NormalizesBeforeEncoding) {
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::load_json(kDir + "qwen2_nfc.json");
  // Decomposed and precomposed spellings, and the Angstrom sign, encode alike.
  EXPECT_EQ(tok.encode("Ko\xCC\x88ln"), tok.encode("K\xC3\xB6ln"));
  EXPECT_EQ(tok.encode("\xE2\x84\xAB"), tok.encode("\xC3\x85"));
  EXPECT_EQ(tok.encode_ordinary("e\xCC\x81t\xC3\xA9"), tok.encode_ordinary("\xC3\xA9t\xC3\xA9"));
  // The normalized added token "cafe\u0301" matches "café" in either spelling.
  const int32_t cafe = tok.token_id("cafe\xCC\x81");
  ASSERT_GE(cafe, 0);
  EXPECT_EQ(tok.encode("caf\xC3\xA9"), (std::vector<int32_t>{cafe}));
  EXPECT_EQ(tok.encode("cafe\xCC\x81"), (std::vector<int32_t>{cafe}));
  // Bad UTF-8 goes through as bytes, as without a normalizer.
  const std::string bad = "e\xFF\xCC\x81 \xC3";
  EXPECT_EQ(tok.decode(tok.encode(bad)), bad);
}

TEST(NfcTokenizer, JsonRoundTripKeepsNfc) {
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::load_json(kDir + "qwen2_nfc.json");
  const std::string text = tok.to_json_text();
  EXPECT_NE(text.find("\"normalizer\": {\"type\": \"NFC\"}"), std::string::npos);
  expect_matches_hf(tokenizer::Tokenizer::from_json_text(text, "written.json"),
                    cases_of("qwen2_nfc.json"));
}

// GGUF's pre "qwen2" implies NFC (HF's Qwen2 tokenizer has it); GGUF cannot mark an added token
// as normalized, so the cases using one are left out.
TEST(NfcTokenizer, GgufQwen2AppliesNfc) {
  const tokenizer::Tokenizer tok =
      via_gguf(tokenizer::Tokenizer::load_json(kDir + "qwen2_nfc.json"));
  EXPECT_EQ(tok.pre_tokenizer(), tokenizer::PreTokenizer::qwen2);
  expect_matches_hf(tok, cases_of("qwen2_nfc.json"), tok.token_id("cafe\xCC\x81"));
  EXPECT_EQ(tok.encode("Ko\xCC\x88ln"), tok.encode("K\xC3\xB6ln"));
}

// Other byte-level GGUF pre-tokenizers do not normalize.
TEST(NfcTokenizer, GgufLlama3DoesNotNormalize) {
  const tokenizer::Tokenizer tok =
      via_gguf(tokenizer::Tokenizer::load_json(kDir + "llama3_bpe.json"));
  EXPECT_NE(tok.encode("Ko\xCC\x88ln"), tok.encode("K\xC3\xB6ln"));
}

TEST(NfcTokenizer, SequenceOfNfcAndSentencePieceNfc) {
  json j = json::parse(read_text_file(kDir + "qwen2_nfc.json"));
  j["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "NFC"}}})}};
  expect_matches_hf(tokenizer::Tokenizer::from_json_text(j.dump(), "seq.json"),
                    cases_of("qwen2_nfc.json"));

  // SentencePiece-style with NFC ahead of Llama 2's Prepend + Replace, and alone.
  json spm = json::parse(read_text_file(kDir + "spm_legacy.json"));
  auto& items = spm["normalizer"]["normalizers"];
  items.insert(items.begin(), json::object({{"type", "NFC"}}));
  const tokenizer::Tokenizer legacy = tokenizer::Tokenizer::from_json_text(spm.dump(), "spm.json");
  EXPECT_EQ(legacy.encode("cafe\xCC\x81 ok"), legacy.encode("caf\xC3\xA9 ok"));
  const tokenizer::Tokenizer legacy2 =
      tokenizer::Tokenizer::from_json_text(legacy.to_json_text(), "w.json");
  EXPECT_EQ(legacy2.encode("cafe\xCC\x81 ok"), legacy.encode("caf\xC3\xA9 ok"));
  json meta = json::parse(read_text_file(kDir + "spm_bpe.json"));
  meta["normalizer"] = {{"type", "NFC"}};
  const tokenizer::Tokenizer first = tokenizer::Tokenizer::from_json_text(meta.dump(), "meta.json");
  EXPECT_EQ(first.encode("cafe\xCC\x81 ok"), first.encode("caf\xC3\xA9 ok"));
  const tokenizer::Tokenizer first2 =
      tokenizer::Tokenizer::from_json_text(first.to_json_text(), "w.json");
  EXPECT_EQ(first2.encode("cafe\xCC\x81 ok"), first.encode("caf\xC3\xA9 ok"));
}

// Unsupported normalizers stay refused with one line naming the field.
TEST(NfcTokenizer, OtherNormalizersRefused) {
  // The message names the file and the field, on one line.
  auto expect_error = [](const json& j, const std::string& needle) {
    const auto load = [&] { tokenizer::Tokenizer::from_json_text(j.dump(), "bad.json"); };
    test::expect_error(load, "bad.json");
    test::expect_error(load, needle);
  };
  const json base = json::parse(read_text_file(kDir + "qwen2_nfc.json"));
  json j = base;
  j["normalizer"] = {{"type", "NFKC"}};
  expect_error(j, "normalizer.type: unsupported");
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers", json::array({{{"type", "NFC"}}, {{"type", "Lowercase"}}})}};
  expect_error(j, "normalizer.normalizers[1].type");
  j["normalizer"] = "NFC";
  expect_error(j, "normalizer");
  j = base;
  j["added_tokens"][0]["single_word"] = true;
  expect_error(j, "added_tokens[0].single_word");
  j = base;
  j["added_tokens"][0]["rstrip"] = "yes";
  expect_error(j, "added_tokens[0].rstrip");
  json spm = json::parse(read_text_file(kDir + "spm_bpe.json"));
  spm["normalizer"] = {{"type", "NFD"}};
  expect_error(spm, "normalizer");
}

TEST(AddedStrip, MatchesHuggingFace) {
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::load_json(kDir + "added_strip.json");
  expect_matches_hf(tok, cases_of("added_strip.json"));
}

TEST(AddedStrip, JsonRoundTripKeepsFlags) {
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::load_json(kDir + "added_strip.json");
  const std::string text = tok.to_json_text();
  EXPECT_NE(text.find("\"content\": \"<mask>\", \"single_word\": false, \"lstrip\": true, "
                      "\"rstrip\": false"),
            std::string::npos);
  expect_matches_hf(tokenizer::Tokenizer::from_json_text(text, "written.json"),
                    cases_of("added_strip.json"));
}

TEST(AddedStrip, WhitespaceGoesWithTheToken) {
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::load_json(kDir + "added_strip.json");
  const int32_t mask = tok.token_id("<mask>"), end = tok.token_id("<|im_end|>");
  const int32_t both = tok.token_id("[BOTH]");
  EXPECT_EQ(tok.encode(" \t\n <mask>"), (std::vector<int32_t>{mask}));
  EXPECT_EQ(tok.encode("<|im_end|>\n \t"), (std::vector<int32_t>{end}));
  EXPECT_EQ(tok.encode("  [BOTH]\xE3\x80\x80"), (std::vector<int32_t>{both}));  // U+3000
  // lstrip does not reach into what the previous token's rstrip took.
  EXPECT_EQ(tok.encode("<|im_end|>   <mask>"), (std::vector<int32_t>{end, mask}));
  // encode_ordinary sees no added tokens, so nothing is stripped.
  EXPECT_EQ(tok.decode(tok.encode_ordinary(" <mask> ")), " <mask> ");
}

}  // namespace
}  // namespace tessera::tokenizer
