// SentencePiece-style BPE (Llama 2, TinyLlama): ' ' -> U+2581 normalization with a space prefix,
// merges over characters (by rank, or by the score of the merged piece), <0xNN> byte fallback.
#include <algorithm>
#include <map>

#include "core/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "unicode/char_class.h"

namespace tessera::tokenizer {
namespace {

// Byte value of a "<0xNN>" piece, or -1.
int parse_byte_piece(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  int v = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = t[i];
    const int d = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                         : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

// Byte length of the UTF-8 character at s[i] (1 for a byte that starts none).
size_t char_len(std::string_view s, size_t i) {
  unicode::CharClass c;
  return static_cast<size_t>(unicode::next_char(s, i, &c));
}

}  // namespace

void TokenizerState::finalize_spm(const std::string& source) {
  const auto n = static_cast<int32_t>(tokens.size());
  index_added(source);
  byte_of.assign(tokens.size(), -1);
  std::fill(std::begin(byte_ids), std::end(byte_ids), -1);
  ids_by_bytes.clear();
  ids_by_bytes.reserve(tokens.size());
  for (int32_t id = 0; id < n; ++id) {
    if (is_added[id]) continue;
    TS_CHECK(!tokens[id].empty(), "[tokenizer] ", source, ": token ", id, " is empty");
    const auto [it, fresh] = ids_by_bytes.emplace(tokens[id], id);
    TS_CHECK(fresh, "[tokenizer] ", source, ": model.vocab ids ", it->second, " and ", id,
             " name the same token '", tokens[id], "'");
    const int b = parse_byte_piece(tokens[id]);
    if (b >= 0) {
      byte_of[id] = static_cast<int16_t>(b);
      if (byte_ids[b] < 0) byte_ids[b] = id;
    }
  }
  // GGUF "llama" vocabularies carry scores instead of merges: any split of a piece into two
  // pieces may merge, the merged piece's score is the priority, equal scores merge leftmost.
  if (merges.empty() && !scores.empty()) {
    TS_CHECK(scores.size() == tokens.size(), "[tokenizer] ", source, ": ", scores.size(),
             " scores for ", tokens.size(), " tokens");
    std::vector<float> distinct(scores.begin(), scores.end());
    std::sort(distinct.begin(), distinct.end(), std::greater<float>());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    std::vector<std::pair<int32_t, std::pair<int32_t, int32_t>>> found;  // (rank, (left, right))
    for (int32_t id = 0; id < n; ++id) {
      if (is_added[id] || byte_of[id] >= 0) continue;
      const std::string& t = tokens[id];
      const auto rank = static_cast<int32_t>(
          std::lower_bound(distinct.begin(), distinct.end(), scores[id], std::greater<float>()) -
          distinct.begin());
      for (size_t k = char_len(t, 0); k < t.size(); k += char_len(t, k)) {
        const auto l = ids_by_bytes.find(t.substr(0, k));
        const auto r = ids_by_bytes.find(t.substr(k));
        if (l == ids_by_bytes.end() || r == ids_by_bytes.end()) continue;
        if (byte_of[l->second] >= 0 || byte_of[r->second] >= 0) continue;
        found.push_back({rank, {l->second, r->second}});
      }
    }
    std::stable_sort(found.begin(), found.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    merge_ranks.clear();
    for (const auto& [rank, pair] : found) {
      merges.push_back(pair);
      merge_ranks.push_back(rank);
    }
  }
  TS_CHECK(merge_ranks.empty() || merge_ranks.size() == merges.size(), "[tokenizer] ", source,
           ": merge ranks do not match the merges");
  std::vector<int32_t> results(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto [a, b] = merges[r];
    TS_CHECK(a >= 0 && a < n && b >= 0 && b < n && !is_added[a] && !is_added[b], "[tokenizer] ",
             source, ": model.merges[", r, "] names a token that is not in model.vocab");
    const auto it = ids_by_bytes.find(tokens[a] + tokens[b]);
    TS_CHECK(it != ids_by_bytes.end(), "[tokenizer] ", source, ": model.merges[", r, "] '",
             tokens[a], " ", tokens[b], "' joins to a token that is not in model.vocab");
    results[r] = it->second;
  }
  const int64_t r = merge_table.build(merges, results, merge_ranks);
  TS_CHECK(r < 0, "[tokenizer] ", source, ": model.merges[", r, "] '", tokens[merges[r].first], " ",
           tokens[merges[r].second], "' repeats an earlier merge");
}

void TokenizerState::encode_spm_segment(std::string_view text, bool at_start,
                                        std::vector<int32_t>* out) const {
  if (text.empty()) return;
  const bool starts_with_meta = text[0] == ' ' || text.substr(0, 3) == kMetaSpace;
  bool prefix = false;
  switch (space_prefix) {
    case SpacePrefix::none:
      break;
    case SpacePrefix::first:
      prefix = at_start && !starts_with_meta;
      break;
    case SpacePrefix::every_if_missing:
      prefix = !starts_with_meta;
      break;
    case SpacePrefix::every:
      prefix = true;
      break;
  }
  std::string norm;
  norm.reserve(text.size() + 16);
  if (prefix) norm += kMetaSpace;
  for (const char c : text) {
    if (c == ' ')
      norm += kMetaSpace;
    else
      norm.push_back(c);
  }
  // Metaspace split: a word starts at each U+2581 (which joins the text after it). Newline-run
  // split: a word is a run of '\n' or a run of anything else.
  size_t begin = 0;
  while (begin < norm.size()) {
    size_t end = norm.size();
    if (split_at_spaces) {
      end = norm.find(kMetaSpace, begin + (norm.compare(begin, 3, kMetaSpace) == 0 ? 3 : 1));
      if (end == std::string::npos) end = norm.size();
    } else if (split_newline_runs) {
      end = norm[begin] == '\n' ? norm.find_first_not_of('\n', begin) : norm.find('\n', begin);
      if (end == std::string::npos) end = norm.size();
    }
    const std::string_view word = std::string_view(norm).substr(begin, end - begin);
    begin = end;
    if (ignore_merges) {
      const auto it = ids_by_bytes.find(std::string(word));
      if (it != ids_by_bytes.end()) {
        out->push_back(it->second);
        continue;
      }
    }
    std::vector<int32_t> ids;
    for (size_t i = 0; i < word.size();) {
      const size_t len = char_len(word, i);
      const auto it = ids_by_bytes.find(std::string(word.substr(i, len)));
      if (it != ids_by_bytes.end() && byte_of[it->second] < 0) {
        ids.push_back(it->second);
      } else {
        bool all_bytes = true;
        for (size_t k = i; k < i + len; ++k)
          all_bytes &= byte_ids[static_cast<uint8_t>(word[k])] >= 0;
        if (all_bytes) {
          for (size_t k = i; k < i + len; ++k)
            ids.push_back(byte_ids[static_cast<uint8_t>(word[k])]);
        } else {
          TS_CHECK(special.unk >= 0, "[tokenizer] encode: text has a character (byte 0x", std::hex,
                   static_cast<int>(static_cast<uint8_t>(word[i])),
                   ") that is not in the vocabulary, which has neither byte tokens nor unk");
          ids.push_back(special.unk);
        }
      }
      i += len;
    }
    merge_symbols(ids, out);
  }
}

}  // namespace tessera::tokenizer
