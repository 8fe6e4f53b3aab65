// WordPiece (BERT; GGUF model "bert"), as Hugging Face's BertNormalizer, BertPreTokenizer and
// WordPiece model encode: clean the text, space out CJK ideographs, strip accents and lowercase
// (as the vocabulary's flags say), split at whitespace and around each punctuation character,
// then take each word's longest vocabulary prefix, again and again. GGUF writes the vocabulary
// as llama.cpp's converter leaves it: a word's first piece as U+2581 + text, a continuation
// piece bare (HF's "##" prefix dropped).
#include <algorithm>

#include "core/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "unicode/char_class.h"
#include "unicode/nfc.h"
#include "unicode/tables.h"

namespace tessera::tokenizer {
namespace {

// HF's max_input_chars_per_word: a longer word is one unknown token.
constexpr size_t kMaxWordChars = 100;

bool is_valid(uint32_t cp) {
  return cp < unicode::kInvalidUtf8Base;
}
bool bert_whitespace(uint32_t cp) {
  return cp == '\t' || cp == '\n' || cp == '\r' ||
         (is_valid(cp) && unicode::classify_code_point(cp) == unicode::CharClass::kSpace);
}
// \p{C} but for the three controls BERT counts as whitespace.
bool bert_control(uint32_t cp) {
  return is_valid(cp) && !bert_whitespace(cp) &&
         unicode::in_ranges(cp, unicode::kOtherRanges, unicode::kOtherRangeCount);
}
// The CJK Unified Ideograph blocks BERT spaces out (not kana or Hangul).
bool bert_cjk(uint32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
         (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
         (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}
void append_lowercase(uint32_t cp, std::vector<uint32_t>* out) {
  const auto* end = unicode::kLowercase + unicode::kLowercaseCount;
  const auto* it =
      std::lower_bound(unicode::kLowercase, end, cp,
                       [](const unicode::LowercaseMapping& m, uint32_t v) { return m.cp < v; });
  if (it == end || it->cp != cp) {
    out->push_back(cp);
    return;
  }
  out->push_back(it->lower);
  if (it->lower2 != 0) out->push_back(it->lower2);
}

// BertNormalizer (clean_text and handle_chinese_chars on): the code points of the normalized
// text, every whitespace character a U+0020.
void bert_normalize(std::string_view text, bool lowercase, bool strip_accents,
                    std::vector<uint32_t>* out) {
  std::string cleaned;
  for (size_t i = 0; i < text.size();) {
    uint32_t cp;
    i += unicode::decode_utf8(text, i, &cp);
    if (cp == 0 || cp == 0xFFFD || bert_control(cp)) continue;
    if (bert_whitespace(cp)) {
      cleaned.push_back(' ');
    } else if (bert_cjk(cp)) {
      cleaned.push_back(' ');
      unicode::append_utf8(cp, &cleaned);
      cleaned.push_back(' ');
    } else {
      unicode::append_utf8(cp, &cleaned);
    }
  }
  std::vector<uint32_t> cps;
  if (strip_accents) {
    unicode::nfd_code_points(cleaned, &cps);
    std::erase_if(cps, [](uint32_t cp) {
      return is_valid(cp) && unicode::in_ranges(cp, unicode::kNonspacingMarkRanges,
                                                unicode::kNonspacingMarkRangeCount);
    });
  } else {
    for (size_t i = 0; i < cleaned.size();) {
      uint32_t cp;
      i += unicode::decode_utf8(cleaned, i, &cp);
      cps.push_back(cp);
    }
  }
  out->clear();
  for (const uint32_t cp : cps) {
    if (lowercase)
      append_lowercase(cp, out);
    else
      out->push_back(cp);
  }
}

}  // namespace

void TokenizerState::finalize_wordpiece(const std::string& source) {
  const auto n = static_cast<int32_t>(tokens.size());
  index_added(source);
  byte_of.assign(tokens.size(), -1);
  ids_by_bytes.clear();
  ids_by_bytes.reserve(tokens.size());
  for (int32_t id = 0; id < n; ++id) {
    if (is_added[id]) continue;
    const auto [it, fresh] = ids_by_bytes.emplace(tokens[id], id);
    TS_CHECK(fresh, "[tokenizer] ", source, ": vocabulary ids ", it->second, " and ", id,
             " name the same token '", tokens[id], "'");
  }
  finalize_special(source);
}

void TokenizerState::encode_wordpiece_segment(std::string_view text,
                                              std::vector<int32_t>* out) const {
  std::vector<uint32_t> cps;
  bert_normalize(text, bert_lowercase, bert_strip_accents, &cps);
  // BertPreTokenizer: words are the runs between whitespace; each punctuation character is a
  // word of its own.
  std::string key;
  auto encode_word = [&](const uint32_t* w, size_t len) {
    std::vector<int32_t> ids;
    size_t start = 0;
    while (start < len && len <= kMaxWordChars) {
      int32_t found = -1;
      size_t end = len;
      for (; end > start; --end) {
        key = start == 0 ? std::string(kMetaSpace) : std::string();
        for (size_t k = start; k < end; ++k) unicode::append_utf8(w[k], &key);
        const auto it = ids_by_bytes.find(key);
        if (it != ids_by_bytes.end()) {
          found = it->second;
          break;
        }
      }
      if (found < 0) break;
      ids.push_back(found);
      start = end;
    }
    if (start < len || len > kMaxWordChars) {
      TS_CHECK(special.unk >= 0,
               "[tokenizer] encode: a word is not in the WordPiece vocabulary, "
               "which has no unknown token");
      out->push_back(special.unk);
      return;
    }
    out->insert(out->end(), ids.begin(), ids.end());
  };
  size_t begin = 0;
  for (size_t i = 0; i <= cps.size(); ++i) {
    const bool end_of_text = i == cps.size();
    if (end_of_text || cps[i] == ' ' || unicode::is_ascii_or_unicode_punctuation(cps[i])) {
      if (i > begin) encode_word(cps.data() + begin, i - begin);
      if (!end_of_text && cps[i] != ' ') encode_word(cps.data() + i, 1);
      begin = i + 1;
    }
  }
}

}  // namespace tessera::tokenizer
