// The class of a code point as the GPT-2 family of pre-tokenizer patterns sees it (\p{L}, \p{N},
// White_Space, anything else), over UTF-8 text; Python's str.isspace and str.strip build on it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "unicode/utf8.h"

namespace tessera::unicode {

// Invalid UTF-8 bytes are each their own code point of class kOther (utf8.h), so any byte string
// splits into pieces that concatenate back to it (Hugging Face only takes valid UTF-8, so there
// is nothing to match there). Classes follow the Unicode version of tables.cc; HF's regex
// engine may know a different version, which matters only for code points assigned in between.
enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };

CharClass classify_code_point(uint32_t cp);

// ASCII is most of the input, so its classes are a table known at compile time: Unicode fixes
// them (letters A-Z a-z, numbers 0-9, White_Space \t \n \v \f \r and space), and a test holds the
// table to tables.cc.
constexpr std::array<CharClass, 128> kAsciiClasses = [] {
  std::array<CharClass, 128> t{};
  for (uint32_t c = 0; c < 128; ++c) {
    t[c] = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ? CharClass::kLetter
           : c >= '0' && c <= '9'                           ? CharClass::kNumber
           : (c >= '\t' && c <= '\r') || c == ' '           ? CharClass::kSpace
                                                            : CharClass::kOther;
  }
  return t;
}();

// decode_utf8, returning the code point's class instead (kOther for an invalid byte). Inline:
// the pre-tokenizers call it once per character.
inline int next_char(std::string_view text, size_t pos, CharClass* cls) {
  const auto b0 = static_cast<uint8_t>(text[pos]);
  if (b0 < 0x80) {  // the common case, without the calls
    *cls = kAsciiClasses[b0];
    return 1;
  }
  uint32_t cp;
  const int len = decode_utf8(text, pos, &cp);
  *cls = cp >= kInvalidUtf8Base ? CharClass::kOther : classify_code_point(cp);
  return len;
}

}  // namespace tessera::unicode
