// libFuzzer target: the Jinja chat-template renderer on an arbitrary template, rendered over a
// fixed conversation. Error (a syntax error, a raised exception, a limit reached) is the
// expected outcome for bad input; a crash, a hang or runaway memory is a bug. The limits are
// tightened so a template that loops or recurses reaches them within the fuzzer's time budget.
#include <cstddef>
#include <cstdint>
#include <ctime>
#include <string>
#include <string_view>

#include "core/error.h"
#include "fuzz_util.h"
#include "jinja/template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera::jinja;
  const std::string source(reinterpret_cast<const char*>(data), size);
  static const nlohmann::ordered_json kMessages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Héllo <b>1</b>", "name": "ana"},
    {"role": "assistant", "content": "",
     "tool_calls": [{"type": "function",
                     "function": {"name": "f", "arguments": {"x": [1, 2.5, null]}}}]},
    {"role": "tool", "content": "ok", "tool_call_id": "1"}])");
  try {
    Options o;
    o.trim_blocks = o.lstrip_blocks = true;
    o.name = "fuzz.jinja";
    o.max_steps = 200000;
    o.max_output_bytes = size_t{1} << 20;
    const Template t(source, o);
    const Value ctx = from_json(nlohmann::ordered_json{{"messages", kMessages},
                                                       {"bos_token", "<s>"},
                                                       {"eos_token", "</s>"},
                                                       {"add_generation_prompt", true}});
    (void)t.render(ctx);
  } catch (const tessera::Error& e) {
    tessera::fuzz::note_rejected("jinja::Template", e);
  }
  return 0;
}
