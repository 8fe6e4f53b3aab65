// libFuzzer target: GgufFile::from_memory on arbitrary bytes, then every metadata value, small
// tensors dequantized, the tokenizer and the decoder loader. Error is the expected outcome for
// bad input; any crash, sanitizer report or other exception is a bug.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <variant>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "formats/gguf.h"
#include "fuzz_util.h"
#include "model/decoder.h"
#include "tokenizer/tokenizer.h"

namespace tessera::model {
namespace {

// Dequantizing is linear in the size; bigger tensors add time, not coverage.
constexpr int64_t kMaxDequantElements = 1 << 16;

// Touches every byte of a value so the sanitizers check what the parser built.
size_t visit(const formats::GgufValue& v) {
  return std::visit(
      [](const auto& x) -> size_t {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) {
          size_t h = x.size();
          for (char c : x) h = h * 31 + static_cast<unsigned char>(c);
          return h;
        } else if constexpr (std::is_same_v<T, formats::GgufArray>) {
          size_t h = static_cast<size_t>(x.elem_type);
          for (const formats::GgufValue& item : x.items) h += visit(item);
          return h;
        } else {
          size_t h = 0;  // the bits, not a conversion: a float may not fit in size_t
          std::memcpy(&h, &x, sizeof(x));
          return h;
        }
      },
      v.v);
}

void exercise(const formats::GgufFile& f) {
  volatile size_t sink = 0;
  for (const auto& [key, value] : f.metadata()) {
    sink = sink + visit(value) + formats::gguf_type_name(value.type()).size();
    try {
      sink = sink + static_cast<size_t>(f.get_int(key));
    } catch (const Error&) {
    }
    try {
      sink = sink + f.get_string_array(key).size();
    } catch (const Error&) {
    }
  }
  std::vector<float> buf;
  for (const formats::GgufTensorInfo& t : f.tensors()) {
    if (f.find(t.name) != &t) __builtin_trap();  // the index must find each tensor
    if (t.n_elements > kMaxDequantElements) continue;
    buf.assign(static_cast<size_t>(t.n_elements), 0.0f);
    try {
      formats::gguf_tensor_to_f32(t, buf.data());
    } catch (const Error& e) {
      fuzz::note_rejected("formats::gguf_tensor_to_f32", e);
    }
  }
  try {
    const tokenizer::Tokenizer tok = tokenizer::Tokenizer::from_gguf(f);
    const std::vector<int32_t> ids = tok.encode("Hello wörld 123 <|im_start|>");
    sink = sink + tok.decode(ids).size();
  } catch (const Error& e) {
    fuzz::note_rejected("tokenizer::Tokenizer::from_gguf", e);
  }
}

}  // namespace
}  // namespace tessera::model

// The decoder loader asks the CPU backend for its preferred weight layouts.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tessera::cpu::register_backend();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  std::vector<uint8_t> bytes(data, data + size);
  try {
    const formats::GgufFile f = formats::GgufFile::from_memory(std::move(bytes), "fuzz.gguf");
    model::exercise(f);
  } catch (const Error& e) {
    fuzz::note_rejected("formats::GgufFile::from_memory", e);
    return 0;  // rejected with a message: the expected outcome for most inputs
  }
  // The loader reads by path; it validates shapes and types against the architecture.
  static fuzz::MemFile file;
  try {
    const model::DecoderModel m = model::load_decoder_gguf(file.write(data, size));
    volatile int64_t sink = m.total_weight_bytes();
    (void)sink;
  } catch (const Error& e) {
    fuzz::note_rejected("load_decoder_gguf", e);
  }
  return 0;
}
