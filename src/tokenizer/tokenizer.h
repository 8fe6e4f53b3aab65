// BPE tokenizers of the GPT-2 / Llama 3 / Qwen2 / SmolLM family (byte-level) and of the Llama 2
// family (SentencePiece-style, byte fallback), and WordPiece (BERT): training (byte-level),
// encoding, decoding, and loading from / saving to Hugging Face tokenizer.json and GGUF metadata.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/pretokenize.h"

namespace tessera::formats {
class GgufFile;
class GgufWriter;
}  // namespace tessera::formats

namespace tessera::tokenizer {

enum class TokenizerModel : uint8_t {
  byte_level_bpe,     // GGUF "gpt2": merges by rank over bytes; any byte string round-trips
  sentencepiece_bpe,  // GGUF "llama": ' ' -> U+2581, merges over characters, <0xNN> fallback
  wordpiece,  // GGUF "bert": BERT normalizer, whitespace/punctuation words, longest-prefix pieces
};

// Ids of the tokens a generation loop needs; -1 where the tokenizer has none.
struct SpecialTokens {
  int32_t bos = -1;
  int32_t eos = -1;
  int32_t eot = -1;  // end of turn: GGUF eot_token_id, else <|im_end|>, <|eot_id|> or <|end|>
  int32_t pad = -1;
  int32_t unk = -1;
  bool add_bos = false;  // the model expects bos before a prompt (GGUF add_bos_token)
};

class Tokenizer {
 public:
  Tokenizer();
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Learns merges from `text` until the vocabulary (256 byte tokens + merges + specials) reaches
  // vocab_size. Specials (e.g. "<|endoftext|>") get the last ids. Deterministic. GPT-2
  // pre-tokenization.
  static Tokenizer train_bpe(std::string_view text, int32_t vocab_size,
                             const std::vector<std::string>& specials = {"<|endoftext|>"});
  // Reads a Hugging Face tokenizer.json: model.type BPE with a ByteLevel pre-tokenizer (alone,
  // after Digits, or after a Llama 3 / Qwen2 Split regex) or SentencePiece-style (byte_fallback,
  // Metaspace or Prepend+Replace normalizer); either may have an NFC normalizer (Qwen2). Throws
  // naming the file and the field on anything malformed or unsupported.
  static Tokenizer load_json(const std::string& path);
  static Tokenizer from_json_text(std::string_view json, const std::string& source_name);
  void save_json(const std::string& path) const;
  std::string to_json_text() const;
  // Reads the tokenizer.ggml.* keys (model gpt2, llama, gemma4 or bert); throws naming the file
  // and the key.
  static Tokenizer from_gguf(const formats::GgufFile& f);
  // Writes the tokenizer.ggml.* keys that from_gguf reads (and llama.cpp understands).
  void to_gguf(formats::GgufWriter& w) const;

  // Added tokens (GGUF CONTROL / USER_DEFINED / UNKNOWN types, tokenizer.json added_tokens) in
  // the text are matched literally, leftmost then longest, and map to their ids; one with lstrip
  // / rstrip also takes the whitespace on its left / right. The text between them is put in NFC
  // when the tokenizer has that normalizer (then "normalized" tokens are matched). A byte that has
  // no token in a byte-level vocabulary (SmolLM2 lacks 21, e.g. 0x04) is dropped, as Hugging
  // Face does; SentencePiece falls back to <0xNN> tokens, else to unk.
  std::vector<int32_t> encode(std::string_view text) const;
  // Without matching the special added tokens: their text is ordinary text (NFC applied if any),
  // as HF's split_special_tokens; added tokens that are not special (GGUF USER_DEFINED: Gemma's
  // runs of spaces and newlines) are still matched, as HF and llama.cpp always match them.
  std::vector<int32_t> encode_ordinary(std::string_view text) const;
  // Text of the ids; skip_special leaves out special added tokens (bos, <|im_end|>, ...).
  // SentencePiece: U+2581 -> ' ', <0xNN> -> byte, and the space that encoding put in front of
  // the text is dropped (one leading space). Throws on an id out of range.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;
  // Bytes one token contributes when streaming (possibly part of a UTF-8 character): the
  // byte-level token bytes, or the SentencePiece piece with U+2581 -> ' ' (leading space kept),
  // or the byte of <0xNN>, or an added token's text.
  std::string decode_token(int32_t id) const;

  TokenizerModel model() const;
  PreTokenizer pre_tokenizer() const;  // byte-level models only
  int32_t vocab_size() const;
  // Id of a vocabulary entry: raw bytes (byte-level), the piece with U+2581 (SentencePiece), or
  // an added token's text; -1 if absent.
  int32_t token_id(std::string_view token) const;
  int32_t eot_token() const;          // id of <|endoftext|> (document separator in training), or -1
  bool is_special(int32_t id) const;  // a special added (control) token
  const SpecialTokens& special_tokens() const;
  // Replaces the special ids (e.g. from tokenizer_config.json); throws on an id out of range.
  void set_special_tokens(const SpecialTokens& s);
  // Ids that end generation, ascending: eos, eot, and the added tokens <|endoftext|>,
  // <|end_of_text|>, <|im_end|>, <|eot_id|>, <|eom_id|>, <|end|> where present.
  const std::vector<int32_t>& end_of_generation_tokens() const;
  bool is_end_of_generation(int32_t id) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Applies a Hugging Face tokenizer_config.json (its text; `source` names it in errors) to `tok`:
// bos_token, eos_token, pad_token and unk_token (a string or an AddedToken object) and
// add_bos_token. A token not in the vocabulary, or a field of the wrong type, throws naming the
// file and the field.
void apply_tokenizer_config(std::string_view json_text, const std::string& source, Tokenizer* tok);
// Writes tokenizer_config.json (tok's special tokens, add_bos_token and the chat template if
// any), chat_template.jinja (the template, as transformers 5 writes it) and
// generation_config.json into `folder`, and adds the bos/eos/pad ids to the config.json the
// model's writer put there (which must exist).
void write_hf_tokenizer_config(const std::string& folder, const Tokenizer& tok,
                               const std::string& chat_template);

}  // namespace tessera::tokenizer
