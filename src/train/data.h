// Training data: token shard files (write, validated read), corpus preparation, a shuffled
// (B, T) batch loader whose position is saved in checkpoints, and a fixed validation loader.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.h"

namespace tessera::train {

// Shard file layout, little-endian, 40-byte header then the tokens:
//   magic "TSRA" | u32 version | u32 token bytes (2 = u16, 4 = u32) | u32 reserved (0)
//   | u64 token count | u64 vocab size | u64 FNV-1a-64 checksum of the token bytes
// Tokens are u16 when the vocabulary fits (V <= 65535), else u32.
constexpr uint32_t kShardVersion = 1;
constexpr int64_t kShardHeaderBytes = 40;
// Tokens per shard file: keeps each file under 512 MiB even at u32.
constexpr int64_t kShardMaxTokens = int64_t{1} << 27;

// Writes tokens (each in [0, vocab)) to `path` atomically. Throws naming the file.
void write_shard(const std::string& path, const std::vector<int32_t>& tokens, int64_t vocab);

struct Shard {
  std::string path;
  int64_t vocab = 0;
  std::vector<int32_t> tokens;
};
// Reads and validates a shard: magic, version, token width, header size vs file size, checksum,
// every token < vocab. Throws Error naming the file and the field at fault.
Shard read_shard(const std::string& path);

// Documents are separated by a line holding only "%" (fortune files) or by a blank line (two
// consecutive newlines). Empty documents are dropped. Separator lines are not part of any text.
std::vector<std::string> split_documents(const std::string& text);

struct PrepareOptions {
  std::string tokenizer_path, input_path, out_dir;
  double val_fraction = 0.01;
  int64_t min_tokens = 65;  // each split must hold at least this many (one T=64 window + target)
};
struct PrepareStats {
  int64_t documents = 0, train_tokens = 0, val_tokens = 0, vocab = 0;
  int train_shards = 0, val_shards = 0;
};
// Tokenizes the corpus: each document is encoded (special-token text is ordinary text) and
// followed by the tokenizer's end-of-text token (if it has one). The token stream is split by
// count: the last ceil(val_fraction * N) tokens go to validation. Writes <out>/train_NNN.bin,
// <out>/val_NNN.bin, <out>/tokenizer.json and <out>/meta.json.
PrepareStats prepare_data(const PrepareOptions& opt);
// Writes tokens[0, n_train) as the train split and the rest as the validation split (shards
// <split>_NNN.bin, and loss_mask's values as <split>_NNN.mask where given) and tokenizer.json into
// `dir` (created); returns the counts, documents left to the caller.
PrepareStats write_splits(const std::string& dir, const std::vector<int32_t>& tokens,
                          int64_t n_train, int64_t vocab, const std::vector<int32_t>* loss_mask,
                          const std::string& tokenizer_json);

// One split ("train" or "val") of a data folder: all its shards concatenated in order.
struct TokenData {
  std::string dir, split;
  int64_t vocab = 0;
  std::vector<int32_t> tokens;
  // One 0/1 per token where the shards carry loss masks (chat data: 1 on the assistant's
  // tokens); a target token with 0 is ignored by the loss. Empty: every token counts.
  std::vector<uint8_t> loss_mask;
};
// Throws if the folder is missing or holds no <split>_*.bin shard, or if some shards have a loss
// mask (<shard>.mask, a shard of 0/1 values with vocabulary 2) and others not.
TokenData load_split(const std::string& dir, const std::string& split);
// "<dir>/train_000.bin" -> "<dir>/train_000.mask".
std::string mask_path_for(const std::string& shard_path);

// Where the loader stands: the epoch, windows consumed in it, and the rng state at the start of
// the epoch (the epoch's permutation is regenerated from it, so the position is 6 integers).
struct LoaderPosition {
  int64_t epoch = 0, index = 0;
  uint64_t rng[4] = {0, 0, 0, 0};
};

// Random (B, T) windows: the stream is cut into non-overlapping windows of T+1 tokens at stride
// T; each epoch visits every window once in an order shuffled by Fisher-Yates from the rng.
class BatchLoader {
 public:
  // Throws if the data holds fewer than T+1 tokens.
  BatchLoader(const TokenData& data, int64_t T, uint64_t seed);
  // inputs (B,T) and targets (B,T) = inputs shifted by one token (-1 where the loss mask is 0).
  void next(int64_t B, int32_t* inputs, int32_t* targets);
  LoaderPosition position() const;
  void set_position(const LoaderPosition& p);  // throws if index is out of range
  int64_t num_windows() const { return static_cast<int64_t>(order_.size()); }

 private:
  void shuffle();
  const TokenData& data_;
  int64_t T_;
  Rng rng_;
  uint64_t epoch_start_[4];
  int64_t epoch_ = 0, index_ = 0;
  std::vector<int64_t> order_;
};

// The first `count` windows (stride T) of the validation split, in order, cycled if the split
// holds fewer; batch b covers windows [b*B, (b+1)*B). Deterministic, so val losses compare.
class ValLoader {
 public:
  ValLoader(const TokenData& data, int64_t T);  // throws if fewer than T+1 tokens
  void batch(int64_t b, int64_t B, int32_t* inputs, int32_t* targets) const;
  int64_t num_windows() const { return n_windows_; }

 private:
  const TokenData& data_;
  int64_t T_, n_windows_;
};

}  // namespace tessera::train
