// GPT-2 pre-tokenization over UTF-8 (the ByteLevel regex of Hugging Face, written by hand) and the
// GPT-2 byte <-> printable code point mapping used for vocabulary strings in tokenizer.json.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::tokenizer {

// Class of one code point as the GPT-2 pattern sees it. Invalid UTF-8 bytes are each their own
// code point of class kOther, so any byte string splits into pieces that concatenate back to it
// (Hugging Face only takes valid UTF-8, so there is nothing to match there). Classes follow the
// Unicode version of unicode_tables.cc; HF's regex engine may know a different version, which
// matters only for code points assigned in between.
enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };

CharClass classify_code_point(uint32_t cp);

// An invalid UTF-8 byte b decodes to kInvalidUtf8Base + b: outside Unicode, so no table knows it,
// and each such byte stays a code point of its own that maps back to the byte.
constexpr uint32_t kInvalidUtf8Base = 0x110000;

// Decodes one code point at text[pos] (pos < text.size()): strict UTF-8 (no overlongs, no
// surrogates, nothing past U+10FFFF). Returns the byte length (1..4) and stores the code point;
// an invalid or truncated sequence yields length 1 and kInvalidUtf8Base + its first byte.
int decode_utf8(std::string_view text, size_t pos, uint32_t* cp);
// The inverse: appends cp as UTF-8 (1..4 bytes); kInvalidUtf8Base + b appends the byte b.
void append_utf8(uint32_t cp, std::string* out);

// decode_utf8, returning the code point's class instead (kOther for an invalid byte).
int next_char(std::string_view text, size_t pos, CharClass* cls);

// Splits `text` as 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// does, appending the pieces (views into `text`, in order, covering it exactly) to `out`.
void pretokenize(std::string_view text, std::vector<std::string_view>* out);

// The pre-tokenizers of byte-level BPE models, named as GGUF's tokenizer.ggml.pre names them.
enum class PreTokenizer : uint8_t {
  gpt2,    // the pattern above
  smollm,  // every \p{N} its own piece, then gpt2 on the text between (HF Digits + ByteLevel)
  llama3,  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
           //  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  qwen2,   // llama3 with \p{N} (single digits) in place of \p{N}{1,3}
  qwen35,  // qwen2 with [\p{L}\p{M}]+ for \p{L}+ and [^\s\p{L}\p{M}\p{N}] for [^\s\p{L}\p{N}]
  // HF Sequences of Split steps (pretokenize_split.cc):
  falcon,          // Punctuation, ByteLevel (gpt2), Digits, [0-9]{3}
  deepseek_coder,  // [\r\n], \s?\p{L}+, \s?\p{P}+, CJK runs, single digits
  deepseek_llm,    // [\r\n], \s?[letters]+, \s?[punctuation]+, \s+$, CJK runs, single digits
};
// Name written to GGUF ("gpt-2", "smollm", "llama-bpe", "qwen2", "qwen35", "falcon",
// "deepseek-coder", "deepseek-llm").
std::string_view pre_tokenizer_name(PreTokenizer p);
// GGUF names: those, and the aliases gpt2, mpt, starcoder, refact, command-r, llama3 and
// llama-v3. Throws naming `where` and the value for any other name.
PreTokenizer parse_pre_tokenizer(std::string_view name, std::string_view where);
// The regex of a Hugging Face Split pre-tokenizer for llama3/qwen2/qwen35 (as in tokenizer.json);
// empty for the others.
std::string_view pre_tokenizer_split_regex(PreTokenizer p);
void pretokenize(PreTokenizer kind, std::string_view text, std::vector<std::string_view>* out);

// GPT-2's byte-level alphabet: bytes that are printable in Latin-1 ('!'..'~', 0xA1..0xAC,
// 0xAE..0xFF) map to themselves, the other 68 to U+0100 + n in byte order.
uint32_t byte_to_code_point(uint8_t b);
// Inverse of byte_to_code_point; -1 for a code point outside the alphabet.
int code_point_to_byte(uint32_t cp);
// Raw token bytes -> the UTF-8 vocabulary string of tokenizer.json.
std::string bytes_to_vocab_string(std::string_view bytes);
// Vocabulary string -> raw bytes; false if it is not valid UTF-8 over the byte alphabet.
bool vocab_string_to_bytes(std::string_view s, std::string* bytes);

}  // namespace tessera::tokenizer
