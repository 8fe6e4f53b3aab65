// Token shards, corpus preparation and the batch loaders.
#include "train/data.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"
#include "formats/gguf.h"
#include "tokenizer/tokenizer.h"

namespace tessera::train {

namespace {

uint64_t fnv1a64(const uint8_t* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

template <typename T>
T get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

std::string shard_name(const std::string& dir, const std::string& split, int i) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "_%03d.bin", i);
  return (std::filesystem::path(dir) / (split + buf)).string();
}

// Writes tokens[begin, end) as shards <split>_000.bin, ... (and loss_mask[begin, end), when
// given, as <split>_000.mask, ...); returns the shard count.
int write_split(const std::string& dir, const std::string& split,
                const std::vector<int32_t>& tokens, int64_t begin, int64_t end, int64_t vocab,
                const std::vector<int32_t>* loss_mask) {
  int n = 0;
  for (int64_t at = begin; at < end; at += kShardMaxTokens, ++n) {
    const int64_t stop = std::min(end, at + kShardMaxTokens);
    const std::string path = shard_name(dir, split, n);
    write_shard(path, std::vector<int32_t>(tokens.begin() + at, tokens.begin() + stop), vocab);
    if (loss_mask != nullptr)
      write_shard(mask_path_for(path),
                  std::vector<int32_t>(loss_mask->begin() + at, loss_mask->begin() + stop), 2);
  }
  return n;
}

}  // namespace

void write_shard(const std::string& path, const std::vector<int32_t>& tokens, int64_t vocab) {
  TS_CHECK(vocab > 0 && vocab <= (int64_t{1} << 31) - 1, "[data] ", path, ": bad vocab size ",
           vocab);
  const uint32_t width = vocab <= 65535 ? 2 : 4;
  std::vector<uint8_t> body(tokens.size() * width);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t t = tokens[i];
    TS_CHECK(t >= 0 && t < vocab, "[data] ", path, ": token ", t, " at ", i, " outside vocab ",
             vocab);
    if (width == 2) {
      const uint16_t u = static_cast<uint16_t>(t);
      std::memcpy(body.data() + i * 2, &u, 2);
    } else {
      const uint32_t u = static_cast<uint32_t>(t);
      std::memcpy(body.data() + i * 4, &u, 4);
    }
  }
  std::vector<uint8_t> head;
  head.insert(head.end(), {'T', 'S', 'R', 'A'});
  put<uint32_t>(head, kShardVersion);
  put<uint32_t>(head, width);
  put<uint32_t>(head, 0);
  put<uint64_t>(head, tokens.size());
  put<uint64_t>(head, static_cast<uint64_t>(vocab));
  put<uint64_t>(head, fnv1a64(body.data(), body.size()));
  AtomicFileWriter w(path);
  w.write(head.data(), head.size());
  w.write(body.data(), body.size());
  w.commit();
}

Shard read_shard(const std::string& path) {
  MappedFile f(path);
  const uint8_t* p = f.data();
  const size_t size = f.size();
  TS_CHECK(size >= static_cast<size_t>(kShardHeaderBytes), "[data] ", path, ": file of ", size,
           " bytes is shorter than the ", kShardHeaderBytes, "-byte header");
  TS_CHECK(std::memcmp(p, "TSRA", 4) == 0, "[data] ", path, ": bad magic (not a token shard)");
  const uint32_t version = get<uint32_t>(p + 4);
  TS_CHECK(version == kShardVersion, "[data] ", path, ": unsupported version ", version);
  const uint32_t width = get<uint32_t>(p + 8);
  TS_CHECK(width == 2 || width == 4, "[data] ", path, ": bad token width ", width);
  const uint64_t count = get<uint64_t>(p + 16);
  const uint64_t vocab = get<uint64_t>(p + 24);
  const uint64_t checksum = get<uint64_t>(p + 32);
  TS_CHECK(vocab > 0 && vocab <= (uint64_t{1} << 31) - 1, "[data] ", path, ": bad vocab size ",
           vocab);
  TS_CHECK(width == 4 || vocab <= 65535, "[data] ", path, ": vocab size ", vocab,
           " does not fit u16 tokens");
  const uint64_t body = size - kShardHeaderBytes;
  TS_CHECK(count <= body / width && count * width == body, "[data] ", path, ": token count ", count,
           " needs ", count, "x", width, " bytes but the file holds ", body,
           " after the header (truncated or corrupt)");
  const uint8_t* data = p + kShardHeaderBytes;
  TS_CHECK(fnv1a64(data, body) == checksum, "[data] ", path, ": checksum mismatch (corrupt)");
  Shard s;
  s.path = path;
  s.vocab = static_cast<int64_t>(vocab);
  s.tokens.resize(count);
  for (uint64_t i = 0; i < count; ++i) {
    const uint32_t t = width == 2 ? get<uint16_t>(data + i * 2) : get<uint32_t>(data + i * 4);
    TS_CHECK(t < vocab, "[data] ", path, ": token ", t, " at ", i, " outside vocab ", vocab);
    s.tokens[i] = static_cast<int32_t>(t);
  }
  return s;
}

std::vector<std::string> split_documents(const std::string& text) {
  std::vector<std::string> docs;
  std::string cur;
  auto flush = [&] {
    // Trailing newlines belong to the separator, not the document.
    while (!cur.empty() && cur.back() == '\n') cur.pop_back();
    if (!cur.empty()) docs.push_back(cur);
    cur.clear();
  };
  size_t at = 0;
  while (at < text.size()) {
    size_t nl = text.find('\n', at);
    const size_t end = nl == std::string::npos ? text.size() : nl;
    std::string line = text.substr(at, end - at);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line == "%" || line.empty()) {
      flush();
    } else {
      cur.append(text, at, end - at);
      if (nl != std::string::npos) cur.push_back('\n');
    }
    at = nl == std::string::npos ? text.size() : nl + 1;
  }
  flush();
  return docs;
}

PrepareStats prepare_data(const PrepareOptions& opt) {
  TS_CHECK(opt.val_fraction > 0 && opt.val_fraction < 1,
           "[prepare] val_fraction must be in (0, 1), got ", opt.val_fraction);
  TS_CHECK(!opt.out_dir.empty(), "[prepare] out_dir must name a folder");
  // The tokenizer: a tokenizer.json, a Hugging Face folder holding one, or a GGUF model's own.
  namespace fs = std::filesystem;
  std::string tok_json;
  const bool gguf = opt.tokenizer_path.ends_with(".gguf");
  const std::string tok_path = fs::is_directory(opt.tokenizer_path)
                                   ? (fs::path(opt.tokenizer_path) / "tokenizer.json").string()
                                   : opt.tokenizer_path;
  const tokenizer::Tokenizer tok =
      gguf ? tokenizer::Tokenizer::from_gguf(formats::GgufFile(tok_path))
           : tokenizer::Tokenizer::load_json(tok_path);
  tok_json = gguf ? tok.to_json_text() : read_text_file(tok_path);
  const std::string text = read_text_file(opt.input_path);
  const std::vector<std::string> docs = split_documents(text);
  TS_CHECK(!docs.empty(), "[prepare] ", opt.input_path, ": no text (empty corpus)");
  const int32_t eot = tok.eot_token();
  std::vector<int32_t> tokens;
  for (const auto& d : docs) {
    const std::vector<int32_t> ids = tok.encode_ordinary(d);
    tokens.insert(tokens.end(), ids.begin(), ids.end());
    if (eot >= 0) tokens.push_back(eot);
  }
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t n_val = static_cast<int64_t>(std::ceil(opt.val_fraction * static_cast<double>(n)));
  const int64_t n_train = n - n_val;
  TS_CHECK(n_train >= opt.min_tokens && n_val >= opt.min_tokens, "[prepare] ", opt.input_path, ": ",
           n, " tokens split into ", n_train, " train and ", n_val,
           " validation tokens; each split needs at least ", opt.min_tokens,
           " (one sequence plus its target): use a larger corpus or another val_fraction");
  // A byte copy of a tokenizer.json, so the run uses exactly the file the user named; a GGUF's
  // tokenizer as the tokenizer.json it converts to.
  PrepareStats st = write_splits(opt.out_dir, tokens, n_train, tok.vocab_size(), nullptr, tok_json);
  st.documents = static_cast<int64_t>(docs.size());
  nlohmann::json meta = {{"format", "tessera-tokens"},       {"version", kShardVersion},
                         {"source", opt.input_path},         {"documents", st.documents},
                         {"vocab_size", st.vocab},           {"eot_token", eot},
                         {"val_fraction", opt.val_fraction}, {"train_tokens", st.train_tokens},
                         {"val_tokens", st.val_tokens},      {"train_shards", st.train_shards},
                         {"val_shards", st.val_shards}};
  write_file_atomic((std::filesystem::path(opt.out_dir) / "meta.json").string(),
                    meta.dump(2) + "\n");
  return st;
}

PrepareStats write_splits(const std::string& dir, const std::vector<int32_t>& tokens,
                          int64_t n_train, int64_t vocab, const std::vector<int32_t>* loss_mask,
                          const std::string& tokenizer_json) {
  make_dirs(dir);
  const auto n = static_cast<int64_t>(tokens.size());
  PrepareStats st;
  st.vocab = vocab;
  st.train_tokens = n_train;
  st.val_tokens = n - n_train;
  st.train_shards = write_split(dir, "train", tokens, 0, n_train, vocab, loss_mask);
  st.val_shards = write_split(dir, "val", tokens, n_train, n, vocab, loss_mask);
  write_file_atomic((std::filesystem::path(dir) / "tokenizer.json").string(), tokenizer_json);
  return st;
}

TokenData load_split(const std::string& dir, const std::string& split) {
  namespace fs = std::filesystem;
  std::error_code ec;
  TS_CHECK(fs::is_directory(dir, ec), "[data] data folder '", dir, "' does not exist");
  std::vector<std::string> paths;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(split + "_", 0) == 0 && e.path().extension() == ".bin")
      paths.push_back(e.path().string());
  }
  TS_CHECK(!paths.empty(), "[data] data folder '", dir, "' holds no ", split,
           "_*.bin shards (run 'tessera prepare' first)");
  std::sort(paths.begin(), paths.end());
  TokenData d;
  d.dir = dir;
  d.split = split;
  int masked = 0;
  for (const auto& p : paths) {
    Shard s = read_shard(p);
    d.vocab = std::max(d.vocab, s.vocab);
    d.tokens.insert(d.tokens.end(), s.tokens.begin(), s.tokens.end());
    const std::string mask_path = mask_path_for(p);
    if (!file_exists(mask_path)) continue;
    ++masked;
    const Shard m = read_shard(mask_path);
    TS_CHECK(m.vocab == 2 && m.tokens.size() == s.tokens.size(), "[data] ", mask_path,
             ": a loss mask must hold one 0 or 1 for each of the ", s.tokens.size(), " tokens of ",
             p);
    d.loss_mask.insert(d.loss_mask.end(), m.tokens.begin(), m.tokens.end());
  }
  TS_CHECK(masked == 0 || masked == static_cast<int>(paths.size()), "[data] data folder '", dir,
           "': ", masked, " of the ", paths.size(), " ", split,
           " shards have a loss mask (.mask); all or none must");
  return d;
}

std::string mask_path_for(const std::string& shard_path) {
  return std::filesystem::path(shard_path).replace_extension(".mask").string();
}

namespace {
// targets (T) = the tokens after src (T), or -1 (ignored by the loss) where the data's loss mask
// leaves the target token out.
void copy_targets(const TokenData& d, int64_t start, int64_t T, int32_t* targets) {
  const int32_t* src = d.tokens.data() + start + 1;
  if (d.loss_mask.empty()) {
    std::memcpy(targets, src, static_cast<size_t>(T) * 4);
    return;
  }
  const uint8_t* mask = d.loss_mask.data() + start + 1;
  for (int64_t t = 0; t < T; ++t) targets[t] = mask[t] ? src[t] : -1;
}
}  // namespace

BatchLoader::BatchLoader(const TokenData& data, int64_t T, uint64_t seed)
    : data_(data), T_(T), rng_(seed) {
  const int64_t n = static_cast<int64_t>(data.tokens.size());
  TS_CHECK(T > 0 && n >= T + 1, "[data] ", data.dir, " ", data.split, " split holds ", n,
           " tokens, fewer than one sequence of ", T, " plus its target");
  order_.resize(static_cast<size_t>((n - 1) / T));
  shuffle();
}

void BatchLoader::shuffle() {
  std::memcpy(epoch_start_, rng_.state(), sizeof(epoch_start_));
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = static_cast<int64_t>(i);
  for (size_t i = order_.size(); i > 1; --i) std::swap(order_[i - 1], order_[rng_.below(i)]);
  index_ = 0;
}

void BatchLoader::next(int64_t B, int32_t* inputs, int32_t* targets) {
  for (int64_t b = 0; b < B; ++b) {
    if (index_ == num_windows()) {
      ++epoch_;
      shuffle();
    }
    const int64_t start = order_[static_cast<size_t>(index_++)] * T_;
    std::memcpy(inputs + b * T_, data_.tokens.data() + start, static_cast<size_t>(T_) * 4);
    copy_targets(data_, start, T_, targets + b * T_);
  }
}

LoaderPosition BatchLoader::position() const {
  LoaderPosition p;
  p.epoch = epoch_;
  p.index = index_;
  std::memcpy(p.rng, epoch_start_, sizeof(p.rng));
  return p;
}

void BatchLoader::set_position(const LoaderPosition& p) {
  TS_CHECK(p.epoch >= 0 && p.index >= 0 && p.index <= num_windows(), "[data] loader position (",
           p.epoch, ", ", p.index, ") out of range for ", num_windows(), " windows");
  rng_.set_state(p.rng);
  shuffle();
  epoch_ = p.epoch;
  index_ = p.index;
}

ValLoader::ValLoader(const TokenData& data, int64_t T) : data_(data), T_(T) {
  const int64_t n = static_cast<int64_t>(data.tokens.size());
  TS_CHECK(T > 0 && n >= T + 1, "[data] ", data.dir, " ", data.split, " split holds ", n,
           " tokens, fewer than one sequence of ", T, " plus its target");
  n_windows_ = (n - 1) / T;
}

void ValLoader::batch(int64_t b, int64_t B, int32_t* inputs, int32_t* targets) const {
  for (int64_t i = 0; i < B; ++i) {
    const int64_t w = (b * B + i) % n_windows_;
    std::memcpy(inputs + i * T_, data_.tokens.data() + w * T_, static_cast<size_t>(T_) * 4);
    copy_targets(data_, w * T_, T_, targets + i * T_);
  }
}

}  // namespace tessera::train
