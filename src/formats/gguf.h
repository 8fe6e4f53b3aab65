// GGUF (v2/v3) files: a hostile-input-safe reader (every length, count, dim, offset and range
// checked before use) and an atomic writer; metadata values, the ggml type table, dequantization.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <variant>
#include <vector>

#include "core/dtype.h"
#include "core/file_io.h"
#include "core/tensor.h"

namespace tessera::formats {

// Metadata value type ids as stored in the file.
enum class GgufType : uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};
std::string_view gguf_type_name(GgufType t);  // "u32", "string", ...; "?" for ids out of range

struct GgufValue;

// Homogeneous array: every item has type `elem_type` (items may themselves be arrays).
struct GgufArray {
  GgufType elem_type = GgufType::u8;
  std::vector<GgufValue> items;
};

using GgufStorage = std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool,
                                 std::string, GgufArray, uint64_t, int64_t, double>;
template <typename T, typename V>
struct IsGgufAlternative;
template <typename T, typename... Ts>
struct IsGgufAlternative<T, std::variant<Ts...>>
    : std::bool_constant<(std::is_same_v<T, Ts> || ...)> {};
// T is exactly one of the stored types (no implicit int -> u32 guessing).
template <typename T>
concept GgufStorable = IsGgufAlternative<std::decay_t<T>, GgufStorage>::value;

// One metadata value. The variant's alternative index equals the GgufType id, so
// `static_cast<GgufType>(v.index())` is the value's type.
struct GgufValue {
  GgufStorage v;

  GgufValue() = default;
  template <GgufStorable T>
  GgufValue(T&& x) : v(std::in_place_type<std::decay_t<T>>, std::forward<T>(x)) {}  // NOLINT
  GgufValue(const char* s) : v(std::in_place_type<std::string>, s) {}               // NOLINT

  GgufType type() const { return static_cast<GgufType>(v.index()); }
  template <typename T>
  const T* get_if() const {
    return std::get_if<T>(&v);
  }
};
bool operator==(const GgufArray& a, const GgufArray& b);
bool operator==(const GgufValue& a, const GgufValue& b);

// Builds an array value from plain values (T one of the scalar types or std::string).
template <typename T>
GgufValue gguf_array(GgufType elem_type, const std::vector<T>& xs) {
  GgufArray a;
  a.elem_type = elem_type;
  a.items.reserve(xs.size());
  for (const T& x : xs) a.items.emplace_back(x);
  return GgufValue(std::move(a));
}

// ggml tensor type ids that this reader knows; any other id is rejected naming the number.
enum class GgmlType : uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  bf16 = 30,
};

struct GgmlTypeInfo {
  GgmlType id;
  std::string_view name;       // ggml's spelling: "F32", "Q4_K", ...
  int64_t block_elems;         // elements per block (1 for scalar types)
  int64_t block_bytes;         // bytes per block
  std::optional<DType> dtype;  // our DType with the identical layout
};
// Table row for a raw type id, or nullptr when the id is unknown.
const GgmlTypeInfo* ggml_type_info(uint32_t id);
// The ggml type whose layout equals `t`; throws for dtypes GGUF cannot store (i32).
GgmlType ggml_type_of(DType t);

// The k-quant block structs (BlockQ4K, BlockQ6K, kQK_K) live in core/dtype.h.

struct GgufTensorInfo {
  std::string name;
  GgmlType ggml_type = GgmlType::f32;
  std::string_view type_name;  // "F32", "Q4_K", ...
  std::optional<DType> dtype;  // our DType with the identical layout, if any
  std::vector<int64_t> dims;   // ggml order: dims[0] (ne0) varies fastest = row length
  int64_t n_elements = 0;
  int64_t bytes = 0;
  uint64_t offset = 0;            // from the start of the data section; multiple of alignment
  const uint8_t* data = nullptr;  // points into the file's bytes
  // PyTorch-order shape: dims reversed, so shape()[rank-1] == dims[0].
  Shape shape() const { return Shape(std::vector<int64_t>(dims.rbegin(), dims.rend())); }
};

// How a file is opened, and a cap on what its metadata may cost in memory.
struct GgufOptions {
  // true: map the file (pages fault in on first touch, the kernel may drop them again);
  // false: read it into one page-aligned buffer. See ARCHITECTURE.md section 2 on choosing.
  bool mmap = true;
  // Parsed metadata (values, strings, arrays) above this many bytes of memory is rejected: a
  // hostile 1 GiB array of u8 would otherwise cost ~48 GiB as GgufValues. The largest real
  // vocabularies (256k tokens with scores and types) need well under 100 MiB.
  size_t max_metadata_bytes = size_t{1} << 30;
};

class GgufFile {
 public:
  // Opens `path` and validates everything; throws Error "[gguf] <path>: <what> (tensor/key)".
  explicit GgufFile(const std::string& path, const GgufOptions& options = {});
  // Parses a copy held in memory; `name` stands for the path in error messages. Tensor data
  // pointers are then only as aligned as the vector's storage.
  static GgufFile from_memory(std::vector<uint8_t> bytes, const std::string& name,
                              const GgufOptions& options = {});

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_section_offset() const { return data_offset_; }  // absolute, in the file

  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  const GgufValue* find_value(const std::string& key) const;  // nullptr when absent
  bool has(const std::string& key) const { return find_value(key) != nullptr; }
  // Typed getters: throw naming file and key when absent or of another type.
  const GgufValue& get(const std::string& key) const;
  uint32_t get_u32(const std::string& key) const;
  uint64_t get_u64(const std::string& key) const;
  int32_t get_i32(const std::string& key) const;
  float get_f32(const std::string& key) const;
  bool get_bool(const std::string& key) const;
  const std::string& get_string(const std::string& key) const;
  const GgufArray& get_array(const std::string& key) const;
  // Any integer type, converted to int64 (throws if a u64 does not fit).
  int64_t get_int(const std::string& key) const;
  // Array of strings (e.g. tokenizer.ggml.tokens) copied out.
  std::vector<std::string> get_string_array(const std::string& key) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find(const std::string& name) const;  // nullptr when absent
  const GgufTensorInfo& at(const std::string& name) const;    // throws naming file and tensor

 private:
  GgufFile() = default;
  void parse(const uint8_t* data, size_t size, const GgufOptions& options);
  [[noreturn]] void fail_key(const std::string& key, const std::string& what) const;

  std::string path_;
  MappedFile file_;
  std::shared_ptr<std::vector<uint8_t>> memory_;  // from_memory: owns the bytes
  std::shared_ptr<uint8_t> buffer_;               // GgufOptions::mmap false: owns the bytes
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::unordered_map<std::string, size_t> kv_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

// Converts a tensor to f32 (dst holds n_elements): every type with a DType (f32, f16, bf16, q8_0,
// q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k).
void gguf_tensor_to_f32(const GgufTensorInfo& t, float* dst);
// Dequantizes n elements (a multiple of 256) of k-quant blocks.
void dequantize_q4_k(const BlockQ4K* src, float* dst, int64_t n);
void dequantize_q6_k(const BlockQ6K* src, float* dst, int64_t n);

class GgufWriter {
 public:
  // Sets (or replaces, keeping its position) a metadata value; validates array homogeneity.
  void set(const std::string& key, GgufValue value);
  // Sets general.alignment (u32); must be a non-zero power of two. Default is 32.
  void set_alignment(uint32_t alignment);
  // Data is referenced, not copied: it must stay alive until write(). `shape` is in PyTorch
  // order (last dim = row length); it is written reversed, as ggml's ne.
  void add_tensor(const std::string& name, GgmlType type, const Shape& shape, const void* data);
  void add_tensor(const std::string& name, DType dtype, const Shape& shape, const void* data);
  // Writes v3 atomically (temp file, fsync, rename), each tensor aligned to the alignment.
  void write(const std::string& path) const;
  // The bytes write() would produce.
  std::vector<uint8_t> serialize() const;

 private:
  struct Item {
    std::string name;
    GgmlType type;
    std::vector<int64_t> dims;  // ggml order
    int64_t bytes;
    const void* data;
  };
  uint64_t alignment() const;
  // Header, metadata and tensor infos padded to the alignment; sets each tensor's offset
  // relative to the end of the returned bytes.
  std::vector<uint8_t> header(std::vector<uint64_t>* offsets) const;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<Item> items_;
  std::unordered_set<std::string> names_;  // of items_, for the duplicate check
};

}  // namespace tessera::formats
