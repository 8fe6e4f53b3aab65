// libFuzzer target: Tokenizer::from_json_text on arbitrary text, then encode/decode round trips
// and a save/load round trip. Error is the expected outcome for bad input; anything else is a
// bug, and so are ids out of range and a save/load that changes the vocabulary size.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

namespace {

// Text with ASCII, multi-byte UTF-8, digits, whitespace runs, an invalid byte, added tokens with
// spaces around them (lstrip/rstrip), and combining marks out of canonical order (NFC).
constexpr std::string_view kProbe =
    "Hello, wörld! 12345  \n\t<|endoftext|> ça   \xff\xfe <s></s><|im_start|>x "
    "cafe\u0301 a\u0323\u0302 \u1100\u1161\u11a8";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  try {
    const tokenizer::Tokenizer tok = tokenizer::Tokenizer::from_json_text(json, "fuzz.json");
    const std::vector<int32_t> ids = tok.encode_ordinary(kProbe);
    for (int32_t id : ids) {
      if (id < 0 || id >= tok.vocab_size()) __builtin_trap();  // encode produced a bad id
      (void)tok.decode_token(id);
    }
    (void)tok.decode(tok.encode(kProbe), /*skip_special=*/true);
    const tokenizer::Tokenizer again =
        tokenizer::Tokenizer::from_json_text(tok.to_json_text(), "again");
    if (again.vocab_size() != tok.vocab_size()) __builtin_trap();  // save/load lost tokens
  } catch (const Error& e) {
    fuzz::note_rejected("Tokenizer::from_json_text", e);
  }
  return 0;
}
