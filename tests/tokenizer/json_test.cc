// tokenizer.json reading: GPT-2-style layouts load, and hostile files fail with one-line errors
// that name the file and the field.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/file_io.h"
#include "core/rng.h"
#include "test_util/expect_error.h"
#include "tokenizer/tokenizer.h"

namespace tessera::tokenizer {
namespace {

using nlohmann::json;

const std::string kDir = std::string(TESSERA_SOURCE_DIR) + "/tests/data/tokenizer/";

json base() {
  return json::parse(read_text_file(kDir + "tok512.json"));
}

// Loads `text` as file "bad.json" and expects an Error whose single line names the file and
// contains `needle` (the field or the reason).
void expect_error(const std::string& text, const std::string& needle) {
  const auto load = [&] { tokenizer::Tokenizer::from_json_text(text, "bad.json"); };
  test::expect_error(load, "bad.json");
  test::expect_error(load, needle);
}

void expect_error(const std::function<void(json&)>& edit, const std::string& needle) {
  json j = base();
  edit(j);
  expect_error(j.dump(), needle);
}

TEST(TokenizerJson, BaseLoads) {
  EXPECT_EQ(tokenizer::Tokenizer::from_json_text(base().dump(), "ok.json").vocab_size(), 512);
}

TEST(TokenizerJson, NotJsonOrWrongShape) {
  expect_error("{\"model\": ", "not valid JSON");
  expect_error("[1, 2]", "(root)");
  expect_error("{\"model\": {\"vocab\": {}} ,}", "not valid JSON");
  expect_error([](json& j) { j.erase("model"); }, "model: missing");
  expect_error([](json& j) { j["model"] = 3; }, "model: expected an object");
}

TEST(TokenizerJson, UnsupportedComponents) {
  expect_error([](json& j) { j["model"]["type"] = "WordPiece"; }, "model.type");
  expect_error([](json& j) { j["normalizer"] = {{"type", "NFKC"}}; }, "normalizer.type");
  expect_error([](json& j) { j.erase("pre_tokenizer"); }, "pre_tokenizer");
  expect_error([](json& j) { j["pre_tokenizer"]["type"] = "Whitespace"; }, "pre_tokenizer.type");
  expect_error([](json& j) { j["pre_tokenizer"]["add_prefix_space"] = true; },
               "pre_tokenizer.add_prefix_space");
  expect_error([](json& j) { j["pre_tokenizer"]["use_regex"] = false; }, "pre_tokenizer.use_regex");
  expect_error([](json& j) { j["pre_tokenizer"]["use_regex"] = "yes"; }, "pre_tokenizer.use_regex");
  expect_error([](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }, "decoder.type");
  expect_error([](json& j) { j["model"]["dropout"] = 0.1; }, "model.dropout");
  expect_error([](json& j) { j["model"]["continuing_subword_prefix"] = "##"; },
               "model.continuing_subword_prefix");
  expect_error([](json& j) { j["model"]["end_of_word_suffix"] = 5; }, "model.end_of_word_suffix");
}

TEST(TokenizerJson, BadVocab) {
  expect_error([](json& j) { j["model"]["vocab"] = json::array(); }, "model.vocab");
  expect_error([](json& j) { j["model"]["vocab"]["!"] = "0"; }, "model.vocab[\"!\"]");
  expect_error([](json& j) { j["model"]["vocab"]["!"] = -1; }, "out of range");
  expect_error([](json& j) { j["model"]["vocab"]["!"] = 1.5; }, "expected an integer id");
  expect_error([](json& j) { j["model"]["vocab"]["!"] = 99999999999LL; }, "out of range");
  expect_error([](json& j) { j["model"]["vocab"]["!"] = 1; }, "used twice");
  // A hole in the ids: removing "!" (id 33 = '!') leaves id 33 unused.
  expect_error([](json& j) { j["model"]["vocab"].erase("!"); }, "not contiguous");
}

// A vocabulary string outside GPT-2's byte alphabet (Command-R's tokenizer.json holds raw emoji)
// loads as a token that encoding never produces and that decodes to the string itself.
TEST(TokenizerJson, TokenOutsideTheByteAlphabetIsVerbatim) {
  json j = base();
  const auto id = static_cast<int32_t>(j["model"]["vocab"].size());
  j["model"]["vocab"]["\u4e2d"] = id;
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::from_json_text(j.dump(), "t.json");
  const tokenizer::Tokenizer plain = tokenizer::Tokenizer::from_json_text(base().dump(), "p.json");
  EXPECT_EQ(tok.decode_token(id), "\u4e2d");
  EXPECT_EQ(tok.encode_ordinary("a\u4e2d"), plain.encode_ordinary("a\u4e2d"));
  EXPECT_EQ(json::parse(tok.to_json_text())["model"]["vocab"]["\u4e2d"], id);
}

// A byte without a token is dropped by encoding, as Hugging Face does (SmolLM2 lacks 21 bytes).
TEST(TokenizerJson, MissingByteTokenIsDropped) {
  json j = base();
  const json id = j["model"]["vocab"]["!"];
  j["model"]["vocab"].erase("!");
  j["model"]["vocab"]["!!!!!!!"] = id;
  j["model"]["merges"] = json::array();
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::from_json_text(j.dump(), "ok.json");
  EXPECT_EQ(tok.decode(tok.encode("a!b!")), "ab");
  EXPECT_EQ(tok.decode(tok.encode("!")), "");
}

TEST(TokenizerJson, BadMerges) {
  expect_error([](json& j) { j["model"]["merges"] = "a b"; }, "model.merges");
  expect_error([](json& j) { j["model"]["merges"][0] = "ab"; }, "model.merges[0]");
  expect_error([](json& j) { j["model"]["merges"][0] = "a b c"; }, "model.merges[0]");
  expect_error(
      [](json& j) {
        j["model"]["merges"][0] = json::array({"a", "b", "c"});
      },
      "model.merges[0]");
  expect_error(
      [](json& j) {
        j["model"]["merges"][0] = json::array({"a", 7});
      },
      "model.merges[0][1]");
  expect_error([](json& j) { j["model"]["merges"][3] = 42; }, "model.merges[3]");
  expect_error([](json& j) { j["model"]["merges"][0] = "Ġ nosuch"; }, "is not in model.vocab");
  // Both halves exist but their concatenation is not a token.
  expect_error([](json& j) { j["model"]["merges"][0] = "z q"; }, "joins to a token");
  expect_error([](json& j) { j["model"]["merges"][5] = j["model"]["merges"][2]; },
               "repeats an earlier merge");
  expect_error([](json& j) { j["model"]["merges"][0] = "<|endoftext|> a"; }, "model.merges[0]");
}

TEST(TokenizerJson, BadAddedTokens) {
  expect_error([](json& j) { j["added_tokens"] = json::object(); }, "added_tokens");
  expect_error([](json& j) { j["added_tokens"][0]["id"] = 600; }, "added_tokens[0].id");
  expect_error([](json& j) { j["added_tokens"][0].erase("content"); }, "added_tokens[0].content");
  expect_error([](json& j) { j["added_tokens"][0]["content"] = ""; }, "added_tokens[0].content");
  expect_error([](json& j) { j["added_tokens"][0]["single_word"] = true; },
               "added_tokens[0].single_word");
  expect_error([](json& j) { j["added_tokens"][0]["lstrip"] = 1; }, "added_tokens[0].lstrip");
  expect_error([](json& j) { j["added_tokens"][0]["special"] = "yes"; }, "added_tokens[0].special");
  // The added token's id names a different vocab entry.
  expect_error([](json& j) { j["added_tokens"][0]["id"] = 5; }, "is added token");
  expect_error(
      [](json& j) {
        j["added_tokens"].push_back(j["added_tokens"][0]);
        j["added_tokens"][1]["content"] = "<other>";
      },
      "bad.json");
}

// HF files need not number byte tokens by byte value (GPT-2's id 0 is "!"), nor list merges as
// strings, nor keep the added token in the model vocabulary: a permuted, pair-merge,
// vocab-without-special variant encodes to the permuted ids.
TEST(TokenizerJson, GeneralLayoutLoads) {
  const json j = base();
  std::vector<int32_t> perm(511);
  std::iota(perm.begin(), perm.end(), 0);
  Rng rng(2);
  for (size_t i = perm.size() - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
  json k = j;
  k["model"]["vocab"] = json::object();
  for (auto it = j["model"]["vocab"].begin(); it != j["model"]["vocab"].end(); ++it) {
    const int32_t id = it.value().get<int32_t>();
    if (id < 511) k["model"]["vocab"][it.key()] = perm[id];
  }
  k["model"]["merges"] = json::array();
  for (const auto& m : j["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    k["model"]["merges"].push_back({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
  }
  k["model"].erase("dropout");  // optional fields may be absent
  k.erase("decoder");
  const tokenizer::Tokenizer a = tokenizer::Tokenizer::from_json_text(j.dump(), "a.json");
  const tokenizer::Tokenizer b = tokenizer::Tokenizer::from_json_text(k.dump(), "b.json");
  const std::string text = read_text_file(kDir + "train.txt") + "<|endoftext|>\xFF tail";
  std::vector<int32_t> want = a.encode(text);
  for (int32_t& id : want) id = id < 511 ? perm[id] : id;
  EXPECT_EQ(b.encode(text), want);
  EXPECT_EQ(b.decode(want), text);
  EXPECT_EQ(b.eot_token(), 511);
}

// Real-model layouts (tests/data/tokenizer/*.json from gen_real_tokenizer_golden.py) with one
// component changed to something unsupported.
TEST(TokenizerJson, UnsupportedRealLayouts) {
  auto edited = [](const char* file, const std::function<void(json&)>& edit,
                   const std::string& needle) {
    json j = json::parse(read_text_file(kDir + file));
    edit(j);
    expect_error(j.dump(), needle);
  };
  const std::string seq0 = "pre_tokenizer.pretokenizers[0]";
  edited(
      "llama3_bpe.json",
      [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+"; },
      seq0 + ".pattern");
  edited(
      "llama3_bpe.json",
      [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; },
      seq0 + ".behavior");
  edited(
      "llama3_bpe.json",
      [](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = true; },
      "pre_tokenizer.pretokenizers[1].use_regex");
  edited(
      "llama3_bpe.json",
      [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["type"] = "Punctuation"; },
      seq0 + ".type");
  edited(
      "llama3_bpe.json",
      [](json& j) { j["pre_tokenizer"]["pretokenizers"].push_back(json::object()); },
      "pre_tokenizer.pretokenizers");
  edited(
      "tok512.json",
      [](json& j) {
        j["pre_tokenizer"] = {
            {"type", "Sequence"},
            {"pretokenizers",
             {{{"type", "Digits"}, {"individual_digits", false}}, j["pre_tokenizer"]}}};
      },
      seq0 + ".individual_digits");
  edited(
      "spm_bpe.json",
      [](json& j) {
        j["normalizer"] = {{"type", "NFKC"}};
      },
      "normalizer");
  edited(
      "spm_bpe.json", [](json& j) { j["pre_tokenizer"]["replacement"] = "_"; },
      "pre_tokenizer.replacement");
  edited(
      "spm_bpe.json", [](json& j) { j["pre_tokenizer"]["prepend_scheme"] = "sometimes"; },
      "pre_tokenizer.prepend_scheme");
  edited(
      "spm_bpe.json", [](json& j) { j["pre_tokenizer"] = nullptr; }, "normalizer");
  edited(
      "spm_bpe.json", [](json& j) { j["model"]["unk_token"] = "<nosuch>"; }, "model.unk_token");
  edited(
      "spm_bpe.json",
      [](json& j) {
        j["decoder"] = {{"type", "WordPiece"}};
      },
      "decoder.type");
  edited(
      "spm_legacy.json",
      [](json& j) {
        j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}};
      },
      "pre_tokenizer.prepend_scheme");
}

TEST(TokenizerJson, MissingFileNamesPath) {
  try {
    tokenizer::Tokenizer::load_json("/nonexistent/tokenizer.json");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/tokenizer.json"), std::string::npos);
  }
}

}  // namespace
}  // namespace tessera::tokenizer
