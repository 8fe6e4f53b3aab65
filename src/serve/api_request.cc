// Parsing and checking of the OpenAI request bodies: every field read through one table-like
// reader that knows its type and range, every field left over refused by name.
#include "serve/api_request.h"

#include <charconv>
#include <cmath>
#include <random>
#include <set>

#include "nlohmann/json.hpp"

namespace tessera::serve {

using nlohmann::json;

ApiError::ApiError(int status_, std::string message, std::string param_, std::string type_)
    : std::runtime_error(std::move(message)),
      status(status_),
      param(std::move(param_)),
      type(std::move(type_)) {}

namespace {

constexpr int kMaxDepth = 32;

json parse_body(std::string_view body) {
  if (body.empty()) throw ApiError(400, "the request body is empty: send a JSON object");
  json j;
  try {
    // The callback sees every nesting level before it is built: refuse deep ones early (the
    // parser itself would happily build a million nested arrays).
    j = json::parse(body.begin(), body.end(), [](int depth, json::parse_event_t, json&) {
      if (depth > kMaxDepth) throw ApiError(400, "the request body nests deeper than 32 levels");
      return true;
    });
  } catch (const json::exception& e) {
    throw ApiError(400, std::string("the request body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw ApiError(400, "the request body must be a JSON object");
  return j;
}

std::string type_name(const json& v) {
  return v.is_number_integer() || v.is_number_unsigned() ? "integer" : v.type_name();
}

// Reads the fields of one JSON object, each once, checking type and range; whatever is left at
// the end is an unknown field. A null value counts as not given (OpenAI clients send them).
class Fields {
 public:
  Fields(const json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  const json* get(const std::string& key) {
    seen_.insert(key);
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  std::string name(const std::string& key) const { return where_ + key; }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw ApiError(400, "'" + name(key) + "' " + what, name(key));
  }
  std::optional<double> number(const std::string& key, double lo, double hi) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) fail(key, "must be a number, not " + type_name(*v));
    const double x = v->get<double>();
    if (!std::isfinite(x) || x < lo || x > hi)
      fail(key, "must be in [" + fmt(lo) + ", " + fmt(hi) + "], not " + v->dump());
    return x;
  }
  std::optional<int64_t> integer(const std::string& key, int64_t lo, int64_t hi) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number_integer()) fail(key, "must be an integer, not " + type_name(*v));
    if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      fail(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    const auto x = v->get<int64_t>();
    if (x < lo || x > hi)
      fail(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], not " +
                    std::to_string(x));
    return x;
  }
  std::optional<bool> boolean(const std::string& key) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) fail(key, "must be true or false, not " + type_name(*v));
    return v->get<bool>();
  }
  std::optional<std::string> string(const std::string& key) {
    const json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) fail(key, "must be a string, not " + type_name(*v));
    return v->get<std::string>();
  }
  // Fields of the OpenAI API this server does not implement: refused when given a value that
  // asks for something (false, an empty list or object, or the default ask for nothing).
  void unsupported(std::initializer_list<const char*> keys) {
    for (const char* key : keys) {
      const json* v = get(key);
      if (!v) continue;
      if ((v->is_boolean() && !v->get<bool>()) || ((v->is_array() || v->is_object()) && v->empty()))
        continue;
      fail(key, "is not supported by this server");
    }
  }
  void no_others() const {
    for (auto it = obj_.begin(); it != obj_.end(); ++it)
      if (!seen_.count(it.key()))
        throw ApiError(400, "unknown field '" + name(it.key()) + "'", name(it.key()));
  }

 private:
  static std::string fmt(double x) {
    char buf[32];
    return std::string(buf, std::to_chars(buf, buf + sizeof buf, x).ptr);
  }
  const json& obj_;
  std::string where_;
  std::set<std::string> seen_;
};

std::string text_content(const json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    throw ApiError(400, "'" + where + "' must be a string or a list of text parts", where);
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!content[i].is_object()) throw ApiError(400, "'" + at + "' must be an object", at);
    Fields part(content[i], at + ".");
    const std::optional<std::string> type = part.string("type");
    if (type != "text")
      throw ApiError(400,
                     "'" + at + ".type' " +
                         (type ? "'" + *type + "' is not supported (only text parts)"
                               : std::string("is required")),
                     at + ".type");
    const std::optional<std::string> t = part.string("text");
    if (!t) part.fail("text", "is required");
    part.no_others();
    if (!text.empty()) text += "\n";  // parts joined by newlines, as vLLM joins them
    text += *t;
  }
  return text;
}

std::vector<tokenizer::ChatMessage> parse_messages(Fields& f) {
  const json* msgs = f.get("messages");
  if (!msgs) f.fail("messages", "is required");
  if (!msgs->is_array() || msgs->empty()) f.fail("messages", "must be a non-empty list");
  std::vector<tokenizer::ChatMessage> out;
  for (size_t i = 0; i < msgs->size(); ++i) {
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!(*msgs)[i].is_object()) throw ApiError(400, "'" + at + "' must be an object", at);
    Fields m((*msgs)[i], at + ".");
    std::optional<std::string> role = m.string("role");
    if (!role) m.fail("role", "is required");
    if (*role == "developer") role = "system";  // OpenAI's newer name for the system message
    if (*role != "system" && *role != "user" && *role != "assistant")
      m.fail("role", "'" + *role + "' is not supported (system, developer, user, assistant)");
    m.unsupported({"tool_calls", "function_call", "name", "refusal", "audio"});
    const json* content = m.get("content");
    if (!content) m.fail("content", "is required");
    out.push_back({*role, text_content(*content, at + ".content")});
    m.no_others();
  }
  return out;
}

std::vector<std::string> parse_stop(Fields& f) {
  const json* v = f.get("stop");
  if (!v) return {};
  std::vector<std::string> out;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    if (v->size() > 16) f.fail("stop", "may hold at most 16 strings");
    for (const json& s : *v) {
      if (!s.is_string()) f.fail("stop", "must be a string or a list of strings");
      out.push_back(s.get<std::string>());
    }
  } else {
    f.fail("stop", "must be a string or a list of strings, not " + type_name(*v));
  }
  for (const std::string& s : out)
    if (s.empty()) f.fail("stop", "may not hold an empty string");
  return out;
}

// The fields both generation endpoints share.
void parse_common(Fields& f, GenerationRequest& r) {
  const std::optional<std::string> model = f.string("model");
  r.model = model.value_or("");
  infer::SamplingParams& p = r.sampling;
  p = infer::SamplingParams{};
  p.temperature = 1;
  p.top_k = 0;
  p.top_p = 1;
  p.min_p = 0;
  if (auto v = f.number("temperature", 0, 2)) p.temperature = static_cast<float>(*v);
  if (auto v = f.number("top_p", 0, 1)) {
    if (*v <= 0) f.fail("top_p", "must be in (0, 1], not 0");
    p.top_p = static_cast<float>(*v);
  }
  if (auto v = f.integer("top_k", -1, 1 << 20)) p.top_k = *v < 0 ? 0 : *v;  // -1: all (vLLM)
  if (auto v = f.number("min_p", 0, 1)) {
    if (*v >= 1) f.fail("min_p", "must be in [0, 1), not 1");
    p.min_p = static_cast<float>(*v);
  }
  if (auto v = f.number("presence_penalty", -2, 2)) p.presence_penalty = static_cast<float>(*v);
  if (auto v = f.number("frequency_penalty", -2, 2)) p.frequency_penalty = static_cast<float>(*v);
  if (auto v = f.number("repetition_penalty", 0, 10)) {
    if (*v <= 0) f.fail("repetition_penalty", "must be > 0");
    p.repetition_penalty = static_cast<float>(*v);
  }
  if (auto v = f.integer("seed", INT64_MIN, INT64_MAX)) {
    p.seed = static_cast<uint64_t>(*v);
    r.seed_given = true;
  } else {
    static thread_local std::mt19937_64 fresh{std::random_device{}()};
    p.seed = fresh();
  }
  r.stop = parse_stop(f);
  r.n = f.integer("n", 1, 128).value_or(1);
  r.stream = f.boolean("stream").value_or(false);
  if (const json* so = f.get("stream_options")) {
    if (!so->is_object()) f.fail("stream_options", "must be an object");
    if (!r.stream) f.fail("stream_options", "is only allowed with \"stream\": true");
    Fields o(*so, "stream_options.");
    r.include_usage = o.boolean("include_usage").value_or(false);
    o.no_others();
  }
  r.ignore_eos = f.boolean("ignore_eos").value_or(false);
  r.skip_special_tokens = f.boolean("skip_special_tokens").value_or(true);
  // SGLang's fields, which its router adds to every request it forwards: accepted where they ask
  // for what this server does anyway (it has no reasoning parser, so splitting reasoning from
  // content changes nothing), refused where they ask for more.
  f.boolean("separate_reasoning");
  f.boolean("stream_reasoning");
  for (const char* key : {"no_stop_trim", "continue_final_message", "return_hidden_states"})
    if (f.boolean(key).value_or(false)) f.fail(key, "true is not supported by this server");
  f.string("user");  // an end-user id for abuse monitoring: accepted, kept nowhere
  f.unsupported({"logit_bias", "tools", "tool_choice", "functions", "function_call",
                 "response_format", "parallel_tool_calls", "prediction", "audio", "modalities",
                 "store", "metadata", "service_tier", "reasoning_effort", "web_search_options",
                 "guided_json", "guided_regex", "guided_choice", "guided_grammar"});
}

}  // namespace

GenerationRequest parse_chat_request(std::string_view body) {
  const json j = parse_body(body);
  Fields f(j, "");
  GenerationRequest r;
  r.endpoint = Endpoint::chat;
  parse_common(f, r);
  r.messages = parse_messages(f);
  const std::optional<int64_t> a = f.integer("max_tokens", 1, int64_t{1} << 24);
  const std::optional<int64_t> b = f.integer("max_completion_tokens", 1, int64_t{1} << 24);
  if (a && b && *a != *b)
    f.fail("max_completion_tokens", "differs from 'max_tokens': give one of them");
  if (b) {
    r.max_tokens = *b;
    r.max_tokens_field = "max_completion_tokens";
  } else if (a) {
    r.max_tokens = *a;
  }
  const bool logprobs = f.boolean("logprobs").value_or(false);
  const std::optional<int64_t> top = f.integer("top_logprobs", 0, 20);
  if (top && !logprobs) f.fail("top_logprobs", "needs \"logprobs\": true");
  if (logprobs) r.top_logprobs = top.value_or(0);
  f.no_others();
  return r;
}

GenerationRequest parse_completion_request(std::string_view body) {
  const json j = parse_body(body);
  Fields f(j, "");
  GenerationRequest r;
  r.endpoint = Endpoint::completion;
  parse_common(f, r);
  const json* p = f.get("prompt");
  if (!p) f.fail("prompt", "is required");
  const json* one = p;
  if (p->is_array() && !p->empty() && (p->front().is_string() || p->front().is_array())) {
    if (p->size() != 1)
      f.fail("prompt",
             "holds " + std::to_string(p->size()) + " prompts: send one request per prompt");
    one = &p->front();
  }
  if (one->is_string()) {
    r.prompt = one->get<std::string>();
    if (r.prompt.empty()) f.fail("prompt", "is empty");
  } else if (one->is_array() && !one->empty()) {
    r.prompt_is_tokens = true;
    for (const json& t : *one) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
        f.fail("prompt", "must be a string or a list of token ids (integers >= 0)");
      r.prompt_tokens.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
  } else {
    f.fail("prompt", "must be a non-empty string or a list of token ids");
  }
  if (auto v = f.integer("max_tokens", 0, int64_t{1} << 24)) r.max_tokens = *v;
  if (auto v = f.integer("logprobs", 0, 20)) r.top_logprobs = *v;
  if (auto v = f.integer("best_of", 1, 128); v && *v != 1)
    f.fail("best_of", "other than 1 is not supported by this server");
  if (auto v = f.string("suffix"); v && !v->empty())
    f.fail("suffix", "is not supported by this server");
  f.unsupported({"echo"});
  f.no_others();
  return r;
}

EmbeddingRequest parse_embedding_request(std::string_view body) {
  const json j = parse_body(body);
  Fields f(j, "");
  EmbeddingRequest r;
  r.model = f.string("model").value_or("");
  const json* in = f.get("input");
  if (!in) f.fail("input", "is required");
  auto token_list = [&](const json& a) {
    std::vector<int32_t> ids;
    for (const json& t : a) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
        f.fail("input", "must be text, a list of texts, or token ids (integers >= 0)");
      ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    return ids;
  };
  if (in->is_string()) {
    r.texts.push_back(in->get<std::string>());
  } else if (in->is_array() && !in->empty()) {
    if (in->size() > 2048) f.fail("input", "may hold at most 2048 inputs");
    if (in->front().is_string()) {
      for (const json& t : *in) {
        if (!t.is_string()) f.fail("input", "mixes texts and other values");
        r.texts.push_back(t.get<std::string>());
      }
    } else if (in->front().is_array()) {
      for (const json& t : *in) {
        if (!t.is_array() || t.empty()) f.fail("input", "must hold non-empty lists of token ids");
        r.token_lists.push_back(token_list(t));
      }
    } else {
      r.token_lists.push_back(token_list(*in));
    }
  } else {
    f.fail("input", "must be a string, a non-empty list of strings, or token ids");
  }
  for (const std::string& t : r.texts)
    if (t.empty()) f.fail("input", "may not hold an empty string");
  const std::string fmt = f.string("encoding_format").value_or("float");
  if (fmt != "float" && fmt != "base64")
    f.fail("encoding_format", "must be \"float\" or \"base64\", not \"" + fmt + "\"");
  r.base64 = fmt == "base64";
  f.string("user");
  f.unsupported({"dimensions"});
  f.no_others();
  return r;
}

}  // namespace tessera::serve
