// GPT-2 pre-tokenization over UTF-8 (the ByteLevel regex of Hugging Face, written by hand) and the
// GPT-2 byte <-> printable code point mapping used for vocabulary strings in tokenizer.json.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::tokenizer {

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
