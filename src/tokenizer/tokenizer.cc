// BPE tokenizer core: byte-level index building, encoding (per pre-token merges by rank with a
// heap), decoding, and the special-token ids (added-token splitting: tokenizer_added.cc).
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <queue>

#include "core/error.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer_impl.h"
#include "unicode/char_class.h"
#include "unicode/nfc.h"

namespace tessera::tokenizer {

int64_t MergeTable::build(const std::vector<std::pair<int32_t, int32_t>>& merges,
                          const std::vector<int32_t>& results, const std::vector<int32_t>& ranks) {
  int64_t repeated = -1;
  // Load factor <= 1/2 keeps probe sequences short.
  size_t cap = 16;
  while (cap < merges.size() * 2) cap *= 2;
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  for (size_t r = 0; r < merges.size(); ++r) {
    const uint64_t key = pack(merges[r].first, merges[r].second);
    size_t i = hash(key) & mask_;
    while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask_;
    if (slots_[i].key == key) {
      if (repeated < 0) repeated = static_cast<int64_t>(r);
      continue;  // the first occurrence keeps its rank
    }
    slots_[i].key = key;
    slots_[i].merge = {ranks.empty() ? static_cast<int32_t>(r) : ranks[r], results[r]};
  }
  return repeated;
}

void TokenizerState::finalize(const std::string& source) {
  if (model == TokenizerModel::sentencepiece_bpe) {
    finalize_spm(source);
    finalize_special(source);
    return;
  }
  if (model == TokenizerModel::wordpiece) {
    finalize_wordpiece(source);
    return;
  }
  const auto n = static_cast<int32_t>(tokens.size());
  index_added(source);
  ids_by_bytes.clear();
  ids_by_bytes.reserve(tokens.size());
  for (int32_t id = 0; id < n; ++id) {
    if (is_added[id] || is_verbatim[id]) continue;
    const auto [it, fresh] = ids_by_bytes.emplace(tokens[id], id);
    TS_CHECK(fresh, "[tokenizer] ", source, ": model.vocab ids ", it->second, " and ", id,
             " name the same token '", bytes_to_vocab_string(tokens[id]), "'");
  }
  // A byte without a token (SmolLM2 lacks 21, e.g. 0x04 and bytes invalid in UTF-8) is dropped
  // by encoding, as Hugging Face does.
  for (int b = 0; b < 256; ++b) {
    const auto it = ids_by_bytes.find(std::string(1, static_cast<char>(b)));
    byte_ids[b] = it != ids_by_bytes.end() ? it->second : -1;
  }
  std::vector<int32_t> results(merges.size());
  MergeTable seen;
  for (size_t r = 0; r < merges.size(); ++r) {
    const auto [a, b] = merges[r];
    TS_CHECK(a >= 0 && a < n && b >= 0 && b < n && !is_added[a] && !is_added[b] &&
                 !is_verbatim[a] && !is_verbatim[b],
             "[tokenizer] ", source, ": model.merges[", r,
             "] names a token that is not in model.vocab (or not byte-level)");
    const auto it = ids_by_bytes.find(tokens[a] + tokens[b]);
    TS_CHECK(it != ids_by_bytes.end(), "[tokenizer] ", source, ": model.merges[", r, "] '",
             bytes_to_vocab_string(tokens[a]), " ", bytes_to_vocab_string(tokens[b]),
             "' joins to a token that is not in model.vocab");
    results[r] = it->second;
  }
  const int64_t r = merge_table.build(merges, results, merge_ranks);
  TS_CHECK(r < 0, "[tokenizer] ", source, ": model.merges[", r, "] '",
           bytes_to_vocab_string(tokens[merges[r].first]), " ",
           bytes_to_vocab_string(tokens[merges[r].second]), "' repeats an earlier merge");
  finalize_special(source);
}

void TokenizerState::index_added(const std::string& source) {
  const auto n = static_cast<int32_t>(tokens.size());
  is_added.assign(tokens.size(), 0);
  for (const AddedToken& a : added) {
    TS_CHECK(a.id >= 0 && a.id < n, "[tokenizer] ", source, ": added_tokens id ", a.id,
             " out of range [0, ", n, ")");
    TS_CHECK(!a.content.empty(), "[tokenizer] ", source, ": added_tokens id ", a.id,
             " has empty content");
    TS_CHECK(!is_added[a.id], "[tokenizer] ", source, ": added_tokens id ", a.id, " is duplicated");
    is_added[a.id] = a.special ? 2 : 1;
    tokens[a.id] = a.content;
  }
  is_verbatim.assign(tokens.size(), 0);
  for (const int32_t id : verbatim) {
    TS_CHECK(id >= 0 && id < n && !is_added[id], "[tokenizer] ", source, ": verbatim token id ", id,
             " is out of range or an added token");
    is_verbatim[id] = 1;
  }
  added_pattern.clear();
  any_normalized_added = false;
  any_plain_added = false;
  std::string buf;
  for (const AddedToken& a : added) {
    added_pattern.emplace_back(a.normalized && nfc ? unicode::nfc_normalize(a.content, &buf)
                                                   : a.content);
    any_normalized_added |= a.normalized;
    any_plain_added |= !a.special;
  }
}

void TokenizerState::finalize_special(const std::string& source) {
  const auto n = static_cast<int32_t>(tokens.size());
  auto id_of_added = [&](std::string_view content) {
    for (const AddedToken& a : added)
      if (a.content == content) return a.id;
    return int32_t{-1};
  };
  eot = id_of_added("<|endoftext|>");
  if (eot < 0) {
    const auto it = ids_by_bytes.find("<|endoftext|>");
    if (it != ids_by_bytes.end()) eot = it->second;
  }
  const std::pair<const char*, int32_t> ids[] = {{"bos", special.bos},
                                                 {"eos", special.eos},
                                                 {"eot", special.eot},
                                                 {"pad", special.pad},
                                                 {"unk", special.unk}};
  for (const auto& [name, id] : ids)
    TS_CHECK(id >= -1 && id < n, "[tokenizer] ", source, ": ", name, " token id ", id,
             " out of range [0, ", n, ")");
  static constexpr const char* kEndOfTurn[] = {"<|im_end|>", "<|eot_id|>", "<|end|>"};
  for (const char* name : kEndOfTurn)
    if (special.eot < 0) special.eot = id_of_added(name);
  end_of_generation.clear();
  for (const int32_t id : {special.eos, special.eot, eot}) end_of_generation.push_back(id);
  static constexpr const char* kEnders[] = {"<|endoftext|>", "<|end_of_text|>", "<|im_end|>",
                                            "<|eot_id|>",    "<|eom_id|>",      "<|end|>"};
  for (const char* name : kEnders) end_of_generation.push_back(id_of_added(name));
  std::sort(end_of_generation.begin(), end_of_generation.end());
  end_of_generation.erase(std::unique(end_of_generation.begin(), end_of_generation.end()),
                          end_of_generation.end());
  if (!end_of_generation.empty() && end_of_generation.front() < 0)
    end_of_generation.erase(end_of_generation.begin());
}

namespace {

// Scratch buffers reused across words so encoding a word allocates nothing.
struct WordScratch {
  struct Candidate {
    int32_t rank, pos, left, right;
    // std::priority_queue is a max-heap: "greater" means lower priority. Lowest rank first, then
    // leftmost, as GPT-2 and Hugging Face merge.
    bool operator<(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::vector<int32_t> ids, prev, next;
  std::vector<Candidate> heap;
  std::vector<std::string_view> pieces;
};
thread_local WordScratch scratch;

}  // namespace

void TokenizerState::encode_word(std::string_view word, std::vector<int32_t>* out) const {
  const auto n = static_cast<int32_t>(word.size());
  if (n == 1) {
    if (const int32_t id = byte_ids[static_cast<uint8_t>(word[0])]; id >= 0) out->push_back(id);
    return;
  }
  if (ignore_merges) {
    const auto it = ids_by_bytes.find(std::string(word));
    if (it != ids_by_bytes.end()) {
      out->push_back(it->second);
      return;
    }
  }
  auto& ids = scratch.ids;
  ids.clear();
  for (int32_t i = 0; i < n; ++i)
    if (const int32_t id = byte_ids[static_cast<uint8_t>(word[i])]; id >= 0) ids.push_back(id);
  merge_symbols(ids, out);
}

void TokenizerState::merge_symbols(std::vector<int32_t>& ids, std::vector<int32_t>* out) const {
  // Symbols form a doubly linked list; a merge keeps the left symbol and unlinks the right one.
  // Heap entries are checked lazily against the current ids: a symbol's id only ever grows into
  // a longer token, so a stale entry never matches again.
  const auto n = static_cast<int32_t>(ids.size());
  if (n == 0) return;
  auto& prev = scratch.prev;
  auto& next = scratch.next;
  auto& heap = scratch.heap;
  prev.resize(n);
  next.resize(n);
  heap.clear();
  for (int32_t i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  auto push = [&](int32_t i, int32_t j) {
    const MergeTable::Merge m = merge_table.find(ids[i], ids[j]);
    if (m.rank < 0) return;
    heap.push_back({m.rank, i, ids[i], ids[j]});
    std::push_heap(heap.begin(), heap.end());
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i, i + 1);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const WordScratch::Candidate c = heap.back();
    heap.pop_back();
    const int32_t i = c.pos, j = next[i];
    if (ids[i] != c.left || j < 0 || ids[j] != c.right) continue;
    ids[i] = merge_table.find(c.left, c.right).result;
    ids[j] = -1;
    next[i] = next[j];
    if (next[j] >= 0) prev[next[j]] = i;
    if (prev[i] >= 0) push(prev[i], i);
    if (next[i] >= 0) push(i, next[i]);
  }
  for (int32_t i = 0; i >= 0; i = next[i]) out->push_back(ids[i]);
}

void TokenizerState::encode_ordinary_into(std::string_view text, std::vector<int32_t>* out) const {
  // Pre-tokenize in bounded chunks so the piece list stays small on huge inputs. A chunk ends
  // only after an ASCII non-space, '\n', ASCII non-space: the pattern splits there alone (the
  // lone newline is its own piece whether or not text follows it), so chunking changes nothing.
  auto& pieces = scratch.pieces;
  constexpr size_t kChunk = size_t{1} << 16;
  auto ascii_solid = [&](size_t i) {
    const auto b = static_cast<uint8_t>(text[i]);
    return b < 0x80 && unicode::classify_code_point(b) != unicode::CharClass::kSpace;
  };
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.size();
    if (text.size() - begin > kChunk) {
      size_t k = begin + kChunk;
      while (k + 1 < text.size() && !(text[k] == '\n' && ascii_solid(k - 1) && ascii_solid(k + 1)))
        ++k;
      if (k + 1 < text.size()) end = k + 1;
    }
    pieces.clear();
    pretokenize(pre, text.substr(begin, end - begin), &pieces);
    for (const std::string_view w : pieces) encode_word(w, out);
    begin = end;
  }
}

void TokenizerState::encode_segment(std::string_view text, bool at_start,
                                    std::vector<int32_t>* out) const {
  if (model == TokenizerModel::sentencepiece_bpe)
    encode_spm_segment(text, at_start, out);
  else if (model == TokenizerModel::wordpiece)
    encode_wordpiece_segment(text, out);
  else
    encode_ordinary_into(text, out);
}

std::string TokenizerState::vocab_string(int32_t id) const {
  const bool plain = model != TokenizerModel::byte_level_bpe || is_added[id] || is_verbatim[id];
  return plain ? tokens[id] : bytes_to_vocab_string(tokens[id]);
}

std::string TokenizerState::piece_text(int32_t id) const {
  if (model == TokenizerModel::byte_level_bpe || is_added[id]) return tokens[id];
  if (byte_of[id] >= 0) return std::string(1, static_cast<char>(byte_of[id]));
  std::string s;
  const std::string& t = tokens[id];
  for (size_t i = 0; i < t.size();) {
    if (t.compare(i, kMetaSpace.size(), kMetaSpace) == 0) {
      s.push_back(' ');
      i += kMetaSpace.size();
    } else {
      s.push_back(t[i++]);
    }
  }
  return s;
}

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<int32_t> Tokenizer::encode_ordinary(std::string_view text) const {
  TS_CHECK(vocab_size() > 0,
           "[tokenizer] encode_ordinary: the tokenizer is empty (not trained or loaded)");
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  if (impl_->any_plain_added)
    impl_->encode_with_added(text, false, &out);
  else
    impl_->encode_normalized(text, true, &out);
  return out;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  TS_CHECK(vocab_size() > 0, "[tokenizer] encode: the tokenizer is empty (not trained or loaded)");
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  impl_->encode_with_added(text, true, &out);
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string s;
  for (const int32_t id : ids) {
    TS_CHECK(id >= 0 && id < vocab_size(), "[tokenizer] decode: token id ", id,
             " out of range [0, ", vocab_size(), ")");
    if (skip_special && impl_->is_added[id] == 2) continue;
    s += impl_->piece_text(id);
  }
  // SentencePiece decoders strip the one space that encoding put in front of the text; WordPiece
  // pieces that start a word read as a space and the word, so the first one's space goes too.
  const bool spm_prefix =
      impl_->model == TokenizerModel::sentencepiece_bpe && impl_->space_prefix != SpacePrefix::none;
  if ((spm_prefix || impl_->model == TokenizerModel::wordpiece) && !s.empty() && s[0] == ' ')
    s.erase(0, 1);
  return s;
}

std::string Tokenizer::decode_token(int32_t id) const {
  TS_CHECK(id >= 0 && id < vocab_size(), "[tokenizer] decode_token: token id ", id,
           " out of range [0, ", vocab_size(), ")");
  return impl_->piece_text(id);
}

TokenizerModel Tokenizer::model() const {
  return impl_->model;
}

PreTokenizer Tokenizer::pre_tokenizer() const {
  return impl_->pre;
}

int32_t Tokenizer::vocab_size() const {
  return static_cast<int32_t>(impl_->tokens.size());
}

int32_t Tokenizer::token_id(std::string_view token_bytes) const {
  const auto it = impl_->ids_by_bytes.find(std::string(token_bytes));
  if (it != impl_->ids_by_bytes.end()) return it->second;
  for (const AddedToken& a : impl_->added)
    if (a.content == token_bytes) return a.id;
  return -1;
}

int32_t Tokenizer::eot_token() const {
  return impl_->eot;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->is_added[id] == 2;
}

const SpecialTokens& Tokenizer::special_tokens() const {
  return impl_->special;
}

void Tokenizer::set_special_tokens(const SpecialTokens& s) {
  const SpecialTokens old = impl_->special;
  impl_->special = s;
  try {
    impl_->finalize_special("set_special_tokens");
  } catch (...) {
    impl_->special = old;
    impl_->finalize_special("set_special_tokens");
    throw;
  }
}

const std::vector<int32_t>& Tokenizer::end_of_generation_tokens() const {
  return impl_->end_of_generation;
}

bool Tokenizer::is_end_of_generation(int32_t id) const {
  const auto& e = impl_->end_of_generation;
  return std::binary_search(e.begin(), e.end(), id);
}

}  // namespace tessera::tokenizer
