// safetensors reader (every header field validated against the mapped file) and atomic writer.
#include "formats/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tessera::formats {

namespace {

using nlohmann::json;

// A header larger than this is not a tensor index but an attack or a corrupt file.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DTypeName {
  const char* st;  // safetensors spelling
  DType dtype;
};
constexpr DTypeName kDTypes[] = {
    {"F32", DType::f32}, {"BF16", DType::bf16}, {"F16", DType::f16}, {"I32", DType::i32}};

bool parse_st_dtype(const std::string& s, DType* out) {
  for (const auto& d : kDTypes)
    if (s == d.st) {
      *out = d.dtype;
      return true;
    }
  return false;
}

const char* st_dtype_name(DType t) {
  for (const auto& d : kDTypes)
    if (d.dtype == t) return d.st;
  return nullptr;
}

// Reads a JSON value that must be a non-negative integer no larger than `limit`.
bool get_uint(const json& v, uint64_t limit, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
  } else if (v.is_number_integer()) {
    const int64_t s = v.get<int64_t>();
    if (s < 0) return false;
    *out = static_cast<uint64_t>(s);
  } else {
    return false;
  }
  return *out <= limit;
}

}  // namespace

SafetensorsReader::SafetensorsReader(const std::string& path) : file_(path) {
  const uint8_t* base = file_.data();
  const uint64_t size = file_.size();
  TS_CHECK(size >= 8, "[safetensors] ", path, ": file too short (", size,
           " bytes) for the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | base[i];  // little-endian regardless of host
  TS_CHECK(n <= kMaxHeaderBytes, "[safetensors] ", path, ": header length ", n,
           " exceeds the limit of ", kMaxHeaderBytes, " bytes");
  TS_CHECK(n <= size - 8, "[safetensors] ", path, ": header length ", n,
           " runs past the end of the file (size ", size, ")");
  const uint64_t data_size = size - 8 - n;
  const uint8_t* data = base + 8 + n;

  json header;
  try {
    header = json::parse(reinterpret_cast<const char*>(base + 8),
                         reinterpret_cast<const char*>(base + 8 + n));
  } catch (const json::exception& e) {
    fail("[safetensors] ", path, ": header is not valid JSON: ", e.what());
  }
  TS_CHECK(header.is_object(), "[safetensors] ", path, ": header must be a JSON object");

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      TS_CHECK(v.is_object(), "[safetensors] ", path, ": __metadata__ must be an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        TS_CHECK(m.value().is_string(), "[safetensors] ", path, ": __metadata__ '", m.key(),
                 "' must be a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = cat("[safetensors] ", path, ": tensor '", name, "': ");
    TS_CHECK(v.is_object(), where, "entry must be an object");
    TS_CHECK(v.contains("dtype") && v["dtype"].is_string(), where, "missing string field 'dtype'");
    SafetensorsEntry e;
    e.name = name;
    const std::string dt = v["dtype"].get<std::string>();
    TS_CHECK(parse_st_dtype(dt, &e.dtype), where, "unsupported dtype '", dt,
             "' (supported: F32, BF16, F16, I32)");

    TS_CHECK(v.contains("shape") && v["shape"].is_array(), where, "missing array field 'shape'");
    for (const json& d : v["shape"]) {
      uint64_t dim = 0;
      TS_CHECK(get_uint(d, uint64_t{1} << 62, &dim), where, "shape ", v["shape"].dump(),
               " has a dimension that is not an integer in [0, 2^62]");
      e.shape.dims.push_back(static_cast<int64_t>(dim));
    }
    // Overflow-safe element count: every partial product stays at most the data section size,
    // so it can never wrap. A zero dim makes the tensor empty whatever the other dims are.
    uint64_t numel = 1;
    if (std::find(e.shape.dims.begin(), e.shape.dims.end(), 0) != e.shape.dims.end()) {
      numel = 0;
    } else {
      for (int64_t d : e.shape.dims) {
        const uint64_t dim = static_cast<uint64_t>(d);
        TS_CHECK(numel <= data_size / dim, where, "shape ", e.shape.str(),
                 " is larger than the data section (", data_size, " bytes)");
        numel *= dim;
      }
    }
    const uint64_t item = static_cast<uint64_t>(traits(e.dtype).block_bytes);
    TS_CHECK(numel <= data_size / item, where, "shape ", e.shape.str(),
             " is larger than the data section (", data_size, " bytes)");
    const uint64_t nbytes = numel * item;

    TS_CHECK(
        v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2,
        where, "'data_offsets' must be an array [begin, end]");
    uint64_t begin = 0, end = 0;
    TS_CHECK(get_uint(v["data_offsets"][0], data_size, &begin) &&
                 get_uint(v["data_offsets"][1], data_size, &end),
             where, "data_offsets ", v["data_offsets"].dump(),
             " are not integers inside the data section (size ", data_size, ")");
    TS_CHECK(begin <= end, where, "data_offsets ", v["data_offsets"].dump(), " are reversed");
    TS_CHECK(end - begin == nbytes, where, "data_offsets span ", end - begin, " bytes but shape ",
             e.shape.str(), " of ", dt, " needs ", nbytes);
    e.data = data + begin;
    e.bytes = static_cast<int64_t>(nbytes);
    entries_.push_back(std::move(e));
  }

  // Overlap check: sort by start; each non-empty tensor must begin at or after the previous end.
  std::vector<const SafetensorsEntry*> order;
  for (const auto& e : entries_)
    if (e.bytes > 0) order.push_back(&e);
  std::sort(order.begin(), order.end(),
            [](const SafetensorsEntry* a, const SafetensorsEntry* b) { return a->data < b->data; });
  for (size_t i = 1; i < order.size(); ++i) {
    TS_CHECK(order[i]->data >= order[i - 1]->data + order[i - 1]->bytes, "[safetensors] ", path,
             ": tensor '", order[i]->name, "': data overlaps tensor '", order[i - 1]->name, "'");
  }
}

const SafetensorsEntry* SafetensorsReader::find(const std::string& name) const {
  for (const auto& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

const SafetensorsEntry& SafetensorsReader::at(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  TS_CHECK(e != nullptr, "[safetensors] ", path(), ": tensor '", name, "': not found");
  return *e;
}

void SafetensorsReader::read_f32(const std::string& name, const Shape& expected, float* dst) const {
  const SafetensorsEntry& e = at(name);
  TS_CHECK(e.shape == expected, "[safetensors] ", path(), ": tensor '", name, "': shape ",
           e.shape.str(), " does not match the expected ", expected.str());
  const int64_t n = e.shape.numel();
  // The mapped data may sit at any byte offset, so elements are copied out with memcpy.
  switch (e.dtype) {
    case DType::f32:
      if (n > 0) std::memcpy(dst, e.data, static_cast<size_t>(n) * 4);
      return;
    case DType::bf16:
    case DType::f16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, e.data + 2 * i, 2);
        dst[i] = e.dtype == DType::bf16 ? bf16_to_f32(h) : f16_to_f32(h);
      }
      return;
    default:
      fail("[safetensors] ", path(), ": tensor '", name, "': dtype ", dtype_name(e.dtype),
           " cannot be read as f32");
  }
}

void SafetensorsWriter::add(const std::string& name, DType dtype, const Shape& shape,
                            const void* data) {
  TS_CHECK(!name.empty() && name != "__metadata__", "[safetensors] invalid tensor name '", name,
           "'");
  TS_CHECK(st_dtype_name(dtype) != nullptr, "[safetensors] tensor '", name, "': dtype ",
           dtype_name(dtype), " has no safetensors encoding");
  for (int64_t d : shape.dims)
    TS_CHECK(d >= 0, "[safetensors] tensor '", name, "': negative dimension in ", shape.str());
  for (const auto& it : items_)
    TS_CHECK(it.name != name, "[safetensors] tensor '", name, "': added twice");
  items_.push_back({name, dtype, shape, data});
}

void SafetensorsWriter::write(const std::string& path) const {
  // Tensors are laid out in name order, contiguously (the safetensors library rejects gaps).
  std::vector<const Item*> order;
  for (const auto& it : items_) order.push_back(&it);
  std::sort(order.begin(), order.end(),
            [](const Item* a, const Item* b) { return a->name < b->name; });
  json header = json::object();
  std::vector<uint64_t> sizes;
  uint64_t off = 0;
  for (const Item* it : order) {
    const uint64_t bytes = static_cast<uint64_t>(dtype_bytes(it->dtype, it->shape.numel()));
    header[it->name] = {{"dtype", st_dtype_name(it->dtype)},
                        {"shape", it->shape.dims},
                        {"data_offsets", {off, off + bytes}}};
    sizes.push_back(bytes);
    off += bytes;
  }
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  std::string text = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned (8 + header length).
  while (text.size() % 8 != 0) text.push_back(' ');
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));

  AtomicFileWriter w(path);
  w.write(len, 8);
  w.write(text.data(), text.size());
  for (size_t i = 0; i < order.size(); ++i)
    if (sizes[i] > 0) w.write(order[i]->data, sizes[i]);
  w.commit();
}

}  // namespace tessera::formats
