// Unicode Normalization Form C (UAX #15) over UTF-8, as Hugging Face's "NFC" normalizer applies it
// before pre-tokenization (Qwen2). Tables: nfc_data.h (scripts/gen_unicode_nfc.py).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::unicode {

// True when `text` is certainly NFC by the quick check: every code point has combining class 0
// and NFC_Quick_Check Yes (all ASCII, most CJK, ...). Bytes that are not valid UTF-8 count as
// such code points.
bool is_nfc_quick(std::string_view text);

// NFC of `text`: canonical decomposition, canonical ordering, canonical composition (Hangul
// arithmetically, composition exclusions honoured). Returns `text` itself when the quick check
// passes (no copy); else writes the result to *buf and returns a view of it. Invalid UTF-8 bytes
// pass through unchanged, each acting as a lone character of class 0 that composes with nothing
// (as the pre-tokenizer treats them), so the output holds the same invalid bytes.
std::string_view nfc_normalize(std::string_view text, std::string* buf);

// The code points of NFD(text) (canonical decomposition and ordering; BERT's accent stripping
// starts there). Invalid UTF-8 bytes come out as kInvalidUtf8Base + byte.
void nfd_code_points(std::string_view text, std::vector<uint32_t>* out);

}  // namespace tessera::unicode
