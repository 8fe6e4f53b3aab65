// GGUF writer: validates what it is given (so it never writes a file its reader rejects), then
// writes a v3 header, metadata, tensor infos and aligned tensor data atomically.
#include <bit>
#include <cstring>

#include "core/error.h"
#include "formats/gguf.h"

namespace tessera::formats {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" as a little-endian u32
constexpr uint32_t kVersion = 3;
constexpr uint64_t kDefaultAlignment = 32;
constexpr int kMaxArrayDepth = 4;  // the reader's limit

void check_value(const std::string& key, const GgufValue& v, int depth) {
  const GgufArray* a = v.get_if<GgufArray>();
  if (!a) return;
  TS_CHECK(depth < kMaxArrayDepth, "[gguf] writer: arrays nested deeper than ", kMaxArrayDepth,
           " levels (key '", key, "')");
  for (const GgufValue& x : a->items) {
    TS_CHECK(x.type() == a->elem_type, "[gguf] writer: array of ", gguf_type_name(a->elem_type),
             " holds a ", gguf_type_name(x.type()), " (key '", key, "')");
    check_value(key, x, depth + 1);
  }
}

// Appends little-endian encodings to a byte buffer.
class Out {
 public:
  template <typename T>
  void put(T x) {
    const size_t n = buf_.size();
    buf_.resize(n + sizeof(T));
    std::memcpy(buf_.data() + n, &x, sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    buf_.insert(buf_.end(), s.begin(), s.end());
  }
  void put_value(const GgufValue& v) {
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, std::string>) {
            put_string(x);
          } else if constexpr (std::is_same_v<T, GgufArray>) {
            put<uint32_t>(static_cast<uint32_t>(x.elem_type));
            put<uint64_t>(x.items.size());
            for (const GgufValue& item : x.items) put_value(item);
          } else if constexpr (std::is_same_v<T, bool>) {
            put<uint8_t>(x ? 1 : 0);
          } else {
            put<T>(x);
          }
        },
        v.v);
  }
  void pad_to(uint64_t alignment) {
    buf_.resize((buf_.size() + alignment - 1) / alignment * alignment, 0);
  }
  std::vector<uint8_t>& bytes() { return buf_; }

 private:
  std::vector<uint8_t> buf_;
};

uint64_t align_up(uint64_t x, uint64_t a) {
  return (x + a - 1) / a * a;
}

}  // namespace

void GgufWriter::set(const std::string& key, GgufValue value) {
  TS_CHECK(!key.empty(), "[gguf] writer: empty metadata key");
  check_value(key, value, 0);
  if (key == "general.alignment") {
    const uint32_t* a = value.get_if<uint32_t>();
    TS_CHECK(a, "[gguf] writer: general.alignment must be u32 (key 'general.alignment')");
    TS_CHECK(*a != 0 && (*a & (*a - 1)) == 0, "[gguf] writer: alignment ", *a,
             " is not a non-zero power of two (key 'general.alignment')");
  }
  for (auto& kv : kv_) {
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  }
  kv_.emplace_back(key, std::move(value));
}

void GgufWriter::set_alignment(uint32_t alignment) {
  set("general.alignment", alignment);
}

uint64_t GgufWriter::alignment() const {
  for (const auto& kv : kv_)
    if (kv.first == "general.alignment") return *kv.second.get_if<uint32_t>();
  return kDefaultAlignment;
}

void GgufWriter::add_tensor(const std::string& name, GgmlType type, const Shape& shape,
                            const void* data) {
  const GgmlTypeInfo* info = ggml_type_info(static_cast<uint32_t>(type));
  TS_CHECK(info, "[gguf] writer: unsupported ggml type ", static_cast<uint32_t>(type), " (tensor '",
           name, "')");
  TS_CHECK(!name.empty(), "[gguf] writer: empty tensor name");
  TS_CHECK(!names_.count(name), "[gguf] writer: duplicate tensor (tensor '", name, "')");
  TS_CHECK(shape.rank() >= 1 && shape.rank() <= 4, "[gguf] writer: rank ", shape.rank(),
           " not in [1, 4] (tensor '", name, "')");
  int64_t n = 1;
  for (int64_t d : shape.dims) {
    TS_CHECK(d > 0 && !__builtin_mul_overflow(n, d, &n), "[gguf] writer: bad shape ", shape.str(),
             " (tensor '", name, "')");
  }
  TS_CHECK(shape.dims.back() % info->block_elems == 0, "[gguf] writer: row length ",
           shape.dims.back(), " is not a multiple of the ", info->name, " block size ",
           info->block_elems, " (tensor '", name, "')");
  TS_CHECK(data, "[gguf] writer: null data (tensor '", name, "')");
  int64_t bytes = 0;
  TS_CHECK(!__builtin_mul_overflow(n / info->block_elems, info->block_bytes, &bytes),
           "[gguf] writer: byte size overflows (tensor '", name, "')");
  items_.push_back(
      {name, type, std::vector<int64_t>(shape.dims.rbegin(), shape.dims.rend()), bytes, data});
  names_.insert(name);
}

void GgufWriter::add_tensor(const std::string& name, DType dtype, const Shape& shape,
                            const void* data) {
  add_tensor(name, ggml_type_of(dtype), shape, data);
}

std::vector<uint8_t> GgufWriter::header(std::vector<uint64_t>* offsets) const {
  const uint64_t align = alignment();
  Out o;
  o.put<uint32_t>(kMagic);
  o.put<uint32_t>(kVersion);
  o.put<uint64_t>(items_.size());
  o.put<uint64_t>(kv_.size());
  for (const auto& [key, value] : kv_) {
    o.put_string(key);
    o.put<uint32_t>(static_cast<uint32_t>(value.type()));
    o.put_value(value);
  }
  offsets->clear();
  uint64_t off = 0;
  for (const Item& it : items_) {
    o.put_string(it.name);
    o.put<uint32_t>(static_cast<uint32_t>(it.dims.size()));
    for (int64_t d : it.dims) o.put<uint64_t>(static_cast<uint64_t>(d));
    o.put<uint32_t>(static_cast<uint32_t>(it.type));
    o.put<uint64_t>(off);
    offsets->push_back(off);
    off = align_up(off + static_cast<uint64_t>(it.bytes), align);
  }
  if (!items_.empty()) o.pad_to(align);
  return std::move(o.bytes());
}

std::vector<uint8_t> GgufWriter::serialize() const {
  std::vector<uint64_t> offsets;
  std::vector<uint8_t> out = header(&offsets);
  const size_t data_start = out.size();
  // The last tensor is not padded: the file ends with its last byte.
  out.resize(data_start + (items_.empty() ? 0 : offsets.back() + items_.back().bytes), 0);
  for (size_t i = 0; i < items_.size(); ++i)
    std::memcpy(out.data() + data_start + offsets[i], items_[i].data,
                static_cast<size_t>(items_[i].bytes));
  return out;
}

void GgufWriter::write(const std::string& path) const {
  std::vector<uint64_t> offsets;
  const std::vector<uint8_t> head = header(&offsets);
  // Streams tensor data straight from the caller's buffers: no second copy of the weights.
  AtomicFileWriter w(path);
  w.write(head.data(), head.size());
  const std::vector<uint8_t> zeros(static_cast<size_t>(alignment()), 0);
  uint64_t pos = 0;  // relative to the data section
  for (size_t i = 0; i < items_.size(); ++i) {
    w.write(zeros.data(), static_cast<size_t>(offsets[i] - pos));
    w.write(items_[i].data, static_cast<size_t>(items_[i].bytes));
    pos = offsets[i] + static_cast<uint64_t>(items_[i].bytes);
  }
  w.commit();
}

}  // namespace tessera::formats
