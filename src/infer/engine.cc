// Generation engine: sequences and their cache blocks, the token rows of each call cut into
// chunks, each chunk run by the model's forward pass (model::DecoderForward) or the device
// decoder, and the logits of the rows asked for.
#include "infer/engine.h"

#include <algorithm>
#include <memory>

#include "core/error.h"
#include "core/interleave.h"
#include "ops/backend.h"
#include "ops/quant.h"
#include "profile/timer.h"

namespace tessera::infer {

using model::DecoderArch;
using model::WeightRef;

namespace {

// Token rows per forward chunk where opts leave it to the weights (see EngineOptions::max_rows).
int64_t chunk_rows(const model::DecoderModel& m, const EngineOptions& o) {
  if (o.max_rows > 0) return o.max_rows;
  if (o.ctx.device == ops::Device::cuda) return 512;
  // Prefill chunks of 128 rows instead of 512 save 3/4 of the activation memory (45 MB for a
  // 1B model) where no product gains from the extra rows.
  int64_t rows = 0;
  for (const model::DecoderLayer& l : m.weights.layers)
    for (const WeightRef* r : l.matrices())
      if (r->present())
        rows = std::max(
            rows, ops::matmul_wt_saturating_rows(o.ctx, o.float_weights ? DType::f32 : r->type));
  return rows > 0 ? rows : 512;
}

EngineOptions resolved(const model::DecoderModel& m, const EngineOptions& o) {
  TS_CHECK(o.max_rows >= 0, "[engine] max_rows must be >= 0 (0 chooses from the weights)");
  TS_CHECK(o.max_sequences >= 0, "[engine] max_sequences must be >= 0 (0: no bound)");
  EngineOptions r = o;
  r.max_rows = chunk_rows(m, o);
  return r;
}

}  // namespace

// A sequence's chunk of up to max_rows rows at positions p0 .. p1 reads the windowed blocks
// from (p0 + 1 - W) / BT to p1 / BT: at most (max_rows + W - 2) / BT + 2, so max_sequences of
// those bound the pool; it is kept apart only where that is smaller.
KvPools kv_pools(const model::DecoderConfig& c, const EngineOptions& o) {
  TS_CHECK(o.max_rows > 0, "[engine] kv_pools needs max_rows resolved");
  TS_CHECK(o.max_ctx > 0 && o.max_ctx <= c.max_ctx, "[engine] max_ctx ", o.max_ctx,
           " must be in [1, ", c.max_ctx, "] (the model's context length)");
  TS_CHECK(o.block_tokens > 0, "[engine] block_tokens must be > 0");
  TS_CHECK(o.kv_tokens >= 0, "[engine] kv_tokens must be >= 0");
  KvPools p;
  KvCacheShape& s = p.full;
  s.n_layers = c.n_layers;
  s.n_kv_heads = c.n_kv_heads;
  s.head_dim = c.head_dim;
  s.block_tokens = o.block_tokens;
  s.type = o.kv_type;
  const int64_t tokens = o.kv_tokens ? o.kv_tokens : o.max_ctx;
  s.n_blocks = (tokens + o.block_tokens - 1) / o.block_tokens;
  const int64_t W = c.sliding_window, BT = o.block_tokens;
  int64_t windowed = 0;
  for (int64_t l = 0; l < c.n_layers; ++l) windowed += c.window(l) > 0;
  if (o.max_sequences == 0 || windowed == 0 || W >= o.max_ctx) return p;
  const int64_t per_sequence = (o.max_rows + W - 2 + BT - 1) / BT + 2;
  if (o.max_sequences * per_sequence >= s.n_blocks) return p;
  p.windowed = s;
  p.windowed.n_layers = windowed;
  p.windowed.n_blocks = o.max_sequences * per_sequence;
  s.n_layers -= windowed;
  return p;
}

Engine::Engine(const model::DecoderModel& model, const EngineOptions& opts)
    : model_(model),
      opts_(resolved(model, opts)),
      cache_(kv_pools(model.config, opts_).full, opts.ctx.device == ops::Device::cpu) {
  const bool on_host = opts_.ctx.device == ops::Device::cpu;
  ops::require_device(opts_.ctx, "the engine");
  if (const KvCacheShape w = kv_pools(model.config, opts_).windowed; w.n_blocks > 0)
    window_cache_ = std::make_unique<KvCache>(w, on_host);
  // Norm weights and biases are read as f32 vectors: widen any other type once, here.
  auto widen = [&](WeightRef& r) {
    if (!r.present() || r.type == DType::f32) return;
    auto buf = std::make_shared<std::vector<float>>(static_cast<size_t>(r.shape.numel()));
    if (is_interleaved(r.type)) {  // row-interleaved CPU layouts convert row by row
      for (int64_t row = 0; row < r.rows(); ++row)
        ops::dequantize_row(r.data, r.type, r.cols(), row, buf->data() + row * r.cols());
    } else {
      to_f32(r.type, r.data, buf->data(), r.shape.numel());
    }
    r = WeightRef{buf->data(), DType::f32, r.shape};
    model_.owners.push_back(buf);
  };
  for (model::DecoderLayer& l : model_.weights.layers)
    for (WeightRef* r : l.vectors()) widen(*r);
  widen(model_.weights.out_norm);
  widen(model_.weights.out_norm_b);
  if (opts_.float_weights) {
    const bool tied = model_.weights.output.data == model_.weights.tok_embd.data;
    for (model::DecoderLayer& l : model_.weights.layers)
      for (WeightRef* r : l.matrices()) widen(*r);
    widen(model_.weights.tok_embd);
    widen(model_.weights.pos_embd);
    if (tied)
      model_.weights.output = model_.weights.tok_embd;
    else
      widen(model_.weights.output);
  }

  const auto rows = static_cast<size_t>(opts_.max_rows);
  tokens_.resize(rows);
  positions_.resize(rows);
  tables_.resize(rows);
  window_tables_.resize(rows);
  want_.resize(rows);
  device_model_ = model::to_device(model_, opts_.ctx);
  if (!on_host) {
    cache_device_ = ops::Buffer(opts_.ctx.device, static_cast<size_t>(cache_.bytes()));
    if (window_cache_)
      window_device_ = ops::Buffer(opts_.ctx.device, static_cast<size_t>(window_cache_->bytes()));
  }
  fwd_ = std::make_unique<model::DecoderForward>(device_model_.view, opts_.ctx, opts_.max_rows,
                                                 opts_.max_ctx);
}

std::string Engine::device_description() const {
  if (opts_.ctx.device == ops::Device::cpu) return "cpu";
  size_t weights = 0;
  for (const ops::Buffer& b : device_model_.buffers) weights += b.size();
  auto gb = [](double b) { return b / 1e9; };
  return cat(
      ops::device_name(opts_.ctx.device), " (", ops::backend(opts_.ctx.device).name(),
      " ops backend): weights ", gb(static_cast<double>(weights)), " GB, KV cache ",
      gb(static_cast<double>(cache_device_.size() + window_device_.size())), " GB, activations ",
      gb(static_cast<double>(model::DecoderForward::activation_bytes(config(), opts_.max_rows))),
      " GB");
}

int32_t Engine::new_sequence() {
  for (size_t i = 0; i < seqs_.size(); ++i)
    if (!seqs_[i].live) {
      seqs_[i] = Sequence{true, 0, -1, {}, {}};
      return static_cast<int32_t>(i);
    }
  if (window_cache_) {
    int64_t live = 0;
    for (const Sequence& s : seqs_) live += s.live;
    TS_CHECK(live < opts_.max_sequences, "[engine] ", live,
             " sequences are live, the most the sliding-window pool was sized for "
             "(max_sequences)");
  }
  seqs_.push_back(Sequence{true, 0, -1, {}, {}});
  return static_cast<int32_t>(seqs_.size() - 1);
}

const Engine::Sequence& Engine::live_sequence(int32_t seq) const {
  TS_CHECK(seq >= 0 && static_cast<size_t>(seq) < seqs_.size() && seqs_[seq].live,
           "[engine] no live sequence ", seq);
  return seqs_[static_cast<size_t>(seq)];
}

void Engine::free_sequence(int32_t seq) {
  for (int32_t b : live_sequence(seq).blocks) cache_.release(b);
  for (int32_t b : seqs_[seq].window_blocks)
    if (b >= 0) window_cache_->release(b);
  seqs_[seq] = Sequence{};
}

int64_t Engine::sequence_length(int32_t seq) const {
  return live_sequence(seq).length;
}

std::span<const int32_t> Engine::sequence_blocks(int32_t seq) const {
  return live_sequence(seq).blocks;
}

void Engine::truncate_sequence(int32_t seq, int64_t length) {
  TS_CHECK(length >= 0 && length <= sequence_length(seq), "[engine] cannot truncate sequence ", seq,
           " to ", length, " tokens");
  Sequence& s = seqs_[seq];
  const int64_t BT = opts_.block_tokens;
  const auto keep = static_cast<size_t>((length + BT - 1) / BT);
  if (window_cache_ && length > 0 && length < s.length) {
    // The next row, at position length, reads keys from length + 1 - W on.
    const int64_t first = std::max<int64_t>(0, length + 1 - config().sliding_window);
    TS_CHECK(s.window_blocks[static_cast<size_t>(first / BT)] >= 0, "[engine] cannot cut sequence ",
             seq, " back to ", length, " tokens: its sliding-window layers' keys from token ",
             first, " on are freed");
  }
  s.length = length;
  while (s.blocks.size() > keep) {
    cache_.release(s.blocks.back());
    s.blocks.pop_back();
  }
  while (s.window_blocks.size() > keep) {
    if (s.window_blocks.back() >= 0) window_cache_->release(s.window_blocks.back());
    s.window_blocks.pop_back();
  }
}

int32_t Engine::fork_sequence(int32_t src) {
  live_sequence(src);
  const int32_t seq = new_sequence();
  Sequence& s = seqs_[static_cast<size_t>(seq)];
  s.length = seqs_[static_cast<size_t>(src)].length;
  s.blocks = seqs_[static_cast<size_t>(src)].blocks;
  s.window_blocks = seqs_[static_cast<size_t>(src)].window_blocks;
  for (int32_t b : s.blocks) cache_.retain(b);
  for (int32_t b : s.window_blocks)
    if (b >= 0) window_cache_->retain(b);
  return seq;
}

int32_t Engine::copy_sequence(int32_t src) {
  const int64_t n = static_cast<int64_t>(live_sequence(src).blocks.size());
  TS_CHECK(cache_.free_blocks() >= n, "[engine] copying sequence ", src, " takes ", n,
           " cache blocks; ", cache_.free_blocks(), " are free");
  int64_t window_live = 0;
  for (int32_t b : seqs_[static_cast<size_t>(src)].window_blocks) window_live += b >= 0;
  TS_CHECK(!window_cache_ || window_cache_->free_blocks() >= window_live,
           "[engine] copying sequence ", src, " takes ", window_live, " sliding-window blocks; ",
           window_cache_ ? window_cache_->free_blocks() : 0, " are free");
  const int32_t seq = fork_sequence(src);
  Sequence& s = seqs_[static_cast<size_t>(seq)];
  for (int32_t& b : s.blocks) {
    const int32_t dst = copy_block(cache_, b);
    cache_.release(b);
    b = dst;
  }
  for (int32_t& b : s.window_blocks) {
    if (b < 0) continue;
    const int32_t dst = copy_block(*window_cache_, b);
    window_cache_->release(b);
    b = dst;
  }
  return seq;
}

int32_t Engine::copy_block(KvCache& pool, int32_t src) {
  const int32_t dst = pool.allocate();
  const auto bytes = static_cast<size_t>(pool.block_stride() * pool.elem_bytes());
  const ops::Buffer& there = &pool == &cache_ ? cache_device_ : window_device_;
  uint8_t* base = there.data() ? there.as<uint8_t>() : pool.layer_base(0);
  ops::copy(opts_.ctx, base + static_cast<size_t>(dst) * bytes,
            base + static_cast<size_t>(src) * bytes, bytes, ops::CopyKind::device_to_device);
  return dst;
}

int64_t Engine::kv_bytes() const {
  return cache_.bytes() + (window_cache_ ? window_cache_->bytes() : 0);
}

int64_t Engine::kv_bytes_read(int64_t keys) const {
  const model::DecoderConfig& c = config();
  int64_t rows = 0;  // key rows over all layers
  for (int64_t l = 0; l < c.n_layers; ++l)
    rows += c.window(l) > 0 ? std::min(keys, c.window(l)) : keys;
  return rows * 2 * c.n_kv_heads * c.head_dim * cache_.elem_bytes();
}

void Engine::take_window_blocks(Sequence& s, int64_t first_pos, int64_t last_pos) {
  // The blocks of new positions are taken; those of the first row's window must still be held.
  const int64_t BT = opts_.block_tokens;
  const int64_t from = std::max<int64_t>(0, first_pos + 1 - config().sliding_window) / BT;
  for (int64_t b = from; b < static_cast<int64_t>(s.window_blocks.size()); ++b)
    TS_CHECK(s.window_blocks[static_cast<size_t>(b)] >= 0, "[engine] the sliding-window block of ",
             "positions ", b * BT, " .. ", (b + 1) * BT - 1, " was freed inside a window");
  while (static_cast<int64_t>(s.window_blocks.size()) <= last_pos / BT)
    s.window_blocks.push_back(window_cache_->allocate());
}

void Engine::free_window_blocks(Sequence& s, int64_t next_pos) {
  // A row at next_pos reads keys from next_pos + 1 - W on: blocks ending before that go.
  const int64_t BT = opts_.block_tokens, first = next_pos + 1 - config().sliding_window;
  for (size_t b = 0; b < s.window_blocks.size() && static_cast<int64_t>(b + 1) * BT <= first; ++b)
    if (s.window_blocks[b] >= 0) {
      window_cache_->release(s.window_blocks[b]);
      s.window_blocks[b] = -1;
    }
}

void Engine::share_blocks(int32_t seq, std::span<const int32_t> blocks, int64_t tokens) {
  TS_CHECK(live_sequence(seq).length == 0 && seqs_[seq].blocks.empty(), "[engine] sequence ", seq,
           " is not empty");
  TS_CHECK(!window_cache_,
           "[engine] cached blocks hold no sliding-window layers' keys where "
           "those are kept apart (max_sequences): run the tokens instead");
  const int64_t BT = opts_.block_tokens;
  TS_CHECK(tokens > 0 && tokens <= opts_.max_ctx &&
               (tokens + BT - 1) / BT == static_cast<int64_t>(blocks.size()),
           "[engine] ", tokens, " tokens do not end in the last of ", blocks.size(), " blocks");
  for (int32_t b : blocks) cache_.retain(b);  // checks that each is in use
  Sequence& s = seqs_[static_cast<size_t>(seq)];
  s.blocks.assign(blocks.begin(), blocks.end());
  s.length = tokens;
}

int64_t Engine::blocks_to_append(int32_t seq, int64_t n) const {
  const Sequence& s = live_sequence(seq);
  const int64_t BT = opts_.block_tokens;
  const int64_t grow = (s.length + n + BT - 1) / BT - static_cast<int64_t>(s.blocks.size());
  const bool copy = n > 0 && s.length % BT != 0 && cache_.ref_count(s.blocks.back()) > 1;
  return grow + (copy ? 1 : 0);
}

void Engine::own_last_block(Sequence& s) {
  const int64_t BT = opts_.block_tokens;
  if (s.length % BT == 0) return;
  if (cache_.ref_count(s.blocks.back()) > 1) {
    const int32_t src = s.blocks.back(), dst = copy_block(cache_, src);
    cache_.release(src);
    s.blocks.back() = dst;
  }
  if (s.window_blocks.empty()) return;
  int32_t& w = s.window_blocks.back();
  if (w >= 0 && window_cache_->ref_count(w) > 1) {
    const int32_t src = w, dst = copy_block(*window_cache_, src);
    window_cache_->release(src);
    w = dst;
  }
}

const std::vector<float>& Engine::forward(const std::vector<Feed>& feeds, Output what) {
  const profile::Timer timer;
  const int64_t V = config().vocab, BT = opts_.block_tokens;
  // Validate everything and count blocks before touching the cache.
  ++calls_;
  int64_t blocks_needed = 0, rows_total = 0;
  for (const Feed& f : feeds) {
    live_sequence(f.seq);
    TS_CHECK(seqs_[f.seq].fed_in_call != calls_, "[engine] sequence ", f.seq,
             " fed twice in one call");
    seqs_[f.seq].fed_in_call = calls_;
    TS_CHECK(!f.tokens.empty(), "[engine] empty feed for sequence ", f.seq);
    for (int32_t t : f.tokens)
      TS_CHECK(t >= 0 && t < V, "[engine] token id ", t, " outside the vocabulary [0, ", V, ")");
    const int64_t len = seqs_[f.seq].length, new_len = len + static_cast<int64_t>(f.tokens.size());
    TS_CHECK(new_len <= opts_.max_ctx, "[engine] sequence ", f.seq, " would reach ", new_len,
             " tokens, past the context length ", opts_.max_ctx, " (max_ctx)");
    blocks_needed += blocks_to_append(f.seq, static_cast<int64_t>(f.tokens.size()));
    rows_total += static_cast<int64_t>(f.tokens.size());
  }
  TS_CHECK(blocks_needed <= cache_.free_blocks(), "[kv-cache] full: ", blocks_needed,
           " more blocks needed, ", cache_.free_blocks(), " free (capacity ",
           cache_.shape().n_blocks * BT, " tokens)");

  std::vector<Row>& rows = rows_;
  rows.clear();
  rows.reserve(static_cast<size_t>(rows_total));
  int64_t logit_rows = 0;
  for (const Feed& f : feeds) {
    Sequence& s = seqs_[f.seq];
    const int64_t n = static_cast<int64_t>(f.tokens.size());
    for (int64_t i = 0; i < n; ++i) {
      const bool want = f.all_logits || i == n - 1;
      rows.push_back(Row{f.seq, f.tokens[i], static_cast<int32_t>(s.length + i), want});
      logit_rows += want;
    }
    own_last_block(s);
    while (static_cast<int64_t>(s.blocks.size()) * BT < s.length + n)
      s.blocks.push_back(cache_.allocate());
  }
  const int64_t width = what == Output::logits ? V : config().d_model;
  logits_.resize(static_cast<size_t>(logit_rows * width));
  logit_rows_done_ = 0;
  for (size_t i = 0; i < rows.size(); i += static_cast<size_t>(opts_.max_rows)) {
    const int64_t n = std::min<int64_t>(opts_.max_rows, static_cast<int64_t>(rows.size() - i));
    const Row* chunk = rows.data() + i;
    // The windowed pool's blocks of each sequence's rows in the chunk (consecutive positions),
    // taken before and freed behind the window after.
    auto each_run = [&](auto&& f) {
      for (int64_t r = 0; r < n;) {
        int64_t e = r;
        while (e + 1 < n && chunk[e + 1].seq == chunk[r].seq) ++e;
        f(seqs_[chunk[r].seq], chunk[r].pos, chunk[e].pos);
        r = e + 1;
      }
    };
    if (window_cache_)
      each_run([&](Sequence& s, int64_t p0, int64_t p1) { take_window_blocks(s, p0, p1); });
    run_chunk(chunk, n, what);
    if (window_cache_)
      each_run([&](Sequence& s, int64_t, int64_t p1) { free_window_blocks(s, p1 + 1); });
  }
  for (const Feed& f : feeds) seqs_[f.seq].length += static_cast<int64_t>(f.tokens.size());
  stats_.seconds += timer.seconds();
  stats_.rows += rows_total;
  stats_.forward_calls += 1;
  return logits_;
}

EngineStats& EngineStats::operator+=(const EngineStats& o) {
  seconds += o.seconds;
  rows += o.rows;
  forward_calls += o.forward_calls;
  return *this;
}

void Engine::run_chunk(const Row* rows, int64_t n, Output what) {
  for (int64_t r = 0; r < n; ++r) {
    tokens_[r] = rows[r].token;
    positions_[r] = rows[r].pos;
    tables_[r] = seqs_[rows[r].seq].blocks.data();
    window_tables_[r] = seqs_[rows[r].seq].window_blocks.data();
    want_[r] = rows[r].want_logits ? 1 : 0;
  }
  model::DecoderRows dr;
  dr.n = n;
  dr.tokens = tokens_.data();
  dr.pos = positions_.data();
  dr.tables = tables_.data();
  dr.want_logits = want_.data();
  if (window_cache_) dr.window_tables = window_tables_.data();
  auto paged = [&](KvCache& pool, const ops::Buffer& there) {
    model::PagedKv kv;
    kv.base = there.data() ? there.as<uint8_t>() : pool.layer_base(0);
    kv.layer_stride = 2 * pool.half_block_elems();
    kv.n_blocks = pool.shape().n_blocks;
    kv.layout.Hkv = config().n_kv_heads;
    kv.layout.D = config().head_dim;
    kv.layout.kv_type = pool.type();
    kv.layout.k_transposed = ops::paged_keys_transposed(opts_.ctx.device);
    kv.layout.block_tokens = opts_.block_tokens;
    kv.layout.block_stride = pool.block_stride();
    kv.layout.v_offset = pool.half_block_elems();
    return kv;
  };
  model::PagedKv kv = paged(cache_, cache_device_), windowed;
  if (window_cache_) {
    windowed = paged(*window_cache_, window_device_);
    kv.windowed = &windowed;
  }
  const int64_t width = what == Output::logits ? config().vocab : config().d_model;
  logit_rows_done_ += fwd_->forward(dr, kv, logits_.data() + logit_rows_done_ * width, what);
}

}  // namespace tessera::infer
