// Attribute and item access as jinja2's sandbox does it, and the str/list/dict methods chat
// templates call. Methods that mutate (list.append, dict.update, ...) fail as they do under
// transformers' ImmutableSandboxedEnvironment.
#include <algorithm>

#include "jinja/builtins.h"
#include "jinja/py_string.h"

namespace tessera::jinja {
namespace {

const char* const kUnsafeListMethods[] = {"append", "clear",  "extend",  "insert",
                                          "pop",    "remove", "reverse", "sort"};
const char* const kUnsafeDictMethods[] = {"clear", "pop", "popitem", "setdefault", "update"};

bool one_of(std::string_view name, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (name == n) return true;
  return false;
}

Value str_list(const std::vector<std::string>& parts) {
  List out;
  out.reserve(parts.size());
  for (const auto& p : parts) out.emplace_back(p);
  return Value::list(std::move(out));
}

// Python's index normalization for str.find/startswith ranges is not needed by templates; the
// methods below take their common forms.
Value str_method(const std::string& s, const std::string& name, const Args& a) {
  const std::string fn = "str." + name;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Bound b(fn, a, {"chars"});
    std::optional<std::string> chars;
    if (b.get(0) && !b.get(0)->is_none()) chars = b.str(0);
    return Value(py_strip(s, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    const Bound b(fn, a, {"sep", "maxsplit"});
    std::optional<std::string> sep;
    if (b.get(0) && !b.get(0)->is_none()) sep = b.str(0);
    const int64_t maxsplit = b.get(1) ? *b.integer(1) : -1;
    return str_list(name == "split" ? py_split(s, sep, maxsplit) : py_rsplit(s, sep, maxsplit));
  }
  if (name == "splitlines") {
    const Bound b(fn, a, {"keepends"});
    return str_list(py_splitlines(s, truthy(b.get_or(0, Value(false)))));
  }
  if (name == "startswith" || name == "endswith") {
    const Bound b(fn, a, {"prefix"});
    if (!b.get(0)) value_fail(fn, "() takes at least 1 argument (0 given)");
    std::vector<std::string> options;
    if (b.get(0)->is_tuple()) {
      for (const Value& v : b.get(0)->items()) {
        if (!v.is_string()) value_fail(fn, ": tuple for ", name, " must only contain str");
        options.push_back(v.str());
      }
    } else {
      options.push_back(*b.str(0));
    }
    for (const auto& o : options) {
      if (o.size() > s.size()) continue;
      if (name == "startswith" ? s.compare(0, o.size(), o) == 0
                               : s.compare(s.size() - o.size(), o.size(), o) == 0)
        return Value(true);
    }
    return Value(false);
  }
  if (name == "replace") {
    const Bound b(fn, a, {"old", "new", "count"});
    if (!b.get(1)) value_fail(fn, "() takes at least 2 arguments");
    return Value(py_replace(s, *b.str(0), *b.str(1), b.get(2) ? *b.integer(2) : -1));
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    const Bound b(fn, a, {});
    return Value(name == "upper"   ? py_upper(s)
                 : name == "lower" ? py_lower(s)
                 : name == "title" ? py_title(s)
                                   : py_capitalize(s));
  }
  if (name == "format") return Value(brace_format(s, a.positional, a.keyword));
  if (name == "join") {
    const Bound b(fn, a, {"iterable"});
    if (!b.get(0)) value_fail(fn, "() takes exactly one argument (0 given)");
    std::string out;
    bool first = true;
    for (const Value& v : iterate(*b.get(0))) {
      if (!v.is_string())
        value_fail(fn, ": sequence item: expected str instance, ", v.type_name(), " found");
      if (!first) out += s;
      first = false;
      out += v.str();
      if (out.size() > kMaxValueBytes) value_fail(fn, ": result too large");
    }
    return Value(std::move(out));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    const Bound b(fn, a, {"sub"});
    if (!b.get(0)) value_fail(fn, "() takes at least 1 argument (0 given)");
    const std::string sub = *b.str(0);
    if (name == "count") {
      if (sub.empty()) return Value(code_point_count(s) + 1);
      int64_t n = 0;
      for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
      return Value(n);
    }
    const size_t at = name[0] == 'r' ? s.rfind(sub) : s.find(sub);
    if (at == std::string::npos) {
      if (name == "index" || name == "rindex") value_fail(fn, ": substring not found");
      return Value(int64_t{-1});
    }
    return Value(code_point_count(std::string_view(s).substr(0, at)));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const Bound b(fn, a, {"affix"});
    if (!b.get(0)) value_fail(fn, "() takes exactly one argument (0 given)");
    const std::string x = *b.str(0);
    if (name == "removeprefix" && s.compare(0, x.size(), x) == 0) return Value(s.substr(x.size()));
    if (name == "removesuffix" && x.size() <= s.size() && !x.empty() &&
        s.compare(s.size() - x.size(), x.size(), x) == 0)
      return Value(s.substr(0, s.size() - x.size()));
    return Value(s);
  }
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" ||
      name == "islower" || name == "isupper") {
    const Bound b(fn, a, {});
    if (s.empty()) return Value(false);
    if (name == "isspace") return Value(py_strip(s, std::nullopt, true, true).empty());
    bool cased = false;
    for (char c : s) {
      const bool d = c >= '0' && c <= '9', lo = c >= 'a' && c <= 'z', up = c >= 'A' && c <= 'Z';
      if (name == "isdigit" && !d) return Value(false);
      if (name == "isalpha" && !(lo || up)) return Value(false);
      if (name == "isalnum" && !(lo || up || d)) return Value(false);
      if (name == "islower" && up) return Value(false);
      if (name == "isupper" && lo) return Value(false);
      cased = cased || lo || up;
    }
    return Value(name == "islower" || name == "isupper" ? cased : true);
  }
  value_fail("'str' object has no attribute '", name, "'");
}

bool is_str_method(std::string_view n) {
  return one_of(
      n, {"strip",        "lstrip",  "rstrip",  "split",   "rsplit",  "splitlines", "startswith",
          "endswith",     "replace", "upper",   "lower",   "title",   "capitalize", "format",
          "join",         "find",    "rfind",   "index",   "rindex",  "count",      "removeprefix",
          "removesuffix", "isdigit", "isalpha", "isalnum", "isspace", "islower",    "isupper"});
}

Value list_method(const Value& self, const std::string& name, const Args& a) {
  const std::string fn = self.type_name() + "." + name;
  const Bound b(fn, a, {"value"});
  if (!b.get(0)) value_fail(fn, "() takes exactly one argument (0 given)");
  int64_t n = 0, i = 0, found = -1;
  for (const Value& v : self.items()) {
    if (equal(v, *b.get(0))) {
      ++n;
      if (found < 0) found = i;
    }
    ++i;
  }
  if (name == "count") return Value(n);
  if (found < 0) value_fail(fn, "(x): x not in ", self.type_name());
  return Value(found);
}

Value dict_method(const Value& self, const std::string& name, const Args& a) {
  const std::string fn = "dict." + name;
  const Dict& d = self.dict();
  if (name == "get") {
    const Bound b(fn, a, {"key", "default"});
    if (!b.get(0)) value_fail(fn, " expected at least 1 argument, got 0");
    const Value* v = d.find(*b.get(0));
    return v ? *v : b.get_or(1, Value::none());
  }
  const Bound b(fn, a, {});
  List out;
  for (const auto& [k, v] : d.items) {
    if (name == "items")
      out.push_back(Value::tuple({k, v}));
    else
      out.push_back(name == "keys" ? k : v);
  }
  return Value::list(std::move(out));
}

Value bind(const Value& self, const std::string& name,
           Value (*method)(const Value&, const std::string&, const Args&)) {
  return Value::callable(self.type_name() + "." + name,
                         [self, name, method](Args& a) { return method(self, name, a); });
}

Value str_bound(const Value& self, const std::string& name, const Args& a) {
  return str_method(self.str(), name, a);
}

}  // namespace

Value get_attr(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::undefined:
      value_fail(obj.undefined_hint());
    case Value::Kind::string:
      if (is_str_method(name)) return bind(obj, name, str_bound);
      break;
    case Value::Kind::list:
    case Value::Kind::tuple:
      if (name == "index" || name == "count") return bind(obj, name, list_method);
      if (obj.is_list())
        for (const char* m : kUnsafeListMethods)
          if (name == m) value_fail("access to attribute '", name, "' of 'list' object is unsafe.");
      break;
    case Value::Kind::dict:
      if (one_of(name, {"items", "keys", "values", "get"})) return bind(obj, name, dict_method);
      for (const char* m : kUnsafeDictMethods)
        if (name == m) value_fail("access to attribute '", name, "' of 'dict' object is unsafe.");
      if (const Value* v = obj.dict().find(std::string_view(name))) return *v;
      break;
    case Value::Kind::object:
      if (const Value* v = obj.object().find(name)) return *v;
      break;
    default:
      break;
  }
  return Value::undefined(cat("'", obj.is_dict() ? "dict object" : obj.type_name() + " object",
                              "' has no attribute '", name, "'"));
}

Value get_item(const Value& obj, const Value& key) {
  // jinja2's getitem turns Python's TypeError into an undefined value.
  if (obj.is_generator())
    return Value::undefined("'generator object' has no attribute '" + to_str(key) + "'");
  switch (obj.kind()) {
    case Value::Kind::undefined:
      value_fail(obj.undefined_hint());
    case Value::Kind::dict:
      if (const Value* v = obj.dict().find(key)) return *v;
      break;
    case Value::Kind::list:
    case Value::Kind::tuple:
    case Value::Kind::string:
      if ((key.is_int() || key.is_bool())) {
        int64_t i = key.integer();
        if (obj.is_string()) {
          const std::vector<size_t> offs = code_point_offsets(obj.str());
          const int64_t n = static_cast<int64_t>(offs.size()) - 1;
          if (i < 0) i += n;
          if (i >= 0 && i < n) return Value(obj.str().substr(offs[i], offs[i + 1] - offs[i]));
        } else {
          const int64_t n = static_cast<int64_t>(obj.items().size());
          if (i < 0) i += n;
          if (i >= 0 && i < n) return obj.items()[static_cast<size_t>(i)];
        }
        return Value::undefined(cat(obj.type_name(), " object has no element ", key.integer()));
      }
      break;
    default:
      break;
  }
  if (key.is_string()) return get_attr(obj, key.str());
  return Value::undefined(cat("'", obj.type_name(), " object' has no attribute ", repr(key)));
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) value_fail(obj.undefined_hint());
  auto as_index = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (!v.is_int() && !v.is_bool())
      value_fail("slice ", what, " must be an integer or None, not ", v.type_name());
    return v.integer();
  };
  const std::optional<int64_t> a = as_index(start, "start"), b = as_index(stop, "stop");
  const int64_t st = as_index(step, "step").value_or(1);
  if (st == 0) value_fail("slice step cannot be zero");
  std::vector<size_t> offs;
  int64_t n;
  if (obj.is_string()) {
    offs = code_point_offsets(obj.str());
    n = static_cast<int64_t>(offs.size()) - 1;
  } else if (obj.is_sequence()) {
    n = static_cast<int64_t>(obj.items().size());
  } else {
    value_fail("'", obj.type_name(), "' object is not subscriptable");
  }
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) {
      x += n;
      if (x < 0) x = st < 0 ? -1 : 0;
    } else if (x >= n) {
      x = st < 0 ? n - 1 : n;
    }
    return x;
  };
  const int64_t lo = adjust(a, st < 0 ? n - 1 : 0), hi = adjust(b, st < 0 ? -1 : n);
  std::string s;
  List items;
  for (int64_t i = lo; st > 0 ? i < hi : i > hi; i += st) {
    if (obj.is_string())
      s += obj.str().substr(offs[i], offs[i + 1] - offs[i]);
    else
      items.push_back(obj.items()[static_cast<size_t>(i)]);
  }
  if (obj.is_string()) return Value(std::move(s));
  return obj.is_tuple() ? Value::tuple(std::move(items)) : Value::list(std::move(items));
}

List iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined:
      return {};
    case Value::Kind::list:
    case Value::Kind::tuple:
      return v.items();
    case Value::Kind::dict: {
      List keys;
      for (const auto& kv : v.dict().items) keys.push_back(kv.first);
      return keys;
    }
    case Value::Kind::string: {
      List chars;
      const std::vector<size_t> offs = code_point_offsets(v.str());
      for (size_t i = 0; i + 1 < offs.size(); ++i)
        chars.emplace_back(v.str().substr(offs[i], offs[i + 1] - offs[i]));
      return chars;
    }
    default:
      value_fail("'", v.type_name(), "' object is not iterable");
  }
}

}  // namespace tessera::jinja
