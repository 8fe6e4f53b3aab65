// Splitting text at added tokens as Hugging Face does (leftmost, longest on a tie; lstrip/rstrip
// absorb the whitespace beside a match), with the NFC normalizer between the two split passes.
#include <string>

#include "tokenizer/tokenizer_impl.h"
#include "unicode/char_class.h"
#include "unicode/nfc.h"

namespace tessera::tokenizer {
namespace {

bool is_space_at(std::string_view text, size_t pos, int* len) {
  unicode::CharClass c;
  *len = unicode::next_char(text, pos, &c);
  return c == unicode::CharClass::kSpace;
}

// Start of the White_Space run that ends `text` (text.size() if there is none).
size_t trailing_space_start(std::string_view text) {
  size_t start = 0;
  int len = 0;
  for (size_t i = 0; i < text.size(); i += static_cast<size_t>(len))
    if (!is_space_at(text, i, &len)) start = i + static_cast<size_t>(len);
  return start;
}

// End of the White_Space run that starts at text[pos].
size_t leading_space_end(std::string_view text, size_t pos) {
  int len = 0;
  while (pos < text.size() && is_space_at(text, pos, &len)) pos += static_cast<size_t>(len);
  return pos;
}

// Splits `text` at the added tokens whose `normalized` flag equals `normalized` (and that are
// not special, unless `specials`): calls
// on_text(piece, at_start) for the text before, between and after the matches (empty pieces
// included, as the encoder has always seen them) and appends each match's id to *out. HF's
// lstrip widens a match left over White_Space, but not into the previous match; rstrip widens it
// right. The search resumes after the widened match.
template <class OnText>
void split_added(const TokenizerState& st, bool normalized, bool specials, std::string_view text,
                 std::vector<int32_t>* out, OnText&& on_text) {
  const auto& added = st.added;
  const auto& pattern = st.added_pattern;
  // Next occurrence of each added token at or after `from` (npos: none, or not this pass's).
  std::vector<size_t> next(added.size(), std::string_view::npos);
  for (size_t k = 0; k < added.size(); ++k)
    if (added[k].normalized == normalized && (specials || !added[k].special))
      next[k] = text.find(pattern[k]);
  size_t from = 0;
  while (true) {
    size_t best = added.size();
    for (size_t k = 0; k < added.size(); ++k) {
      if (next[k] == std::string_view::npos) continue;
      if (best == added.size() || next[k] < next[best] ||
          (next[k] == next[best] && pattern[k].size() > pattern[best].size()))
        best = k;
    }
    if (best == added.size()) break;
    size_t begin = next[best];
    size_t end = begin + pattern[best].size();
    if (added[best].lstrip) begin = from + trailing_space_start(text.substr(from, begin - from));
    if (added[best].rstrip) end = leading_space_end(text, end);
    on_text(text.substr(from, begin - from), from == 0);
    out->push_back(added[best].id);
    from = end;
    for (size_t k = 0; k < added.size(); ++k)
      if (next[k] != std::string_view::npos && next[k] < from)
        next[k] = text.find(pattern[k], from);
  }
  on_text(text.substr(from), from == 0);
}

}  // namespace

void TokenizerState::encode_normalized(std::string_view text, bool at_start,
                                       std::vector<int32_t>* out) const {
  std::string buf;
  encode_segment(nfc ? unicode::nfc_normalize(text, &buf) : text, at_start, out);
}

void TokenizerState::encode_with_added(std::string_view text, bool specials,
                                       std::vector<int32_t>* out) const {
  // HF splits the raw text at non-normalized tokens, normalizes each piece between them, then
  // splits that at the normalized tokens.
  split_added(*this, false, specials, text, out, [&](std::string_view piece, bool at_start) {
    if (!any_normalized_added) {
      encode_normalized(piece, at_start, out);
      return;
    }
    std::string buf;
    const std::string_view norm = nfc ? unicode::nfc_normalize(piece, &buf) : piece;
    split_added(*this, true, specials, norm, out, [&](std::string_view sub, bool sub_start) {
      encode_segment(sub, at_start && sub_start, out);
    });
  });
}

}  // namespace tessera::tokenizer
