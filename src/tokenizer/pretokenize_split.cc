// Pre-tokenizers that Hugging Face writes as a Sequence of steps, each splitting every piece the
// step before left (Falcon; DeepSeek Coder and DeepSeek LLM), written by hand: every Split regex
// of those tokenizer.json files becomes a matcher below, applied as HF's "Isolated" behaviour
// applies it (each match is a piece, and so is the text between two matches).
#include <string>

#include "tokenizer/pretokenize.h"
#include "tokenizer/pretokenize_split.h"
#include "unicode/char_class.h"
#include "unicode/tables.h"

namespace tessera::tokenizer {
namespace {

using Pieces = std::vector<std::string_view>;

struct Char {
  uint32_t cp;
  size_t len;
};
Char char_at(std::string_view s, size_t pos) {
  uint32_t cp;
  const int len = unicode::decode_utf8(s, pos, &cp);
  return {cp, static_cast<size_t>(len)};
}

bool is_space(uint32_t cp) {
  return cp < unicode::kInvalidUtf8Base &&
         unicode::classify_code_point(cp) == unicode::CharClass::kSpace;
}
bool is_letter(uint32_t cp) {
  return cp < unicode::kInvalidUtf8Base &&
         unicode::classify_code_point(cp) == unicode::CharClass::kLetter;
}
bool is_number(uint32_t cp) {
  return cp < unicode::kInvalidUtf8Base &&
         unicode::classify_code_point(cp) == unicode::CharClass::kNumber;
}
bool is_unicode_punct(uint32_t cp) {
  return unicode::is_punctuation(cp);
}
// [一-龥ࠀ-一가-퟿] of the DeepSeek patterns: U+0800..U+9FA5 and U+AC00..U+D7FF.
bool is_deepseek_cjk(uint32_t cp) {
  return (cp >= 0x800 && cp <= 0x9FA5) || (cp >= 0xAC00 && cp <= 0xD7FF);
}

// DeepSeek LLM's explicit letter class (mostly the cased letters, \p{LC}, of Latin, Greek,
// Cyrillic, Armenian, Georgian, Cherokee, Glagolitic, Coptic, Deseret, Osage, Old Hungarian,
// Warang Citi and Adlam), as its tokenizer.json writes it, in ranges.
constexpr unicode::CodePointRange kDeepseekLetters[] = {
    {0x41, 0x5A},       {0x61, 0x7A},       {0xB5, 0xB5},       {0xC0, 0xD6},
    {0xD8, 0xF6},       {0xF8, 0x1BA},      {0x1BC, 0x1BF},     {0x1C4, 0x293},
    {0x295, 0x2AF},     {0x370, 0x373},     {0x376, 0x377},     {0x37B, 0x37D},
    {0x37F, 0x37F},     {0x386, 0x386},     {0x388, 0x38A},     {0x38C, 0x38C},
    {0x38E, 0x3A1},     {0x3A3, 0x3F5},     {0x3F7, 0x481},     {0x48A, 0x52F},
    {0x531, 0x556},     {0x10A0, 0x10C5},   {0x13A0, 0x13F5},   {0x13F8, 0x13FD},
    {0x1C90, 0x1CBA},   {0x1CBD, 0x1CBF},   {0x1D00, 0x1D2B},   {0x1D6B, 0x1D77},
    {0x1D79, 0x1D9A},   {0x1E00, 0x1F15},   {0x1F18, 0x1F1D},   {0x1F20, 0x1F45},
    {0x1F48, 0x1F4D},   {0x1F50, 0x1F57},   {0x1F59, 0x1F59},   {0x1F5B, 0x1F5B},
    {0x1F5D, 0x1F5D},   {0x1F5F, 0x1F7D},   {0x1F80, 0x1FB4},   {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE},   {0x1FC2, 0x1FC4},   {0x1FC6, 0x1FCC},   {0x1FD0, 0x1FD3},
    {0x1FD6, 0x1FDB},   {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FF4},   {0x1FF6, 0x1FFC},
    {0x2102, 0x2102},   {0x2107, 0x2107},   {0x210A, 0x2113},   {0x2115, 0x2115},
    {0x2119, 0x211D},   {0x2124, 0x2124},   {0x2126, 0x2126},   {0x2128, 0x2128},
    {0x212A, 0x212D},   {0x212F, 0x2134},   {0x2139, 0x2139},   {0x213C, 0x213F},
    {0x2145, 0x2149},   {0x214E, 0x214E},   {0x2183, 0x2184},   {0x2C00, 0x2C7B},
    {0x2C7E, 0x2CE4},   {0x2CEB, 0x2CEE},   {0x2CF2, 0x2CF3},   {0xA640, 0xA66D},
    {0xA680, 0xA69B},   {0xA722, 0xA76F},   {0xA771, 0xA787},   {0xA78B, 0xA78E},
    {0xAB70, 0xABBF},   {0xFB00, 0xFB06},   {0xFB13, 0xFB17},   {0xFF21, 0xFF3A},
    {0xFF41, 0xFF5A},   {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};
bool is_deepseek_letter(uint32_t cp) {
  return unicode::in_ranges(cp, kDeepseekLetters, std::size(kDeepseekLetters));
}
// DeepSeek LLM's punctuation class [!-/:-~！-／：-～‘-‟　-。]: ASCII '!'..'/' and ':'..'~'
// (letters included; the letter step before has taken them), their full-width forms, the
// quotation marks U+2018..U+201F and U+3000..U+3002.
bool is_deepseek_punct(uint32_t cp) {
  return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x7E) ||
         (cp >= 0xFF01 && cp <= 0xFF0F) || (cp >= 0xFF1A && cp <= 0xFF5E) ||
         (cp >= 0x2018 && cp <= 0x201F) || (cp >= 0x3000 && cp <= 0x3002);
}

// End of the run of code points satisfying `pred` from pos.
template <class Pred>
size_t run_end(std::string_view s, size_t pos, Pred pred) {
  while (pos < s.size()) {
    const Char c = char_at(s, pos);
    if (!pred(c.cp)) break;
    pos += c.len;
  }
  return pos;
}

// Splits every piece of `in` at the leftmost, non-overlapping matches of `match` (which returns
// the match's end at pos, or pos for none), appending matches and the text between to `out`.
// kBytes: positions step by byte (a step after the byte-level mapping), else by code point.
template <bool kBytes, class Match>
void split_isolated(const Pieces& in, Pieces* out, Match match) {
  for (const std::string_view piece : in) {
    size_t gap = 0, p = 0;
    while (p < piece.size()) {
      const size_t end = match(piece, p);
      if (end > p) {
        if (gap < p) out->push_back(piece.substr(gap, p - gap));
        out->push_back(piece.substr(p, end - p));
        gap = p = end;
      } else {
        p += kBytes ? 1 : char_at(piece, p).len;
      }
    }
    if (gap < piece.size()) out->push_back(piece.substr(gap));
  }
}

// Runs one step: `pieces` in, `pieces` out (through `scratch`).
template <bool kBytes = false, class Match>
void step(Pieces* pieces, Pieces* scratch, Match match) {
  scratch->clear();
  split_isolated<kBytes>(*pieces, scratch, match);
  pieces->swap(*scratch);
}

// Matchers, named by the regex they stand for.
size_t match_newline(std::string_view s, size_t p) {  // [\r\n]
  return s[p] == '\r' || s[p] == '\n' ? p + 1 : p;
}
template <class Pred>
size_t match_space_then_run(std::string_view s, size_t p, Pred pred) {  // \s?X+
  const Char c = char_at(s, p);
  if (is_space(c.cp) && p + c.len < s.size() && pred(char_at(s, p + c.len).cp))
    return run_end(s, p + c.len, pred);
  return pred(c.cp) ? run_end(s, p, pred) : p;
}
template <class Pred>
size_t match_run(std::string_view s, size_t p, Pred pred) {  // X+
  return run_end(s, p, pred);
}
size_t match_one_number(std::string_view s, size_t p) {  // HF Digits(individual_digits)
  const Char c = char_at(s, p);
  return is_number(c.cp) ? p + c.len : p;
}

// \s+$ over each piece: its trailing White_Space run, if any, becomes a piece of its own.
void split_trailing_space(Pieces* pieces, Pieces* scratch) {
  scratch->clear();
  for (const std::string_view piece : *pieces) {
    size_t start = piece.size();
    for (size_t p = 0; p < piece.size();) {
      const Char c = char_at(piece, p);
      if (!is_space(c.cp))
        start = piece.size();
      else if (start == piece.size())
        start = p;
      p += c.len;
    }
    if (start > 0) scratch->push_back(piece.substr(0, start));
    if (start < piece.size()) scratch->push_back(piece.substr(start));
  }
  pieces->swap(*scratch);
}

// Falcon: Punctuation (contiguous runs), ByteLevel with GPT-2's regex, Digits (runs; seen after
// the byte-level mapping, so a byte whose mapped character is numeric, as 0xBD -> '½' in the
// UTF-8 of '½' itself, counts), then [0-9]{3}.
void pretokenize_falcon(std::string_view text, Pieces* out) {
  Pieces pieces{text}, scratch;
  step(&pieces, &scratch, [](std::string_view s, size_t p) {
    return match_run(s, p, unicode::is_ascii_or_unicode_punctuation);
  });
  scratch.clear();
  for (const std::string_view piece : pieces) pretokenize(piece, &scratch);
  pieces.swap(scratch);
  step<true>(&pieces, &scratch, [](std::string_view s, size_t p) {
    auto numeric = [](uint8_t b) { return is_number(byte_to_code_point(b)); };
    while (p < s.size() && numeric(static_cast<uint8_t>(s[p]))) ++p;
    return p;
  });
  step<true>(&pieces, &scratch, [](std::string_view s, size_t p) {
    auto digit = [&](size_t i) { return i < s.size() && s[i] >= '0' && s[i] <= '9'; };
    return digit(p) && digit(p + 1) && digit(p + 2) ? p + 3 : p;
  });
  out->insert(out->end(), pieces.begin(), pieces.end());
}

// DeepSeek Coder: [\r\n], \s?\p{L}+, \s?\p{P}+, [一-龥ࠀ-一가-퟿]+, Digits(individual).
// DeepSeek LLM: [\r\n], \s?[letters]+, \s?[punctuation]+, \s+$, [一-龥ࠀ-一가-퟿]+,
// Digits(individual); its classes are the explicit ones above.
void pretokenize_deepseek(bool llm, std::string_view text, Pieces* out) {
  Pieces pieces{text}, scratch;
  step(&pieces, &scratch, match_newline);
  step(&pieces, &scratch, [llm](std::string_view s, size_t p) {
    return llm ? match_space_then_run(s, p, is_deepseek_letter)
               : match_space_then_run(s, p, is_letter);
  });
  step(&pieces, &scratch, [llm](std::string_view s, size_t p) {
    return llm ? match_space_then_run(s, p, is_deepseek_punct)
               : match_space_then_run(s, p, is_unicode_punct);
  });
  if (llm) split_trailing_space(&pieces, &scratch);
  step(&pieces, &scratch,
       [](std::string_view s, size_t p) { return match_run(s, p, is_deepseek_cjk); });
  step(&pieces, &scratch, match_one_number);
  out->insert(out->end(), pieces.begin(), pieces.end());
}

}  // namespace

void pretokenize_sequence(PreTokenizer kind, std::string_view text,
                          std::vector<std::string_view>* out) {
  if (text.empty()) return;
  if (kind == PreTokenizer::falcon)
    pretokenize_falcon(text, out);
  else
    pretokenize_deepseek(kind == PreTokenizer::deepseek_llm, text, out);
}

}  // namespace tessera::tokenizer
