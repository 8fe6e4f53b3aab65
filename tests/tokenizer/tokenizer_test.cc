// Byte-level BPE: round trips on arbitrary bytes, encoding against a naive reference BPE,
// special tokens, chunked pre-tokenization of long texts, and training.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/file_io.h"
#include "core/rng.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"

namespace tessera::tokenizer {
namespace {

const std::string kDir = std::string(TESSERA_SOURCE_DIR) + "/tests/data/tokenizer/";

const tokenizer::Tokenizer& small_tokenizer() {
  static const tokenizer::Tokenizer tok = tokenizer::Tokenizer::load_json(kDir + "tok512.json");
  return tok;
}

std::string random_bytes(Rng& rng, size_t max_len) {
  // Half the bytes from a set rich in structure (so merges fire), half arbitrary (so invalid
  // UTF-8, control bytes and lone continuation bytes appear).
  static const std::string kPool = "the lighthouse keeper 1887 it's  \t\n\xC3\xA9\xE7\x81\xAF<|>";
  std::string s(rng.below(max_len + 1), '\0');
  for (char& c : s)
    c = rng.below(2) ? kPool[rng.below(kPool.size())] : static_cast<char>(rng.below(256));
  return s;
}

TEST(Tokenizer, RoundTripsRandomBytes) {
  const tokenizer::Tokenizer& tok = small_tokenizer();
  Rng rng(1234);
  for (int trial = 0; trial < 5000; ++trial) {
    const std::string s = random_bytes(rng, 64);
    ASSERT_EQ(tok.decode(tok.encode(s)), s) << testing::PrintToString(s);
    ASSERT_EQ(tok.decode(tok.encode_ordinary(s)), s) << testing::PrintToString(s);
  }
}

// Naive BPE as GPT-2 describes it: repeatedly merge the lowest-ranked adjacent pair, leftmost
// first. O(n^2) per word, so only for checking the heap-based encoder. Ranks come from the JSON.
class ReferenceBpe {
 public:
  explicit ReferenceBpe(const tokenizer::Tokenizer& tok) : tok_(tok) {
    const auto j = nlohmann::json::parse(tok.to_json_text());
    const auto& vocab = j["model"]["vocab"];
    int32_t r = 0;
    for (const auto& m : j["model"]["merges"]) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      rank_[{vocab[s.substr(0, sp)].get<int32_t>(), vocab[s.substr(sp + 1)].get<int32_t>()}] = r++;
    }
  }
  std::vector<int32_t> encode(std::string_view text) const {
    std::vector<std::string_view> pieces;
    tokenizer::pretokenize(text, &pieces);
    std::vector<int32_t> out;
    for (const auto piece : pieces) {
      std::vector<int32_t> w;
      for (const char c : piece) w.push_back(tok_.token_id(std::string(1, c)));
      while (w.size() > 1) {
        size_t best = 0;
        int32_t best_rank = -1;
        for (size_t i = 0; i + 1 < w.size(); ++i) {
          const auto it = rank_.find({w[i], w[i + 1]});
          if (it != rank_.end() && (best_rank < 0 || it->second < best_rank))
            best = i, best_rank = it->second;
        }
        if (best_rank < 0) break;
        w[best] = tok_.token_id(tok_.decode_token(w[best]) + tok_.decode_token(w[best + 1]));
        w.erase(w.begin() + best + 1);
      }
      out.insert(out.end(), w.begin(), w.end());
    }
    return out;
  }

 private:
  const tokenizer::Tokenizer& tok_;
  std::map<std::pair<int32_t, int32_t>, int32_t> rank_;
};

TEST(Tokenizer, MatchesReferenceBpe) {
  const tokenizer::Tokenizer& tok = small_tokenizer();
  const ReferenceBpe ref(tok);
  Rng rng(99);
  for (int trial = 0; trial < 300; ++trial) {
    const std::string s = random_bytes(rng, 200);
    ASSERT_EQ(tok.encode_ordinary(s), ref.encode(s)) << testing::PrintToString(s);
  }
  // Long single words exercise the heap (many candidate merges in one word).
  const std::string long_word(5000, 'a');
  EXPECT_EQ(tok.encode_ordinary(long_word), ref.encode(long_word));
  const std::string text = read_text_file(kDir + "train.txt");
  EXPECT_EQ(tok.encode_ordinary(text), ref.encode(text));
}

// Texts past the 64 KiB pre-tokenization chunk split only where the pattern splits anyway.
TEST(Tokenizer, LongTextEqualsUnchunkedReference) {
  const tokenizer::Tokenizer& tok = small_tokenizer();
  const ReferenceBpe ref(tok);
  Rng rng(5);
  std::string text;
  while (text.size() < 300000) {
    text += random_bytes(rng, 80);
    const char* kJoins[] = {"\n", "a\nb", "  \n\n  x", "\n \n", ".\n,"};
    text += kJoins[rng.below(5)];
  }
  EXPECT_EQ(tok.encode_ordinary(text), ref.encode(text));
  EXPECT_EQ(tok.decode(tok.encode(text)), text);
}

TEST(Tokenizer, SpecialTokens) {
  const tokenizer::Tokenizer& tok = small_tokenizer();
  const int32_t eot = tok.eot_token();
  ASSERT_EQ(eot, 511);
  EXPECT_EQ(tok.token_id("<|endoftext|>"), eot);
  EXPECT_EQ(tok.decode_token(eot), "<|endoftext|>");
  EXPECT_EQ(tok.encode("<|endoftext|>"), std::vector<int32_t>{eot});
  const auto a = tok.encode_ordinary("x y");
  std::vector<int32_t> want = a;
  want.push_back(eot);
  want.push_back(eot);
  for (const int32_t id : a) want.push_back(id);
  EXPECT_EQ(tok.encode("x y<|endoftext|><|endoftext|>x y"), want);
  // encode_ordinary treats the special's text as plain bytes.
  const auto plain = tok.encode_ordinary("<|endoftext|>");
  EXPECT_GT(plain.size(), 1u);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), eot), 0);
  EXPECT_EQ(tok.decode(plain), "<|endoftext|>");
  // A partial special is ordinary text.
  EXPECT_EQ(tok.encode("<|endoftext|"), tok.encode_ordinary("<|endoftext|"));
}

TEST(Tokenizer, LongestSpecialWinsAtSamePosition) {
  const tokenizer::Tokenizer tok =
      tokenizer::Tokenizer::train_bpe("ab ab ab", 256 + 3, {"<s>", "<s>x", "<q>"});
  const int32_t s = tok.token_id("<s>"), sx = tok.token_id("<s>x"), q = tok.token_id("<q>");
  // No room for merges: the specials take ids 256.. in the order given.
  ASSERT_EQ(s, 256);
  ASSERT_EQ(sx, 257);
  ASSERT_EQ(q, 258);
  const auto ids = tok.encode("<s>x<s><q>");
  EXPECT_EQ(ids, (std::vector<int32_t>{sx, s, q}));
}

TEST(Tokenizer, DecodeRejectsBadIds) {
  const tokenizer::Tokenizer& tok = small_tokenizer();
  EXPECT_THROW(tok.decode({1, 512}), Error);
  EXPECT_THROW(tok.decode({-1}), Error);
  EXPECT_THROW(tok.decode_token(100000), Error);
  EXPECT_EQ(tok.token_id("no such token"), -1);
  const tokenizer::Tokenizer empty;
  EXPECT_EQ(empty.vocab_size(), 0);
  EXPECT_THROW(empty.encode("x"), Error);
  EXPECT_THROW(empty.encode_ordinary("x"), Error);
  EXPECT_EQ(empty.eot_token(), -1);
}

TEST(Train, ByteTokensMergesThenSpecials) {
  const std::string text = read_text_file(kDir + "train.txt");
  const tokenizer::Tokenizer tok =
      tokenizer::Tokenizer::train_bpe(text, 300, {"<|endoftext|>", "<pad>"});
  ASSERT_EQ(tok.vocab_size(), 300);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(tok.decode_token(b), std::string(1, char(b)));
  EXPECT_EQ(tok.decode_token(298), "<|endoftext|>");
  EXPECT_EQ(tok.decode_token(299), "<pad>");
  EXPECT_EQ(tok.eot_token(), 298);
  // The first merge is the most frequent pair in the text: " t" (as in " the").
  EXPECT_EQ(tok.decode_token(256), " t");
  // Every merged token is the concatenation of earlier tokens, and merges compress the text.
  EXPECT_LT(tok.encode(text).size(), text.size() * 3 / 4);
  EXPECT_EQ(tok.decode(tok.encode(text)), text);
}

TEST(Train, SaveLoadGivesIdenticalEncodings) {
  Rng rng(3);
  std::string text = read_text_file(kDir + "train.txt");
  for (int i = 0; i < 200; ++i) text += random_bytes(rng, 40);
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::train_bpe(text, 700);
  const std::string path = std::string(TESSERA_BINARY_DIR) + "/tokenizer_test_save.json";
  tok.save_json(path);
  const tokenizer::Tokenizer back = tokenizer::Tokenizer::load_json(path);
  EXPECT_EQ(back.vocab_size(), tok.vocab_size());
  EXPECT_EQ(back.to_json_text(), tok.to_json_text());
  for (int trial = 0; trial < 500; ++trial) {
    const std::string s = random_bytes(rng, 100) + "<|endoftext|>" + random_bytes(rng, 20);
    ASSERT_EQ(back.encode(s), tok.encode(s));
  }
}

TEST(Train, Deterministic) {
  Rng rng(11);
  std::string text;
  for (int i = 0; i < 300; ++i) text += random_bytes(rng, 30);
  EXPECT_EQ(tokenizer::Tokenizer::train_bpe(text, 600).to_json_text(),
            tokenizer::Tokenizer::train_bpe(text, 600).to_json_text());
}

TEST(Train, StopsWhenNoPairsRemain) {
  // "ab" has one pair: one merge, then nothing to merge; specials still come last.
  const tokenizer::Tokenizer tok = tokenizer::Tokenizer::train_bpe("ab", 1000);
  EXPECT_EQ(tok.vocab_size(), 256 + 1 + 1);
  EXPECT_EQ(tok.decode_token(256), "ab");
  EXPECT_EQ(tok.eot_token(), 257);
}

TEST(Train, MergesAcrossRepeatsCountCorrectly) {
  // Overlapping pairs: "aaaa" has (a,a) three times but merges to two "aa" tokens; the next
  // merge must then be (aa, aa) with the word's count, not a stale (a, a).
  const tokenizer::Tokenizer tok =
      tokenizer::Tokenizer::train_bpe("aaaa aaaa aaaa", 256 + 4, {"<|endoftext|>"});
  EXPECT_EQ(tok.decode_token(256), "aa");
  EXPECT_EQ(tok.decode_token(257), "aaaa");
  EXPECT_EQ(tok.encode("aaaa"), std::vector<int32_t>{257});
}

TEST(Train, RejectsBadArguments) {
  EXPECT_THROW(tokenizer::Tokenizer::train_bpe("abc", 256), Error);  // no room for the special
  EXPECT_THROW(tokenizer::Tokenizer::train_bpe("abc", 300, {""}), Error);
  EXPECT_THROW(tokenizer::Tokenizer::train_bpe("abc", 300, {"<x>", "<x>"}), Error);
  EXPECT_THROW(tokenizer::Tokenizer::train_bpe("abc", 300, {"\xFF"}),
               Error);                                                      // not storable in JSON
  EXPECT_THROW(tokenizer::Tokenizer::train_bpe("abc", 300, {"q"}), Error);  // same bytes as a token
  EXPECT_NO_THROW(tokenizer::Tokenizer::train_bpe("abc", 256, {}));
}

}  // namespace
}  // namespace tessera::tokenizer
