// Private state of tokenizer::Tokenizer shared by its source files (encode/decode, training, JSON).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace tessera::tokenizer {

// Open-addressing hash map from a token pair (left id, right id) to the merge that joins it.
// Encoding does one lookup per candidate pair, so this is the hot table.
class MergeTable {
 public:
  struct Merge {
    int32_t rank = -1;    // position in the merge list; lower merges first
    int32_t result = -1;  // id of the joined token
  };
  // ranks[r] is merge r's priority (empty: r itself); equal ranks merge leftmost first.
  // Returns the index of the first merge that repeats an earlier pair, or -1.
  int64_t build(const std::vector<std::pair<int32_t, int32_t>>& merges,
                const std::vector<int32_t>& results, const std::vector<int32_t>& ranks);
  Merge find(int32_t left, int32_t right) const {
    if (slots_.empty()) return {};
    const uint64_t key = pack(left, right);
    for (size_t i = hash(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return s.merge;
      if (s.key == kEmpty) return {};
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Slot {
    uint64_t key = kEmpty;
    Merge merge;
  };
  static uint64_t pack(int32_t a, int32_t b) {
    return (uint64_t{static_cast<uint32_t>(a)} << 32) | static_cast<uint32_t>(b);
  }
  static size_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

struct AddedToken {
  std::string content;  // raw bytes, matched literally by encode()
  int32_t id = -1;
  bool special = true;
  bool normalized = false;  // matched in the normalized text (after NFC), not in the raw text
  bool lstrip = false;      // the match absorbs the White_Space run on its left (HF lstrip)
  bool rstrip = false;      // ... and on its right (HF rstrip)
};

// Where SentencePiece-style encoding puts U+2581 in front of a text segment (the text between
// added tokens).
enum class SpacePrefix : uint8_t {
  none,
  first,  // the segment at the start of the text, unless it already starts with U+2581 (HF
          // Metaspace prepend_scheme "first")
  every_if_missing,  // every segment not already starting with U+2581 (Metaspace "always")
  every,             // every segment, unconditionally (Llama 2's Prepend normalizer; llama.cpp)
};

inline constexpr std::string_view kMetaSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// Everything a Tokenizer holds. Tokenizer::Impl (private) is this struct; the named type lets
// helper functions in the tokenizer's source files build one.
struct TokenizerState {
  // Source of truth (what JSON and GGUF store); the index below is derived by finalize().
  TokenizerModel model = TokenizerModel::byte_level_bpe;
  PreTokenizer pre = PreTokenizer::gpt2;  // byte-level only
  std::string pre_name;  // the GGUF tokenizer.ggml.pre it was read from (written back as is)
  // Byte-level: raw bytes. SentencePiece: the piece as UTF-8 (with U+2581), "<0xNN>" for byte
  // tokens. Added tokens: their content.
  std::vector<std::string> tokens;
  std::vector<std::pair<int32_t, int32_t>> merges;  // in rank order
  std::vector<int32_t> merge_ranks;  // empty: rank = position; else per merge (GGUF scores)
  std::vector<float> scores;         // SentencePiece from GGUF: per token; else empty
  std::vector<AddedToken> added;
  // Byte-level: ids whose vocabulary string is not over the byte alphabet (Command-R's raw
  // emoji, which Hugging Face keeps but its byte-level encoding never reaches): `tokens` holds
  // the string itself, and encoding never produces them.
  std::vector<int32_t> verbatim;
  bool ignore_merges = false;  // HF option: a pre-token that is itself a token skips merging
  SpacePrefix space_prefix = SpacePrefix::none;  // SentencePiece only
  bool split_at_spaces = false;  // SentencePiece: merges never cross U+2581 (Metaspace split)
  // SentencePiece: merges never cross the edge of a run of '\n' (GGUF model "gemma4", whose
  // pre-tokenizer splits the text into runs of newlines and runs of anything else).
  bool split_newline_runs = false;
  // WordPiece: BertNormalizer's lowercase and strip_accents.
  bool bert_lowercase = true;
  bool bert_strip_accents = true;
  // HF "NFC" normalizer (Qwen2; GGUF pre "qwen2"): text between added tokens is put in NFC
  // before pre-tokenization.
  bool nfc = false;
  SpecialTokens special;

  // index
  std::vector<uint8_t> is_added;     // id -> 1 added (decoded by content), 2 added and special
  std::vector<uint8_t> is_verbatim;  // id -> 1 for the ids in `verbatim` (index_added)
  // Per entry of `added`: the literal matched in the text (content, or NFC(content) for a
  // normalized token when nfc is on, as HF normalizes those); any_normalized_added: some token
  // is matched after normalization, which takes a second split.
  std::vector<std::string> added_pattern;
  bool any_normalized_added = false;
  bool any_plain_added = false;  // some added token is not special (GGUF USER_DEFINED)
  std::vector<int16_t> byte_of;  // SentencePiece: id -> byte of a <0xNN> token, else -1
  int32_t byte_ids[256] = {};    // token of byte b (byte-level) or <0xNN> (SentencePiece); -1: none
  MergeTable merge_table;
  std::unordered_map<std::string, int32_t> ids_by_bytes;  // ordinary tokens
  int32_t eot = -1;
  std::vector<int32_t> end_of_generation;

  // Builds the index; `source` names the file in errors (a merge whose result is no token, a
  // duplicate token). Throws tessera::Error.
  void finalize(const std::string& source);
  void index_added(const std::string& source);       // checks `added`, fills is_added
  void finalize_special(const std::string& source);  // checks `special`, derives eot and eog
  // Appends the ids of `text`: split at added tokens (those matched in the raw text, then the
  // normalized ones in each normalized piece between them; the special ones only with
  // `specials`), the rest through encode_segment.
  void encode_with_added(std::string_view text, bool specials, std::vector<int32_t>* out) const;
  // Normalizes (NFC when on) and encodes text that holds no added token.
  void encode_normalized(std::string_view text, bool at_start, std::vector<int32_t>* out) const;
  // Appends the ids of one segment of text between added tokens; `at_start`: it begins the
  // text (SentencePiece prefix scheme "first").
  void encode_segment(std::string_view text, bool at_start, std::vector<int32_t>* out) const;
  // Appends the ids of one pre-token (BPE by merge rank).
  void encode_word(std::string_view word, std::vector<int32_t>* out) const;
  void encode_ordinary_into(std::string_view text, std::vector<int32_t>* out) const;
  // WordPiece counterparts (wordpiece.cc).
  void finalize_wordpiece(const std::string& source);
  void encode_wordpiece_segment(std::string_view text, std::vector<int32_t>* out) const;
  // SentencePiece counterparts (tokenizer_spm.cc).
  void finalize_spm(const std::string& source);
  void encode_spm_segment(std::string_view text, bool at_start, std::vector<int32_t>* out) const;
  // Runs the merges over `ids` (initial symbols) and appends the result.
  void merge_symbols(std::vector<int32_t>& ids, std::vector<int32_t>* out) const;
  std::string piece_text(int32_t id) const;  // what decode_token returns
  // The string tokenizer.json and GGUF store for id: byte-level tokens in GPT-2's alphabet.
  std::string vocab_string(int32_t id) const;
};

struct Tokenizer::Impl : TokenizerState {};

}  // namespace tessera::tokenizer
