// Real-model tokenizers against Hugging Face `tokenizers` (goldens from
// scripts/gen_real_tokenizer_golden.py): SmolLM2 from its GGUF metadata and tokenizer.json, a
// Llama-3-style and a Qwen2-style byte-level BPE, SentencePiece-style byte-fallback BPE (Metaspace
// and legacy layouts), the pre-tokenizer variants piece by piece, and GGUF/JSON round trips.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/file_io.h"
#include "formats/gguf.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"

namespace tessera::tokenizer {
namespace {

const std::string kDir = std::string(TESSERA_SOURCE_DIR) + "/tests/data/tokenizer/";

const nlohmann::json& golden() {
  static const nlohmann::json g = nlohmann::json::parse(read_text_file(kDir + "real_golden.json"));
  return g;
}

const nlohmann::json& cases_of(const std::string& tokenizer_file) {
  for (const auto& t : golden()["tokenizers"])
    if (t["tokenizer"] == tokenizer_file) return t;
  throw std::runtime_error("no goldens for " + tokenizer_file);
}

void expect_matches_hf(const tokenizer::Tokenizer& tok, const nlohmann::json& g) {
  ASSERT_GE(g["cases"].size(), 50u);
  EXPECT_EQ(tok.vocab_size(), g["vocab_size"].get<int32_t>());
  for (const auto& c : g["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const auto want = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text), want)
        << g["tokenizer"] << " text: " << testing::PrintToString(text);
    EXPECT_EQ(tok.decode(want), c["decoded"].get<std::string>()) << testing::PrintToString(text);
    EXPECT_EQ(tok.decode(want, true), c["decoded_skip"].get<std::string>())
        << testing::PrintToString(text);
  }
}

tokenizer::Tokenizer smollm2_from_gguf() {
  return tokenizer::Tokenizer::from_gguf(formats::GgufFile(kDir + "smollm2.gguf"));
}

tokenizer::Tokenizer via_gguf(const tokenizer::Tokenizer& t) {
  formats::GgufWriter w;
  t.to_gguf(w);
  return tokenizer::Tokenizer::from_gguf(
      formats::GgufFile::from_memory(w.serialize(), "memory.gguf"));
}

TEST(RealTokenizer, SmolLM2FromGgufMatchesHuggingFace) {
  expect_matches_hf(smollm2_from_gguf(), cases_of("smollm2.json"));
}

TEST(RealTokenizer, SmolLM2JsonMatchesHuggingFace) {
  expect_matches_hf(tokenizer::Tokenizer::load_json(kDir + "smollm2.json"),
                    cases_of("smollm2.json"));
}

TEST(RealTokenizer, SmolLM2SpecialTokens) {
  const tokenizer::Tokenizer tok = smollm2_from_gguf();
  EXPECT_EQ(tok.model(), tokenizer::TokenizerModel::byte_level_bpe);
  EXPECT_EQ(tok.pre_tokenizer(), tokenizer::PreTokenizer::smollm);
  EXPECT_EQ(tok.vocab_size(), 49152);
  const tokenizer::SpecialTokens& s = tok.special_tokens();
  EXPECT_EQ(s.bos, 1);
  EXPECT_EQ(s.eos, 2);
  EXPECT_EQ(s.unk, 0);
  EXPECT_EQ(s.pad, 2);
  EXPECT_EQ(s.eot, 2);  // <|im_end|>
  EXPECT_FALSE(s.add_bos);
  EXPECT_EQ(tok.eot_token(), 0);  // <|endoftext|>
  EXPECT_EQ(tok.end_of_generation_tokens(), (std::vector<int32_t>{0, 2}));
  EXPECT_TRUE(tok.is_end_of_generation(2));
  EXPECT_FALSE(tok.is_end_of_generation(1));
  EXPECT_TRUE(tok.is_special(1));
  EXPECT_FALSE(tok.is_special(100));
  EXPECT_EQ(tok.decode_token(2), "<|im_end|>");
  EXPECT_EQ(tok.token_id("<|im_start|>"), 1);
  // encode_ordinary treats the markers as text.
  EXPECT_EQ(tok.encode("<|im_start|>"), (std::vector<int32_t>{1}));
  EXPECT_GT(tok.encode_ordinary("<|im_start|>").size(), 1u);
  EXPECT_EQ(tok.decode(tok.encode_ordinary("<|im_start|>")), "<|im_start|>");
}

TEST(RealTokenizer, SmolLM2GgufAndJsonRoundTrips) {
  const tokenizer::Tokenizer tok = smollm2_from_gguf();
  expect_matches_hf(via_gguf(tok), cases_of("smollm2.json"));
  expect_matches_hf(tokenizer::Tokenizer::from_json_text(tok.to_json_text(), "written.json"),
                    cases_of("smollm2.json"));
  const tokenizer::Tokenizer back = via_gguf(tok);
  EXPECT_EQ(back.end_of_generation_tokens(), tok.end_of_generation_tokens());
  EXPECT_EQ(back.special_tokens().bos, 1);
}

// A byte-level BPE from tokenizer.json, with the pre-tokenizer `pre`, matches HF as loaded, after
// a trip through GGUF metadata, and after a trip through our own tokenizer.json writer.
tokenizer::Tokenizer expect_byte_level_matches_hf(const std::string& file,
                                                  tokenizer::PreTokenizer pre) {
  tokenizer::Tokenizer tok = tokenizer::Tokenizer::load_json(kDir + file);
  EXPECT_EQ(tok.pre_tokenizer(), pre) << file;
  expect_matches_hf(tok, cases_of(file));
  expect_matches_hf(via_gguf(tok), cases_of(file));
  expect_matches_hf(tokenizer::Tokenizer::from_json_text(tok.to_json_text(), "w.json"),
                    cases_of(file));
  return tok;
}

TEST(RealTokenizer, Llama3StyleMatchesHuggingFace) {
  const tokenizer::Tokenizer tok =
      expect_byte_level_matches_hf("llama3_bpe.json", tokenizer::PreTokenizer::llama3);
  EXPECT_EQ(tok.special_tokens().bos, 0);  // <|begin_of_text|>
  EXPECT_EQ(tok.special_tokens().eot, 4);  // <|eot_id|>
  EXPECT_EQ(tok.end_of_generation_tokens(), (std::vector<int32_t>{1, 4}));
}

// Qwen2's split (digits one by one) behind an NFC normalizer.
TEST(RealTokenizer, Qwen2StyleMatchesHuggingFace) {
  expect_byte_level_matches_hf("qwen2_bpe.json", tokenizer::PreTokenizer::qwen2);
}

TEST(RealTokenizer, SentencePieceMetaspaceMatchesHuggingFace) {
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::load_json(kDir + "spm_bpe.json");
  EXPECT_EQ(tok.model(), tokenizer::TokenizerModel::sentencepiece_bpe);
  expect_matches_hf(tok, cases_of("spm_bpe.json"));
  expect_matches_hf(tokenizer::Tokenizer::from_json_text(tok.to_json_text(), "w.json"),
                    cases_of("spm_bpe.json"));
  EXPECT_EQ(tok.special_tokens().unk, 0);
  EXPECT_EQ(tok.special_tokens().bos, 1);
  EXPECT_EQ(tok.special_tokens().eos, 2);
  EXPECT_EQ(tok.decode_token(tok.token_id("<0x41>")), "A");
}

TEST(RealTokenizer, SentencePieceLegacyMatchesHuggingFace) {
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::load_json(kDir + "spm_legacy.json");
  expect_matches_hf(tok, cases_of("spm_legacy.json"));
  expect_matches_hf(tokenizer::Tokenizer::from_json_text(tok.to_json_text(), "w.json"),
                    cases_of("spm_legacy.json"));
  // GGUF "llama" prefixes every segment (llama.cpp), as the legacy normalizer does; merges and
  // scores are both written, and our reader uses the merges.
  expect_matches_hf(via_gguf(tok), cases_of("spm_legacy.json"));
  expect_matches_hf(via_gguf(tokenizer::Tokenizer::load_json(kDir + "spm_bpe.json")),
                    cases_of("spm_legacy.json"));
}

TEST(RealTokenizer, RoundTripsWhereHuggingFaceDoes) {
  for (const char* file :
       {"smollm2.json", "llama3_bpe.json", "qwen2_bpe.json", "spm_bpe.json", "spm_legacy.json"}) {
    const tokenizer::Tokenizer tok = tokenizer::Tokenizer::load_json(kDir + file);
    for (const auto& c : cases_of(file)["cases"]) {
      const std::string text = c["text"].get<std::string>();
      if (c["decoded"] != text) continue;  // HF's own decode differs (legacy prefix per segment)
      EXPECT_EQ(tok.decode(tok.encode(text)), text) << file << ": " << testing::PrintToString(text);
    }
  }
}

TEST(RealTokenizer, PreTokenizerPiecesMatchHuggingFace) {
  const auto& p = golden()["pieces"];
  const auto cases = p["cases"].get<std::vector<std::string>>();
  for (const auto& [name, kind] : std::vector<std::pair<std::string, tokenizer::PreTokenizer>>{
           {"gpt2", tokenizer::PreTokenizer::gpt2},
           {"smollm", tokenizer::PreTokenizer::smollm},
           {"llama3", tokenizer::PreTokenizer::llama3},
           {"qwen2", tokenizer::PreTokenizer::qwen2}}) {
    for (size_t k = 0; k < cases.size(); ++k) {
      std::vector<std::string_view> pieces;
      tokenizer::pretokenize(kind, cases[k], &pieces);
      std::vector<std::string> mapped;
      for (const auto piece : pieces) mapped.push_back(tokenizer::bytes_to_vocab_string(piece));
      EXPECT_EQ(mapped, p[name][k].get<std::vector<std::string>>())
          << name << ": " << testing::PrintToString(cases[k]);
    }
  }
}

}  // namespace
}  // namespace tessera::tokenizer
