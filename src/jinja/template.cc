// The public face of the Jinja renderer: Template (lex, parse, check names once; render many
// times) and render_chat_template (transformers' chat template environment).
#include "jinja/template.h"

#include "core/error.h"
#include "jinja/ast.h"
#include "jinja/eval.h"

namespace tessera::jinja {

struct Template::Impl {
  Options options;
  Body body;
};

Template::Template(std::string source, Options options) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  const Options& o = impl_->options;
  const std::vector<Token> tokens =
      lex(source, LexOptions{o.trim_blocks, o.lstrip_blocks, o.keep_trailing_newline}, o.name);
  impl_->body = parse(tokens, o.name, ParseLimits{o.max_nesting});
  check_names(impl_->body, o.name);
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const Value& context) const {
  const Options& o = impl_->options;
  return evaluate(impl_->body, context, o.name,
                  EvalLimits{o.max_steps, o.max_call_depth, o.max_output_bytes});
}

std::tm local_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  return tm;
}

namespace {

// transformers' _alias_reasoning_fields: {"thinking": r, **message, "reasoning_content": r}
// where r is the first non-null of reasoning_content, thinking, reasoning.
Value alias_reasoning(const Value& message) {
  if (!message.is_dict()) return message;
  const Dict& d = message.dict();
  const Value* r = nullptr;
  for (const char* key : {"reasoning_content", "thinking", "reasoning"}) {
    const Value* v = d.find(std::string_view(key));
    if (v && !v->is_none()) {
      r = v;
      break;
    }
  }
  if (!r) return message;
  Dict out;
  out.set(Value("thinking"), *r);
  for (const auto& [k, v] : d.items) out.set(k, v);
  out.set(Value("reasoning_content"), *r);
  return Value::dict(std::move(out));
}

}  // namespace

std::string render_chat_template(std::string_view source, const nlohmann::ordered_json& messages,
                                 const std::string& bos_token, const std::string& eos_token,
                                 bool add_generation_prompt, const nlohmann::ordered_json& extra,
                                 const Clock& clock, const std::string& name) {
  TS_CHECK(messages.is_array(), "[jinja] ", name, ": messages must be a JSON array, not ",
           messages.type_name());
  TS_CHECK(extra.is_null() || extra.is_object(), "[jinja] ", name,
           ": extra globals must be a JSON object, not ", extra.type_name());
  Options o;
  o.trim_blocks = true;
  o.lstrip_blocks = true;
  o.name = name;
  const Template tpl(std::string(source), o);

  List msgs;
  for (const auto& m : messages) {
    TS_CHECK(m.is_object(), "[jinja] ", name, ": each message must be a JSON object, not ",
             m.type_name());
    msgs.push_back(alias_reasoning(from_json(m)));
  }
  Dict g;
  g.set(Value("messages"), Value::list(std::move(msgs)));
  g.set(Value("tools"), Value::none());
  g.set(Value("documents"), Value::none());
  g.set(Value("add_generation_prompt"), Value(add_generation_prompt));
  g.set(Value("bos_token"), Value(bos_token));
  g.set(Value("eos_token"), Value(eos_token));
  g.set(Value("raise_exception"), Value::callable("raise_exception", [](Args& a) -> Value {
          const std::string msg = a.positional.empty() ? "" : to_str(a.positional[0]);
          value_fail("the template raised an exception: ", msg);
        }));
  g.set(Value("strftime_now"), Value::callable("strftime_now", [clock](Args& a) {
          if (a.positional.size() != 1 || !a.positional[0].is_string())
            value_fail("strftime_now() takes one format string");
          const std::string& fmt = a.positional[0].str();
          if (fmt.empty()) return Value("");
          const std::tm tm = clock();
          // strftime returns 0 both for an empty result and for a too small buffer: grow a few
          // times, then accept the empty result.
          for (size_t size = 256; size <= (size_t{1} << 20); size *= 16) {
            std::string buf(size, '\0');
            const size_t n = std::strftime(buf.data(), buf.size(), fmt.c_str(), &tm);
            if (n > 0) return Value(buf.substr(0, n));
          }
          return Value("");
        }));
  if (extra.is_object())
    for (auto it = extra.begin(); it != extra.end(); ++it)
      g.set(Value(it.key()), from_json(it.value()));
  return tpl.render(Value::dict(std::move(g)));
}

}  // namespace tessera::jinja
