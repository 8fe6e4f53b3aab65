// Private state of model::Tokenizer shared by its source files (encode/decode, training, JSON).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "model/tokenizer.h"

namespace tessera::model {

// Open-addressing hash map from a token pair (left id, right id) to the merge that joins it.
// Encoding does one lookup per candidate pair, so this is the hot table.
class MergeTable {
 public:
  struct Merge {
    int32_t rank = -1;    // position in the merge list; lower merges first
    int32_t result = -1;  // id of the joined token
  };
  void build(const std::vector<std::pair<int32_t, int32_t>>& merges,
             const std::vector<int32_t>& results);
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
  bool normalized = false;
};

// Everything a Tokenizer holds. Tokenizer::Impl (private) is this struct; the named type lets
// helper functions in the tokenizer's source files build one.
struct TokenizerState {
  // Source of truth (what JSON stores); everything below `index` is derived by finalize().
  std::vector<std::string> tokens;                  // id -> raw bytes
  std::vector<std::pair<int32_t, int32_t>> merges;  // in rank order
  std::vector<AddedToken> added;
  bool ignore_merges = false;  // HF option: a pre-token that is itself a token skips merging

  // index
  std::vector<uint8_t> is_added;  // id -> 1 for added tokens (decoded by content)
  int32_t byte_ids[256] = {};     // filled by finalize(); an empty tokenizer refuses to encode
  MergeTable merge_table;
  std::unordered_map<std::string, int32_t> ids_by_bytes;  // ordinary tokens
  int32_t eot = -1;

  // Builds the index; `source` names the file in errors (a merge whose result is no token, a
  // missing byte token). Throws tessera::Error.
  void finalize(const std::string& source);
  // Appends the ids of one pre-token (BPE by merge rank).
  void encode_word(std::string_view word, std::vector<int32_t>* out) const;
  void encode_ordinary_into(std::string_view text, std::vector<int32_t>* out) const;
};

struct Tokenizer::Impl : TokenizerState {};

}  // namespace tessera::model
