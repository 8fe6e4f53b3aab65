// GPT-2 pre-tokenization over UTF-8 (the ByteLevel regex of Hugging Face, written by hand) and the
// GPT-2 byte <-> printable code point mapping used for vocabulary strings in tokenizer.json.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::model {

// Class of one code point as the GPT-2 pattern sees it. Invalid UTF-8 bytes are each their own
// code point of class kOther, so any byte string splits into pieces that concatenate back to it
// (Hugging Face only takes valid UTF-8, so there is nothing to match there). Classes follow the
// Unicode version of unicode_tables.cc; HF's regex engine may know a different version, which
// matters only for code points assigned in between.
enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };

CharClass classify_code_point(uint32_t cp);

// Decodes one code point at text[pos] (pos < text.size()): strict UTF-8 (no overlongs, no
// surrogates, nothing past U+10FFFF). Returns the byte length (1..4) and stores the class; an
// invalid or truncated sequence yields length 1 and kOther.
int next_char(std::string_view text, size_t pos, CharClass* cls);

// Splits `text` as 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// does, appending the pieces (views into `text`, in order, covering it exactly) to `out`.
void pretokenize(std::string_view text, std::vector<std::string_view>* out);

// GPT-2's byte-level alphabet: bytes that are printable in Latin-1 ('!'..'~', 0xA1..0xAC,
// 0xAE..0xFF) map to themselves, the other 68 to U+0100 + n in byte order.
uint32_t byte_to_code_point(uint8_t b);
// Inverse of byte_to_code_point; -1 for a code point outside the alphabet.
int code_point_to_byte(uint32_t cp);
// Raw token bytes -> the UTF-8 vocabulary string of tokenizer.json.
std::string bytes_to_vocab_string(std::string_view bytes);
// Vocabulary string -> raw bytes; false if it is not valid UTF-8 over the byte alphabet.
bool vocab_string_to_bytes(std::string_view s, std::string* bytes);

}  // namespace tessera::model
