// The generation engine: runs a decoder model over the tokens of several sequences at once,
// keeping each sequence's keys and values in the paged cache. Prefill (many tokens of one
// sequence) and decode (one token of each of many sequences) are the same call: every token row
// goes through the weight matrices together, so a weight byte read serves all rows.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "infer/kv_cache.h"
#include "model/decoder.h"
#include "model/decoder_forward.h"
#include "ops/context.h"
#include "ops/ops.h"

namespace tessera::infer {

struct EngineOptions {
  int64_t max_ctx = 4096;     // longest sequence (clamped to nothing: must be <= model's)
  int64_t kv_tokens = 0;      // cache capacity in tokens over all sequences; 0 = max_ctx
  int64_t block_tokens = 32;  // cache block size
  // Token rows per forward chunk (the activation buffers are sized by it). 0: the fewest rows at
  // which every layer matrix's product runs at full speed (ops::matmul_wt_saturating_rows: 512
  // for float weights, which the packed GEMM widens once per call, 128 for the integer kernels).
  int64_t max_rows = 0;
  DType kv_type = DType::f32;  // KV cache elements: f32, or f16 (half the memory and traffic)
  // threads; reference kernels for tests; another device (cuda) runs the forward pass through
  // ops/ on the backend registered for it, with the weights, activations and the KV cache in its
  // memory (ops::Buffer), and the sequence bookkeeping and the embedding lookup
  // (model::DecoderForward::embed) on the host.
  ops::Context ctx;
  // Widen every weight matrix to f32 once at start, so activations are never quantized: the
  // accuracy yardstick for the integer kernels (4-8x the memory, much slower decode).
  bool float_weights = false;
  // Live sequences at most; 0: no bound. With a bound, a model's sliding-window layers
  // (DecoderConfig::window) keep their keys and values in a pool of their own sized for that
  // many windows, each sequence's blocks freed as its window moves past them, so a long context
  // costs the other layers' cache only (Gemma 3: a sixth). Sequences then cannot take cached
  // blocks (share_blocks: the prefix cache needs every layer's) nor be cut back into a freed
  // window.
  int64_t max_sequences = 0;
};

// The cache pools an engine of options o (max_rows resolved, > 0) makes for a model of config c:
// every layer in full, or (windowed.n_blocks > 0) the layers without a window in full and the
// sliding-window layers in windowed (EngineOptions::max_sequences).
struct KvPools {
  KvCacheShape full, windowed;
  int64_t bytes() const { return full.bytes() + windowed.bytes(); }
};
KvPools kv_pools(const model::DecoderConfig& c, const EngineOptions& o);

// One sequence's share of a forward call.
struct Feed {
  int32_t seq = -1;
  std::span<const int32_t> tokens;  // appended to the sequence, in order
  bool all_logits = false;          // logits for every token, not only the last
};

// The parts of a forward pass (model::Stage): ops::Scopes that an observer in
// EngineOptions::ctx sums (ops/op_tally.h).
using model::kNumStages;
using model::Stage;
using model::stage_name;

struct EngineStats {
  double seconds = 0;
  int64_t rows = 0, forward_calls = 0;
  // Adds o's figures to these (totals over several runs).
  EngineStats& operator+=(const EngineStats& o);
};

class Engine {
 public:
  Engine(const model::DecoderModel& model, const EngineOptions& opts);

  const model::DecoderModel& model() const { return model_; }
  const model::DecoderConfig& config() const { return model_.config; }
  const EngineOptions& options() const { return opts_; }
  const KvCache& cache() const { return cache_; }
  // The cache's block references, for holders of blocks beside the sequences (the prefix cache).
  KvCache& cache() { return cache_; }
  // The sliding-window layers' own pool (EngineOptions::max_sequences), or null: every layer's
  // keys and values are in cache().
  const KvCache* window_cache() const { return window_cache_.get(); }
  // Bytes of both pools.
  int64_t kv_bytes() const;
  // Cached key and value bytes one row attending over `keys` keys reads, over every layer (a
  // sliding-window layer reads its window's only).
  int64_t kv_bytes_read(int64_t keys) const;

  int32_t new_sequence();
  void free_sequence(int32_t seq);  // drops its references to its blocks
  int64_t sequence_length(int32_t seq) const;
  // Drops the last tokens so the sequence has `length` tokens (keeps blocks still needed).
  void truncate_sequence(int32_t seq, int64_t length);
  // A new sequence holding the tokens src holds, in src's blocks (shared, not copied: a partly
  // filled block that one of them then appends to is copied first).
  int32_t fork_sequence(int32_t src);
  // A new sequence holding the tokens src holds, in blocks of its own (copied now): what a
  // benchmark uses to make many sequences of one long prompt without prefilling each, their
  // keys and values still read from distinct memory.
  int32_t copy_sequence(int32_t src);
  // Gives the empty sequence seq the first `tokens` tokens, whose keys and values are in `blocks`
  // (blocks in use, now shared); tokens must end in the last block.
  void share_blocks(int32_t seq, std::span<const int32_t> blocks, int64_t tokens);
  std::span<const int32_t> sequence_blocks(int32_t seq) const;
  // Free cache blocks that appending n tokens to seq takes: new blocks, and the copy of a partly
  // filled last block that seq shares.
  int64_t blocks_to_append(int32_t seq, int64_t n) const;

  // What forward() returns per row: logits (V), or the last hidden state (C: the final norm's
  // output, for embeddings).
  using Output = model::DecoderForward::Output;
  // Runs the model over the feeds (distinct sequences) and returns logits (rows, V): one row per
  // feed (its last token), or one per token for feeds with all_logits, in feed order (with
  // Output::hidden, hidden states (rows, C)). Tokens outside [0, V), a sequence growing past
  // max_ctx or a cache without the blocks_to_append the feeds need throw, naming them; the cache
  // is then unchanged for every sequence.
  const std::vector<float>& forward(const std::vector<Feed>& feeds, Output what = Output::logits);

  // "cpu", or the device and its ops backend's description.
  std::string device_description() const;

  const EngineStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

 private:
  struct Sequence {
    bool live = false;
    int64_t length = 0;
    int64_t fed_in_call = -1;  // the forward call that last fed it (catches a sequence fed twice)
    std::vector<int32_t> blocks;
    // In window_cache_, by position as blocks; -1: freed (before the window) or not yet taken.
    std::vector<int32_t> window_blocks;
  };
  struct Row {
    int32_t seq;
    int32_t token;
    int32_t pos;
    bool want_logits;
  };
  const Sequence& live_sequence(int32_t seq) const;
  // Makes seq's last block its own before an append writes to it (copy-on-write).
  void own_last_block(Sequence& s);
  // A new block of pool (cache_ or *window_cache_) holding src's keys and values.
  int32_t copy_block(KvCache& pool, int32_t src);
  // Windowed pool: takes the blocks rows at positions first_pos .. last_pos read (from the
  // first one's window on); frees those wholly before the window of a row at next_pos.
  void take_window_blocks(Sequence& s, int64_t first_pos, int64_t last_pos);
  void free_window_blocks(Sequence& s, int64_t next_pos);
  void run_chunk(const Row* rows, int64_t n, Output what);

  model::DecoderModel model_;
  EngineOptions opts_;
  KvCache cache_;
  std::unique_ptr<KvCache> window_cache_;
  // The shared forward pass on a device: the weights there and the pools' blocks.
  model::DeviceModel device_model_;
  ops::Buffer cache_device_, window_device_;
  std::vector<const int32_t*> window_tables_;  // a chunk's rows' window_blocks
  std::vector<Sequence> seqs_;
  // The model's forward pass (its activations for max_rows rows), and a chunk's rows as it reads
  // them.
  std::unique_ptr<model::DecoderForward> fwd_;
  std::vector<int32_t> tokens_, positions_;
  std::vector<const int32_t*> tables_;
  std::vector<uint8_t> want_;
  std::vector<float> logits_;  // or hidden states
  std::vector<Row> rows_;      // this call's token rows (kept to reuse its memory)
  int64_t logit_rows_done_ = 0;
  int64_t calls_ = 0;
  EngineStats stats_;
};

}  // namespace tessera::infer
