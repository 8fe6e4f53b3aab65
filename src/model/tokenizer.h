// Byte-level BPE tokenizer (GPT-2 style pre-tokenization): training, encoding, decoding, and
// Hugging Face tokenizer.json read/write. Any byte sequence round-trips through encode/decode.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::model {

class Tokenizer {
 public:
  Tokenizer();
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Learns merges from `text` until the vocabulary (256 byte tokens + merges + specials) reaches
  // vocab_size. Specials (e.g. "<|endoftext|>") get the last ids. Deterministic.
  static Tokenizer train_bpe(std::string_view text, int32_t vocab_size,
                             const std::vector<std::string>& specials = {"<|endoftext|>"});
  // Reads a Hugging Face tokenizer.json (model.type BPE, ByteLevel pre-tokenizer/decoder);
  // throws naming the file and the field on anything malformed or unsupported.
  static Tokenizer load_json(const std::string& path);
  static Tokenizer from_json_text(std::string_view json, const std::string& source_name);
  void save_json(const std::string& path) const;
  std::string to_json_text() const;

  // Special tokens in the text are matched literally and map to their ids.
  std::vector<int32_t> encode(std::string_view text) const;
  // Without special-token matching (every byte is ordinary text).
  std::vector<int32_t> encode_ordinary(std::string_view text) const;
  std::string decode(const std::vector<int32_t>& ids) const;  // throws on an id out of range
  std::string decode_token(int32_t id) const;                 // raw bytes of one token

  int32_t vocab_size() const;
  int32_t token_id(std::string_view token_bytes) const;  // -1 if absent
  int32_t eot_token() const;                             // id of <|endoftext|>, or -1

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::model
