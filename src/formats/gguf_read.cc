// GGUF reader: parses header, metadata and tensor infos with every read bounds-checked, every
// count checked against the bytes left before allocating, and every tensor range validated.
#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/large_alloc.h"
#include "formats/gguf.h"

namespace tessera::formats {

static_assert(std::endian::native == std::endian::little, "GGUF reader assumes little-endian");

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr int kMaxArrayDepth = 4;        // arrays nested deeper than this are rejected
constexpr uint32_t kMaxDims = 4;
// Smallest encodings, used to bound counts by the bytes left before reserving memory.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;                  // empty key, type, 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;  // empty name, 1 dim, type, offset

uint64_t min_value_bytes(GgufType t) {
  switch (t) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::boolean:
      return 1;
    case GgufType::u16:
    case GgufType::i16:
      return 2;
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::f32:
      return 4;
    case GgufType::u64:
    case GgufType::i64:
    case GgufType::f64:
    case GgufType::string:  // u64 length
      return 8;
    case GgufType::array:  // u32 type + u64 count
      return 12;
  }
  return 1;
}

// Sequential reader over the file bytes; every read checks the bytes left and names the field
// and the current key or tensor on failure.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& path, size_t max_metadata_bytes)
      : data_(data), size_(size), path_(path), budget_(max_metadata_bytes) {}

  [[noreturn]] void error(const std::string& what) const {
    fail("[gguf] ", path_, ": ", what, context_.empty() ? "" : " (", context_,
         context_.empty() ? "" : ")");
  }
  void set_context(std::string c) { context_ = std::move(c); }
  size_t pos() const { return pos_; }
  size_t left() const { return size_ - pos_; }

  void need(uint64_t n, const char* field) const {
    if (n > left())
      error(cat("unexpected end of file reading ", field, " at offset ", pos_, " (need ", n,
                " bytes, ", left(), " left)"));
  }
  template <typename T>
  T read(const char* field) {
    need(sizeof(T), field);
    T x;
    std::memcpy(&x, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return x;
  }
  // Counts memory the parsed metadata will take, before it is allocated.
  void charge(uint64_t bytes) {
    if (bytes > budget_)
      error(cat("metadata needs more than max_metadata_bytes (", used_ + budget_,
                ") of memory at offset ", pos_));
    budget_ -= bytes;
    used_ += bytes;
  }
  std::string read_string(const char* field) {
    const uint64_t n = read<uint64_t>(field);
    if (n > left())
      error(cat(field, " length ", n, " exceeds the ", left(), " bytes left at offset ", pos_));
    charge(n);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& path_;
  uint64_t budget_;    // bytes of metadata memory still allowed
  uint64_t used_ = 0;  // bytes charged so far
  std::string context_;
};

GgufType read_value_type(Cursor& c, const char* field) {
  const uint32_t t = c.read<uint32_t>(field);
  if (t > static_cast<uint32_t>(GgufType::f64)) c.error(cat("unknown value type ", t));
  return static_cast<GgufType>(t);
}

GgufValue read_value(Cursor& c, GgufType t, int depth) {
  switch (t) {
    case GgufType::u8:
      return c.read<uint8_t>("u8 value");
    case GgufType::i8:
      return c.read<int8_t>("i8 value");
    case GgufType::u16:
      return c.read<uint16_t>("u16 value");
    case GgufType::i16:
      return c.read<int16_t>("i16 value");
    case GgufType::u32:
      return c.read<uint32_t>("u32 value");
    case GgufType::i32:
      return c.read<int32_t>("i32 value");
    case GgufType::f32:
      return c.read<float>("f32 value");
    case GgufType::u64:
      return c.read<uint64_t>("u64 value");
    case GgufType::i64:
      return c.read<int64_t>("i64 value");
    case GgufType::f64:
      return c.read<double>("f64 value");
    case GgufType::boolean: {
      const uint8_t b = c.read<uint8_t>("bool value");
      if (b > 1) c.error(cat("bool value ", static_cast<int>(b), " is neither 0 nor 1"));
      return b == 1;
    }
    case GgufType::string:
      return c.read_string("string value");
    case GgufType::array: {
      if (depth >= kMaxArrayDepth)
        c.error(cat("arrays nested deeper than ", kMaxArrayDepth, " levels"));
      GgufArray a;
      a.elem_type = read_value_type(c, "array element type");
      const uint64_t n = c.read<uint64_t>("array count");
      // Bound the count by the bytes left before reserving: a count of 2^60 fails here.
      if (n > c.left() / min_value_bytes(a.elem_type))
        c.error(cat("array count ", n, " of ", gguf_type_name(a.elem_type), " exceeds the ",
                    c.left(), " bytes left at offset ", c.pos()));
      c.charge(n * sizeof(GgufValue));  // n < file size, so this cannot overflow
      a.items.reserve(static_cast<size_t>(n));
      for (uint64_t i = 0; i < n; ++i) a.items.push_back(read_value(c, a.elem_type, depth + 1));
      return GgufValue(std::move(a));
    }
  }
  c.error(cat("unknown value type ", static_cast<uint32_t>(t)));
}

uint64_t align_up(uint64_t x, uint64_t a) {
  return (x + a - 1) / a * a;
}

}  // namespace

// Reads the whole file into one page-aligned buffer (so tensor alignment in the file is pointer
// alignment, as with mmap), on huge pages where the kernel offers them (alloc_large: decode
// streams these bytes every token). Returns the size.
static size_t read_aligned(const std::string& path, std::shared_ptr<uint8_t>* out) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  TS_CHECK(f, "[gguf] ", path, ": cannot open: ", std::strerror(errno));
  TS_CHECK(std::fseek(f.get(), 0, SEEK_END) == 0, "[gguf] ", path, ": cannot seek");
  const long size = std::ftell(f.get());
  TS_CHECK(size >= 0 && std::fseek(f.get(), 0, SEEK_SET) == 0, "[gguf] ", path,
           ": cannot get the file size");
  if (size == 0) return 0;
  const auto n = static_cast<size_t>(size);
  out->reset(static_cast<uint8_t*>(alloc_large(n, 4096, path.c_str())),
             [](uint8_t* p) { free_large(p); });
  TS_CHECK(std::fread(out->get(), 1, n, f.get()) == n, "[gguf] ", path, ": short read of ", n,
           " bytes");
  return n;
}

GgufFile::GgufFile(const std::string& path, const GgufOptions& options) : path_(path) {
  if (options.mmap) {
    file_ = MappedFile(path);
    parse(file_.data(), file_.size(), options);
  } else {
    const size_t n = read_aligned(path, &buffer_);
    parse(buffer_.get(), n, options);
  }
}

GgufFile GgufFile::from_memory(std::vector<uint8_t> bytes, const std::string& name,
                               const GgufOptions& options) {
  GgufFile f;
  f.path_ = name;
  f.memory_ = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  f.parse(f.memory_->data(), f.memory_->size(), options);
  return f;
}

void GgufFile::parse(const uint8_t* data, size_t size, const GgufOptions& options) {
  Cursor c(data, size, path_, options.max_metadata_bytes);
  const uint32_t magic = c.read<uint32_t>("magic");
  if (magic != kMagic) c.error(cat("bad magic 0x", std::hex, magic, " (not a GGUF file)"));
  version_ = c.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3)
    c.error(cat("unsupported version ", version_, " (expected 2 or 3, little-endian)"));
  const uint64_t n_tensors = c.read<uint64_t>("tensor_count");
  const uint64_t n_kv = c.read<uint64_t>("metadata_kv_count");
  if (n_kv > c.left() / kMinKvBytes)
    c.error(cat("metadata_kv_count ", n_kv, " exceeds what the ", c.left(), " bytes left hold"));

  kv_.reserve(static_cast<size_t>(n_kv));
  for (uint64_t i = 0; i < n_kv; ++i) {
    c.set_context(cat("metadata entry ", i));
    std::string key = c.read_string("key");
    c.charge(sizeof(kv_[0]));
    c.set_context(cat("key '", key, "'"));
    if (key.empty()) c.error("empty key");
    if (kv_index_.count(key)) c.error("duplicate key");
    const GgufType t = read_value_type(c, "value type");
    GgufValue v = read_value(c, t, 0);
    if (key == "general.alignment") {
      const uint32_t* a = v.get_if<uint32_t>();
      if (!a) c.error(cat("general.alignment must be u32, not ", gguf_type_name(t)));
      if (*a == 0 || (*a & (*a - 1)) != 0)
        c.error(cat("general.alignment ", *a, " is not a non-zero power of two"));
      alignment_ = *a;
    }
    kv_index_.emplace(key, kv_.size());
    kv_.emplace_back(std::move(key), std::move(v));
  }

  c.set_context("");
  if (n_tensors > c.left() / kMinTensorInfoBytes)
    c.error(cat("tensor_count ", n_tensors, " exceeds what the ", c.left(), " bytes left hold"));
  tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    c.set_context(cat("tensor ", i));
    GgufTensorInfo t;
    t.name = c.read_string("tensor name");
    c.set_context(cat("tensor '", t.name, "'"));
    if (t.name.empty()) c.error("empty tensor name");
    if (tensor_index_.count(t.name)) c.error("duplicate tensor name");
    const uint32_t n_dims = c.read<uint32_t>("n_dims");
    if (n_dims < 1 || n_dims > kMaxDims) c.error(cat("n_dims ", n_dims, " not in [1, 4]"));
    t.n_elements = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = c.read<uint64_t>("dim");
      if (ne == 0) c.error(cat("dim ", d, " is zero"));
      if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          __builtin_mul_overflow(t.n_elements, static_cast<int64_t>(ne), &t.n_elements))
        c.error(cat("element count overflows at dim ", d, " (", ne, ")"));
      t.dims.push_back(static_cast<int64_t>(ne));
    }
    const uint32_t type_id = c.read<uint32_t>("ggml type");
    const GgmlTypeInfo* info = ggml_type_info(type_id);
    if (!info) c.error(cat("unsupported ggml type ", type_id));
    t.ggml_type = info->id;
    t.type_name = info->name;
    t.dtype = info->dtype;
    // ggml quantizes row by row, so the row length (ne0) must be whole blocks.
    if (t.dims[0] % info->block_elems != 0)
      c.error(cat("row length ", t.dims[0], " is not a multiple of the ", info->name,
                  " block size ", info->block_elems));
    // Up to 4 bytes per element: the byte size can overflow even when the count does not.
    if (__builtin_mul_overflow(t.n_elements / info->block_elems, info->block_bytes, &t.bytes))
      c.error("byte size overflows");
    t.offset = c.read<uint64_t>("offset");
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // Tensor data starts at the next multiple of the alignment after the tensor infos.
  c.set_context("");
  data_offset_ = align_up(c.pos(), alignment_);
  if (!tensors_.empty() && data_offset_ > size)
    c.error(cat("data section offset ", data_offset_, " past end of file (size ", size, ")"));
  const uint64_t data_bytes = tensors_.empty() ? 0 : size - data_offset_;
  for (GgufTensorInfo& t : tensors_) {
    c.set_context(cat("tensor '", t.name, "'"));
    if (t.offset % alignment_ != 0)
      c.error(cat("offset ", t.offset, " is not a multiple of the alignment ", alignment_));
    if (t.offset > data_bytes || static_cast<uint64_t>(t.bytes) > data_bytes - t.offset)
      c.error(cat("data [", t.offset, ", +", t.bytes, ") past end of the data section (",
                  data_bytes, " bytes)"));
    t.data = data + data_offset_ + t.offset;
  }

  // Ranges must not overlap: sort by offset and compare neighbours.
  std::vector<const GgufTensorInfo*> order;
  order.reserve(tensors_.size());
  for (const auto& t : tensors_) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < order.size(); ++i) {
    const GgufTensorInfo& p = *order[i - 1];
    if (p.offset + static_cast<uint64_t>(p.bytes) > order[i]->offset) {
      c.set_context(cat("tensor '", order[i]->name, "'"));
      c.error(cat("data at offset ", order[i]->offset, " overlaps tensor '", p.name, "' [",
                  p.offset, ", +", p.bytes, ")"));
    }
  }
}

const GgufValue* GgufFile::find_value(const std::string& key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

void GgufFile::fail_key(const std::string& key, const std::string& what) const {
  fail("[gguf] ", path_, ": ", what, " (key '", key, "')");
}

const GgufValue& GgufFile::get(const std::string& key) const {
  const GgufValue* v = find_value(key);
  if (!v) fail_key(key, "missing metadata");
  return *v;
}

namespace {
template <typename T>
const T& get_typed(const GgufFile& f, const std::string& key, GgufType want) {
  const GgufValue& v = f.get(key);
  const T* x = v.get_if<T>();
  if (!x)
    fail("[gguf] ", f.path(), ": expected ", gguf_type_name(want), ", found ",
         gguf_type_name(v.type()), " (key '", key, "')");
  return *x;
}
}  // namespace

uint32_t GgufFile::get_u32(const std::string& key) const {
  return get_typed<uint32_t>(*this, key, GgufType::u32);
}
uint64_t GgufFile::get_u64(const std::string& key) const {
  return get_typed<uint64_t>(*this, key, GgufType::u64);
}
int32_t GgufFile::get_i32(const std::string& key) const {
  return get_typed<int32_t>(*this, key, GgufType::i32);
}
float GgufFile::get_f32(const std::string& key) const {
  return get_typed<float>(*this, key, GgufType::f32);
}
bool GgufFile::get_bool(const std::string& key) const {
  return get_typed<bool>(*this, key, GgufType::boolean);
}
const std::string& GgufFile::get_string(const std::string& key) const {
  return get_typed<std::string>(*this, key, GgufType::string);
}
const GgufArray& GgufFile::get_array(const std::string& key) const {
  return get_typed<GgufArray>(*this, key, GgufType::array);
}

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue& v = get(key);
  return std::visit(
      [&](const auto& x) -> int64_t {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          if constexpr (std::is_same_v<T, uint64_t>) {
            if (x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
              fail_key(key, cat("u64 value ", x, " does not fit in i64"));
          }
          return static_cast<int64_t>(x);
        } else {
          fail_key(key, cat("expected an integer, found ", gguf_type_name(v.type())));
        }
      },
      v.v);
}

std::vector<std::string> GgufFile::get_string_array(const std::string& key) const {
  const GgufArray& a = get_array(key);
  if (a.elem_type != GgufType::string)
    fail_key(key, cat("expected an array of string, found array of ", gguf_type_name(a.elem_type)));
  std::vector<std::string> out;
  out.reserve(a.items.size());
  for (const auto& x : a.items) out.push_back(*x.get_if<std::string>());
  return out;
}

const GgufTensorInfo* GgufFile::find(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensorInfo& GgufFile::at(const std::string& name) const {
  const GgufTensorInfo* t = find(name);
  if (!t) fail("[gguf] ", path_, ": no such tensor (tensor '", name, "')");
  return *t;
}

}  // namespace tessera::formats
