// `tessera template`: a conversation rendered through a chat template exactly as transformers'
// apply_chat_template(..., tokenize=False) renders it, printed with nothing added: to check what
// a model will see, or to compare with another engine.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "apps/cli/args.h"
#include "apps/cli/infer_flags.h"
#include "core/error.h"
#include "core/file_io.h"
#include "jinja/template.h"

namespace tessera::cli {
namespace {

using ojson = nlohmann::ordered_json;

// A JSON file (key order kept: tojson prints keys in their order); errors name the flag.
ojson read_json_flag(const std::string& flag, const std::string& path) {
  TS_CHECK(file_exists(path), flag, " ", path, ": file not found");
  const ojson j = ojson::parse(read_text_file(path), nullptr, false);
  TS_CHECK(!j.is_discarded(), flag, " ", path, ": not valid JSON");
  return j;
}

int run(const Args& a) {
  const bool from_model = a.given("--model"), from_file = a.given("--template");
  TS_CHECK(from_model != from_file, "give exactly one of -m MODEL and --template FILE");
  std::string source, name, bos, eos;
  if (from_model) {
    model::DecoderLoadOptions lo;
    lo.mmap = true;  // only the tokenizer and the template are needed
    const std::string path = a.str("--model");
    const LoadedModel m = load_model_and_tokenizer(path, lo);
    TS_CHECK(!m.chat_template.empty(), "-m ", path,
             ": the model ships no chat template (give one with --template FILE)");
    source = m.chat_template;
    name = path + " chat template";
    const tokenizer::SpecialTokens& sp = m.tok.special_tokens();
    if (sp.bos >= 0) bos = m.tok.decode({sp.bos});
    if (sp.eos >= 0) eos = m.tok.decode({sp.eos});
  } else {
    const std::string path = a.str("--template");
    TS_CHECK(file_exists(path), "--template ", path, ": file not found");
    source = read_text_file(path);
    name = path;
  }
  if (a.given("--bos-token")) bos = a.str("--bos-token");
  if (a.given("--eos-token")) eos = a.str("--eos-token");

  const ojson messages = read_json_flag("--messages", a.str("--messages"));
  TS_CHECK(messages.is_array(), "--messages ", a.str("--messages"),
           ": must be a JSON array of messages ({\"role\": ..., \"content\": ...})");
  for (size_t i = 0; i < messages.size(); ++i)
    TS_CHECK(
        messages[i].is_object() && messages[i].contains("role") && messages[i]["role"].is_string(),
        "--messages ", a.str("--messages"), ": message ", i,
        " must be an object with a string \"role\"");
  ojson extra = ojson::object();
  if (a.given("--tools")) {
    extra["tools"] = read_json_flag("--tools", a.str("--tools"));
    TS_CHECK(extra["tools"].is_array(), "--tools ", a.str("--tools"), ": must be a JSON array");
  }
  if (a.given("--vars")) {
    const ojson vars = ojson::parse(a.str("--vars"), nullptr, false);
    TS_CHECK(!vars.is_discarded() && vars.is_object(),
             "--vars must be a JSON object, e.g. '{\"enable_thinking\": false}'");
    for (const auto& [k, v] : vars.items()) extra[k] = v;
  }
  const std::string text = jinja::render_chat_template(
      source, messages, bos, eos, !a.on("--no-generation-prompt"), extra, jinja::local_now, name);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

const Registrar reg({
    "template",
    "render a conversation through a chat template, exactly as transformers would",
    {
        Flag::text("--model", "", "a .gguf file or HF folder whose template (and bos/eos) to use",
                   "PATH")
            .short_name("-m"),
        Flag::text("--template", "", "a Jinja template file instead of a model's", "FILE"),
        Flag::text("--messages", "", "the conversation: a JSON array in the OpenAI format", "FILE")
            .required(),
        Flag::text("--tools", "", "tool definitions: a JSON array, given to the template", "FILE"),
        Flag::toggle("--no-generation-prompt", "end after the last message (no assistant header)"),
        Flag::text("--bos-token", "", "bos_token for the template (default: the model's)", "S"),
        Flag::text("--eos-token", "", "eos_token for the template (default: the model's)", "S"),
        Flag::text("--vars", "", "more template variables: a JSON object", "JSON"),
    },
    {},
    &run,
    {},
});

}  // namespace
}  // namespace tessera::cli
