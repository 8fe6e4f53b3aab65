// Strict UTF-8 decoding and encoding in which every byte string round-trips: an invalid byte
// decodes to a code point of its own, outside Unicode, that encodes back to the byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::unicode {

// An invalid UTF-8 byte b decodes to kInvalidUtf8Base + b: outside Unicode, so no table knows it,
// and each such byte stays a code point of its own that maps back to the byte.
constexpr uint32_t kInvalidUtf8Base = 0x110000;

// Decodes one code point at text[pos] (pos < text.size()): strict UTF-8 (no overlongs, no
// surrogates, nothing past U+10FFFF). Returns the byte length (1..4) and stores the code point;
// an invalid or truncated sequence yields length 1 and kInvalidUtf8Base + its first byte.
int decode_utf8(std::string_view text, size_t pos, uint32_t* cp);
// The inverse: appends cp as UTF-8 (1..4 bytes); kInvalidUtf8Base + b appends the byte b.
void append_utf8(uint32_t cp, std::string* out);

}  // namespace tessera::unicode
