// BPE training: count pre-token words, then repeatedly merge the most frequent adjacent pair,
// updating pair counts incrementally (only words containing the pair are touched) with a
// max-heap of candidate pairs that is invalidated lazily.
#include <algorithm>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"
#include "unicode/char_class.h"

namespace tessera::tokenizer {
namespace {

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    unicode::CharClass c;
    const int len = unicode::next_char(s, i, &c);
    if (len == 1 && static_cast<uint8_t>(s[i]) >= 0x80) return false;
    i += len;
  }
  return true;
}

uint64_t pair_key(int32_t a, int32_t b) {
  return (uint64_t{static_cast<uint32_t>(a)} << 32) | static_cast<uint32_t>(b);
}
int32_t pair_left(uint64_t k) {
  return static_cast<int32_t>(k >> 32);
}
int32_t pair_right(uint64_t k) {
  return static_cast<int32_t>(k & 0xffffffffu);
}

struct Word {
  std::vector<int32_t> syms;
  int64_t count = 0;
  int32_t stamp = -1;  // last merge that processed this word (dedupes the occurrence lists)
};

}  // namespace

Tokenizer Tokenizer::train_bpe(std::string_view text, int32_t vocab_size,
                               const std::vector<std::string>& specials) {
  const auto n_specials = static_cast<int64_t>(specials.size());
  TS_CHECK(vocab_size >= 256 + n_specials && vocab_size <= (1 << 24),
           "[tokenizer] train_bpe: vocab_size must be in [256 + ", n_specials,
           " specials, 2^24], got ", vocab_size);
  for (size_t k = 0; k < specials.size(); ++k) {
    TS_CHECK(!specials[k].empty(), "[tokenizer] train_bpe: special token ", k, " is empty");
    TS_CHECK(valid_utf8(specials[k]), "[tokenizer] train_bpe: special token ", k,
             " is not valid UTF-8 (tokenizer.json could not store it)");
    for (size_t j = 0; j < k; ++j)
      TS_CHECK(specials[j] != specials[k], "[tokenizer] train_bpe: special token '", specials[k],
               "' is listed twice");
  }

  // 1. Unique pre-token words with counts. Specials in the text are cut out first so that no
  // merge learns across or inside them.
  std::unordered_map<std::string_view, int64_t> word_counts;
  {
    std::vector<std::string_view> pieces;
    size_t from = 0;
    while (from <= text.size()) {
      size_t at = text.size(), len = 0;
      for (const std::string& s : specials) {
        const size_t p = text.find(s, from);
        if (p != std::string_view::npos && (p < at || (p == at && s.size() > len)))
          at = p, len = s.size();
      }
      pieces.clear();
      pretokenize(text.substr(from, at - from), &pieces);
      for (const std::string_view w : pieces) ++word_counts[w];
      if (at == text.size()) break;
      from = at + len;
    }
  }
  std::vector<std::string_view> keys;
  keys.reserve(word_counts.size());
  for (const auto& [w, c] : word_counts) keys.push_back(w);
  std::sort(keys.begin(), keys.end());  // fixed word order: results never depend on hashing
  std::vector<Word> words(keys.size());
  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<int32_t>> where;  // pair -> words (may hold extras)
  for (size_t w = 0; w < keys.size(); ++w) {
    words[w].count = word_counts[keys[w]];
    for (const char ch : keys[w]) words[w].syms.push_back(static_cast<uint8_t>(ch));
    const auto& s = words[w].syms;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      const uint64_t k = pair_key(s[i], s[i + 1]);
      pair_count[k] += words[w].count;
      auto& list = where[k];
      if (list.empty() || list.back() != static_cast<int32_t>(w))
        list.push_back(static_cast<int32_t>(w));
    }
  }

  // 2. Merge loop. Heap order: higher count first; ties go to the lexicographically smaller
  // (left bytes, right bytes), so training is deterministic.
  std::vector<std::string> tok(256);
  for (int b = 0; b < 256; ++b) tok[b] = std::string(1, static_cast<char>(b));
  struct Entry {
    int64_t count;
    uint64_t pair;
  };
  auto lower = [&tok](const Entry& x, const Entry& y) {
    if (x.count != y.count) return x.count < y.count;
    const int c = tok[pair_left(x.pair)].compare(tok[pair_left(y.pair)]);
    if (c != 0) return c > 0;
    return tok[pair_right(x.pair)] > tok[pair_right(y.pair)];
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(lower)> heap(lower);
  for (const auto& [k, c] : pair_count) heap.push({c, k});

  std::vector<std::pair<int32_t, int32_t>> merges;
  const int64_t target_merges = vocab_size - n_specials - 256;
  std::vector<uint64_t> changed;
  while (static_cast<int64_t>(merges.size()) < target_merges && !heap.empty()) {
    const Entry top = heap.top();
    heap.pop();
    const auto pc = pair_count.find(top.pair);
    if (pc == pair_count.end() || pc->second != top.count || top.count <= 0) continue;  // stale
    const int32_t a = pair_left(top.pair), b = pair_right(top.pair);
    const auto c = static_cast<int32_t>(tok.size());
    tok.push_back(tok[a] + tok[b]);
    merges.emplace_back(a, b);
    const auto stamp = static_cast<int32_t>(merges.size());
    changed.clear();
    std::vector<int32_t> list = std::move(where[top.pair]);
    where.erase(top.pair);
    for (const int32_t w : list) {
      Word& word = words[w];
      if (word.stamp == stamp) continue;
      word.stamp = stamp;
      auto& s = word.syms;
      // The pair `from` loses this word's occurrences to `to`, which this word now contains.
      auto move_pair = [&](uint64_t from, uint64_t to) {
        pair_count[from] -= word.count;
        pair_count[to] += word.count;
        changed.push_back(from);
        changed.push_back(to);
        where[to].push_back(w);
      };
      // Replace each non-overlapping (a, b), left to right, fixing the counts of the pairs
      // around it: (x, a) (a, b) (b, y) become (x, c) (c, y).
      size_t out = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          if (out > 0) {
            const int32_t x = s[out - 1];
            // When x is a c made just before, (c, a) was counted as (b, a) in the old word.
            move_pair(pair_key(x == c ? b : x, a), pair_key(x, c));
          }
          if (i + 2 < s.size()) {
            const int32_t y = s[i + 2];
            // A following (a, b) is merged next; its (b, a) link is removed there.
            if (!(y == a && i + 3 < s.size() && s[i + 3] == b)) {
              move_pair(pair_key(b, y), pair_key(c, y));
            }
          }
          pair_count[top.pair] -= word.count;
          s[out++] = c;
          ++i;
        } else {
          s[out++] = s[i];
        }
      }
      s.resize(out);
    }
    pair_count.erase(top.pair);
    std::sort(changed.begin(), changed.end());
    changed.erase(std::unique(changed.begin(), changed.end()), changed.end());
    for (const uint64_t k : changed) {
      const auto it = pair_count.find(k);
      if (it == pair_count.end()) continue;
      if (it->second > 0) {
        heap.push({it->second, k});
      } else {
        pair_count.erase(it);
        where.erase(k);
      }
    }
  }

  // 3. Vocabulary: bytes, merges, then specials.
  Tokenizer t;
  TokenizerState& st = *t.impl_;
  st.tokens = std::move(tok);
  st.merges = std::move(merges);
  for (const std::string& s : specials) {
    AddedToken a;
    a.content = s;
    a.id = static_cast<int32_t>(st.tokens.size());
    a.special = true;
    st.tokens.push_back(s);
    st.added.push_back(std::move(a));
  }
  st.finalize("train_bpe");
  for (const AddedToken& a : st.added)
    TS_CHECK(!st.ids_by_bytes.count(a.content), "[tokenizer] train_bpe: special token '", a.content,
             "' equals a learned token; choose a different special");
  return t;
}

}  // namespace tessera::tokenizer
