// libFuzzer target: SafetensorsReader on arbitrary bytes (through an in-memory file), then every
// tensor read as f32. Error is the expected outcome for bad input; anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "formats/safetensors.h"
#include "fuzz_util.h"

namespace {
constexpr int64_t kMaxReadElements = 1 << 16;  // bigger tensors add time, not coverage
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  static fuzz::MemFile file;
  try {
    const formats::SafetensorsReader r(file.write(data, size));
    volatile size_t sink = 0;
    for (const auto& [key, value] : r.metadata()) sink = sink + key.size() + value.size();
    std::vector<float> buf;
    for (const formats::SafetensorsEntry& e : r.entries()) {
      if (r.find(e.name) != &e) __builtin_trap();  // the lookup must find each entry
      const int64_t n = e.shape.numel();
      if (n > kMaxReadElements || e.dtype == DType::i32) continue;
      buf.assign(static_cast<size_t>(n), 0.0f);
      r.read_f32(e.name, e.shape, buf.data());
      for (float x : buf) sink = sink + (x == 0.0f);
    }
  } catch (const Error& e) {
    fuzz::note_rejected("SafetensorsReader", e);
  }
  return 0;
}
