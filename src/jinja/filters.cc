// jinja2's built-in filters and tests, with transformers' tojson (json.dumps with
// ensure_ascii either way and its indent/sort_keys arguments).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "jinja/builtins.h"
#include "jinja/py_string.h"
#include "unicode/utf8.h"

namespace tessera::jinja {

Bound::Bound(std::string_view fn, const Args& args, std::initializer_list<const char*> names)
    : fn_(fn), names_(names), values_(names.size(), nullptr) {
  if (args.positional.size() > names_.size())
    value_fail(fn_, "() takes at most ", names_.size(), " argument(s) (", args.positional.size(),
               " given)");
  for (size_t i = 0; i < args.positional.size(); ++i) values_[i] = &args.positional[i];
  for (const auto& [key, v] : args.keyword) {
    size_t i = 0;
    while (i < names_.size() && key != names_[i]) ++i;
    if (i == names_.size()) value_fail(fn_, "() got an unexpected keyword argument '", key, "'");
    if (values_[i]) value_fail(fn_, "() got multiple values for argument '", key, "'");
    values_[i] = &v;
  }
}

std::optional<std::string> Bound::str(size_t i) const {
  const Value* v = get(i);
  if (!v) return std::nullopt;
  if (!v->is_string())
    value_fail(fn_, "(): argument '", names_[i], "' must be str, not ", v->type_name());
  return v->str();
}

std::optional<int64_t> Bound::integer(size_t i) const {
  const Value* v = get(i);
  if (!v) return std::nullopt;
  if (!v->is_int() && !v->is_bool())
    value_fail(fn_, "(): argument '", names_[i], "' must be int, not ", v->type_name());
  return v->integer();
}

namespace {

// Attribute lookups in filters: "a.b" walks dotted paths, digits index lists (jinja2's
// make_attrgetter).
Value attr_path(const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
    bool digits = !part.empty();
    for (char c : part) digits = digits && c >= '0' && c <= '9';
    v = digits ? get_item(v, Value(static_cast<int64_t>(std::stoll(part))))
               : get_item(v, Value(part));
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

// The sort key jinja2 uses: strings lowered unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  return !case_sensitive && v.is_string() ? Value(py_lower(v.str())) : v;
}

Args rest_args(const Args& a, size_t skip) {
  Args r;
  for (size_t i = skip; i < a.positional.size(); ++i) r.positional.push_back(a.positional[i]);
  r.keyword = a.keyword;
  return r;
}

// JSON text with every non-ASCII code point written as \uXXXX (a surrogate pair past U+FFFF),
// lowercase hex: Python's json.dumps(ensure_ascii=True). The input is valid UTF-8 (to_json's).
std::string ascii_json(const std::string& json) {
  std::string out;
  out.reserve(json.size());
  char buf[16];
  for (size_t i = 0; i < json.size();) {
    if (static_cast<unsigned char>(json[i]) < 0x80) {
      out += json[i++];
      continue;
    }
    uint32_t cp = 0;
    const int n = unicode::decode_utf8(json, i, &cp);
    i += static_cast<size_t>(std::max(n, 1));
    auto unit = [&](uint32_t u) {
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(u));
      out += buf;
    };
    if (cp >= 0x10000) {
      unit(0xD800 + ((cp - 0x10000) >> 10));
      unit(0xDC00 + ((cp - 0x10000) & 0x3FF));
    } else {
      unit(cp);
    }
  }
  return out;
}

// select/reject/selectattr/rejectattr: (attr,) test name, test args.
Value select_like(const Value& v, const Args& a, bool with_attr, bool keep, const char* fn) {
  size_t i = 0;
  std::string attr;
  if (with_attr) {
    if (a.positional.empty() || !a.positional[0].is_string())
      value_fail(fn, "(): missing attribute name");
    attr = a.positional[0].str();
    i = 1;
  }
  std::string test;
  if (a.positional.size() > i) {
    if (!a.positional[i].is_string()) value_fail(fn, "(): the test name must be a string");
    test = a.positional[i].str();
    if (!has_test(test)) value_fail(fn, "(): no test named '", test, "'");
    ++i;
  }
  const Args targs = rest_args(a, i);
  List out;
  if (!truthy(v)) return Value::generator(std::move(out));  // jinja2: none or empty: nothing
  for (const Value& item : iterate(v)) {
    const Value x = with_attr ? attr_path(item, attr) : item;
    const bool pass = test.empty() ? truthy(x) : call_test(test, x, targs);
    if (pass == keep) out.push_back(item);
  }
  return Value::generator(std::move(out));
}

Value do_round(const Value& v, const Args& a) {
  const Bound b("round", a, {"precision", "method"});
  const int64_t precision = b.get(0) ? *b.integer(0) : 0;
  const std::string method = b.get(1) ? *b.str(1) : "common";
  if (method != "common" && method != "ceil" && method != "floor")
    value_fail("round(): method must be 'common', 'ceil' or 'floor'");
  if (!v.is_number()) value_fail("round(): a number is required, not ", v.type_name());
  if (method == "common") {
    // Python's round(): an int stays an int (at precision >= 0); a float rounds its exact binary
    // value to `precision` decimals, ties to even, which C's correctly rounded %.*f does too.
    if (!v.is_float() && precision >= 0) return Value(v.integer());
    if (precision < 0 || precision > 300) value_fail("round(): precision out of range");
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(precision), v.number());
    return Value(std::strtod(buf, nullptr));
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = v.number() * scale;
  return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

Value do_indent(const Value& v, const Args& a) {
  const Bound b("indent", a, {"width", "first", "blank"});
  std::string ind = "    ";
  if (const Value* w = b.get(0))
    ind = w->is_string()
              ? w->str()
              : std::string(static_cast<size_t>(std::max<int64_t>(0, *b.integer(0))), ' ');
  const bool first = truthy(b.get_or(1, Value(false))), blank = truthy(b.get_or(2, Value(false)));
  // jinja2 appends a newline before splitlines so that a trailing newline survives.
  const std::vector<std::string> lines = py_splitlines(to_str(v) + "\n", false);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i) out += "\n";
    if (i && (blank || !lines[i].empty())) out += ind;
    out += lines[i];
  }
  if (first) out = ind + out;
  return Value(std::move(out));
}

Value min_max(const Value& v, const Args& a, bool want_max) {
  const Bound b(want_max ? "max" : "min", a, {"case_sensitive", "attribute"});
  const bool cs = truthy(b.get_or(0, Value(false)));
  const std::optional<std::string> attr = b.str(1);
  const List items = iterate(v);
  if (items.empty()) return Value::undefined(cat("No aggregated item, sequence was empty."));
  size_t best = 0;
  auto key = [&](size_t i) { return sort_key(attr ? attr_path(items[i], *attr) : items[i], cs); };
  for (size_t i = 1; i < items.size(); ++i) {
    if (want_max ? less(key(best), key(i)) : less(key(i), key(best))) best = i;
  }
  return items[best];
}

Value do_sort(const Value& v, const Args& a) {
  const Bound b("sort", a, {"reverse", "case_sensitive", "attribute"});
  const bool rev = truthy(b.get_or(0, Value(false))), cs = truthy(b.get_or(1, Value(false)));
  const std::optional<std::string> attr = b.str(2);
  List items = iterate(v);
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& x : items) keyed.emplace_back(sort_key(attr ? attr_path(x, *attr) : x, cs), x);
  // Python's sort is stable, and reverse=True keeps equal items in their order.
  std::stable_sort(keyed.begin(), keyed.end(), [rev](const auto& p, const auto& q) {
    return rev ? less(q.first, p.first) : less(p.first, q.first);
  });
  List out;
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return Value::list(std::move(out));
}

Value do_dictsort(const Value& v, const Args& a) {
  const Bound b("dictsort", a, {"case_sensitive", "by", "reverse"});
  if (!v.is_dict()) value_fail("dictsort(): a dict is required, not ", v.type_name());
  const bool cs = truthy(b.get_or(0, Value(false)));
  const std::string by = b.get(1) ? *b.str(1) : "key";
  if (by != "key" && by != "value")
    value_fail("dictsort(): you can only sort by either 'key' or 'value'");
  const bool rev = truthy(b.get_or(2, Value(false)));
  std::vector<std::pair<Value, Value>> items = v.dict().items;
  const size_t k = by == "key" ? 0 : 1;
  std::stable_sort(items.begin(), items.end(), [&](const auto& p, const auto& q) {
    const Value& x = k == 0 ? p.first : p.second;
    const Value& y = k == 0 ? q.first : q.second;
    return rev ? less(sort_key(y, cs), sort_key(x, cs)) : less(sort_key(x, cs), sort_key(y, cs));
  });
  List out;
  for (auto& kv : items) out.push_back(Value::tuple({kv.first, kv.second}));
  return Value::list(std::move(out));
}

Value do_int(const Value& v, const Args& a) {
  const Bound b("int", a, {"default", "base"});
  const Value dflt = b.get_or(0, Value(int64_t{0}));
  const int64_t base = b.get(1) ? *b.integer(1) : 10;
  if (v.is_float()) {
    if (!std::isfinite(v.number()) || std::fabs(v.number()) > 9.2e18) return dflt;
    return Value(static_cast<int64_t>(v.number()));
  }
  if (v.is_number()) return Value(v.integer());
  if (v.is_string()) {
    const std::string s = py_strip(v.str(), std::nullopt, true, true);
    errno = 0;
    char* end = nullptr;
    const long long i = std::strtoll(s.c_str(), &end, static_cast<int>(base));
    if (!s.empty() && end == s.c_str() + s.size() && errno == 0)
      return Value(static_cast<int64_t>(i));
    // jinja2 falls back to int(float(s)).
    end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size() && std::isfinite(d) && std::fabs(d) < 9.2e18)
      return Value(static_cast<int64_t>(d));
  }
  return dflt;
}

Value do_float(const Value& v, const Args& a) {
  const Bound b("float", a, {"default"});
  const Value dflt = b.get_or(0, Value(0.0));
  if (v.is_number()) return Value(v.number());
  if (v.is_string()) {
    const std::string s = py_strip(v.str(), std::nullopt, true, true);
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size()) return Value(d);
  }
  return dflt;
}

Value do_map(const Value& v, const Args& a) {
  const List items = truthy(v) ? iterate(v) : List();  // jinja2 maps none or empty to nothing
  List out;
  if (a.positional.empty()) {
    const Bound b("map", a, {"attribute", "default"});
    if (!b.get(0)) value_fail("map(): needs a filter name or attribute=");
    const std::string attr = b.get(0)->is_string() ? b.get(0)->str() : to_str(*b.get(0));
    for (const Value& x : items) {
      Value y = attr_path(x, attr);
      if (y.is_undefined() && b.get(1)) y = *b.get(1);
      out.push_back(std::move(y));
    }
  } else {
    if (!a.positional[0].is_string()) value_fail("map(): the filter name must be a string");
    const std::string name = a.positional[0].str();
    if (!has_filter(name)) value_fail("map(): no filter named '", name, "'");
    const Args fargs = rest_args(a, 1);
    for (const Value& x : items) out.push_back(call_filter(name, x, fargs));
  }
  return Value::generator(std::move(out));
}

Value do_join(const Value& v, const Args& a) {
  const Bound b("join", a, {"d", "attribute"});
  const std::string sep = b.get(0) ? to_str(*b.get(0)) : "";
  const std::optional<std::string> attr =
      b.get(1) ? std::optional(to_str(*b.get(1))) : std::nullopt;
  std::string out;
  bool first = true;
  for (const Value& x : iterate(v)) {
    if (!first) out += sep;
    first = false;
    out += to_str(attr ? attr_path(x, *attr) : x);
    if (out.size() > kMaxValueBytes) value_fail("join(): result too large");
  }
  return Value(std::move(out));
}

Value do_tojson(const Value& v, const Args& a) {
  const Bound b("tojson", a, {"ensure_ascii", "indent", "separators", "sort_keys"});
  if (b.get(2) && !b.get(2)->is_none())
    value_fail("tojson(): separators other than the default are not supported");
  int indent = -1;
  if (const Value* i = b.get(1); i && !i->is_none()) {
    if (!i->is_int() || i->integer() < 0 || i->integer() > 64)
      value_fail("tojson(): indent must be an int from 0 to 64");
    indent = static_cast<int>(i->integer());
  }
  std::string json = to_json(v, indent, truthy(b.get_or(3, Value(false))));
  if (b.get(0) && truthy(*b.get(0))) json = ascii_json(json);
  return Value(std::move(json));
}

Value do_unique(const Value& v, const Args& a) {
  const Bound b("unique", a, {"case_sensitive", "attribute"});
  const bool cs = truthy(b.get_or(0, Value(false)));
  const std::optional<std::string> attr = b.str(1);
  List out, seen;
  for (const Value& x : iterate(v)) {
    const Value k = sort_key(attr ? attr_path(x, *attr) : x, cs);
    bool dup = false;
    for (const Value& s : seen) dup = dup || equal(s, k);
    if (!dup) {
      seen.push_back(k);
      out.push_back(x);
    }
  }
  return Value::generator(std::move(out));
}

Value do_batch(const Value& v, const Args& a) {
  const Bound b("batch", a, {"linecount", "fill_with"});
  const int64_t n = b.get(0) ? *b.integer(0) : 0;
  if (n <= 0) value_fail("batch(): linecount must be positive");
  List out, cur;
  for (const Value& x : iterate(v)) {
    cur.push_back(x);
    if (static_cast<int64_t>(cur.size()) == n) {
      out.push_back(Value::list(std::move(cur)));
      cur.clear();
    }
  }
  if (!cur.empty()) {
    if (b.get(1))
      while (static_cast<int64_t>(cur.size()) < n) cur.push_back(*b.get(1));
    out.push_back(Value::list(std::move(cur)));
  }
  return Value::list(std::move(out));
}

Value do_center(const Value& v, const Args& a) {
  const Bound b("center", a, {"width"});
  const int64_t width = b.get(0) ? *b.integer(0) : 80;
  const std::string s = to_str(v);
  const int64_t n = code_point_count(s);
  if (width <= n) return Value(s);
  if (width > 1 << 20) value_fail("center(): width too large");
  // Python's str.center puts the odd space on the right when the length is even... as
  // left = pad / 2 + (pad & width & 1).
  const int64_t pad = width - n, left = pad / 2 + (pad & width & 1);
  return Value(std::string(static_cast<size_t>(left), ' ') + s +
               std::string(static_cast<size_t>(pad - left), ' '));
}

Value do_sum(const Value& v, const Args& a) {
  const Bound b("sum", a, {"attribute", "start"});
  const std::optional<std::string> attr =
      b.get(0) ? std::optional(to_str(*b.get(0))) : std::nullopt;
  Value total = b.get_or(1, Value(int64_t{0}));
  for (const Value& x : iterate(v)) total = binary_op("+", total, attr ? attr_path(x, *attr) : x);
  return total;
}

Value do_wordcount(const Value& v) {
  // len(re.findall(r"\w+", s)): runs of letters, digits and underscores (non-ASCII counted as
  // word characters).
  int64_t n = 0;
  bool in_word = false;
  for (char c : to_str(v)) {
    const unsigned char u = c;
    const bool w = u >= 0x80 || (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
                   (c >= 'A' && c <= 'Z') || c == '_';
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}

Value do_truncate(const Value& v, const Args& a) {
  const Bound b("truncate", a, {"length", "killwords", "end", "leeway"});
  const int64_t length = b.get(0) ? *b.integer(0) : 255;
  const bool killwords = truthy(b.get_or(1, Value(false)));
  const std::string end = b.get(2) ? *b.str(2) : "...";
  const int64_t leeway = b.get(3) ? *b.integer(3) : 5;
  const std::string s = to_str(v);
  const std::vector<size_t> offs = code_point_offsets(s);
  const int64_t n = static_cast<int64_t>(offs.size()) - 1;
  const int64_t end_n = code_point_count(end);
  if (length < end_n) value_fail("truncate(): expected length >= ", end_n, ", got ", length);
  if (n <= length + leeway) return Value(s);
  std::string head = s.substr(0, offs[static_cast<size_t>(length - end_n)]);
  if (killwords) return Value(head + end);
  const size_t sp = head.rfind(' ');
  if (sp != std::string::npos) head.resize(sp);
  return Value(head + end);
}

using FilterFn = Value (*)(const Value&, const Args&);

Value no_args(std::string_view name, const Args& a) {
  const Bound b(name, a, {});
  return Value();
}

struct FilterEntry {
  const char* name;
  FilterFn fn;
};

const FilterEntry kFilters[] = {
    {"abs",
     [](const Value& v, const Args& a) {
       no_args("abs", a);
       if (v.is_float()) return Value(std::fabs(v.number()));
       if (!v.is_number()) value_fail("bad operand type for abs(): '", v.type_name(), "'");
       return v.integer() < 0 ? negate(v) : Value(v.integer());
     }},
    {"attr",
     [](const Value& v, const Args& a) {
       const Bound b("attr", a, {"name"});
       return get_attr(v, b.str(0).value_or(""));
     }},
    {"batch", do_batch},
    {"capitalize",
     [](const Value& v, const Args& a) {
       no_args("capitalize", a);
       return Value(py_capitalize(to_str(v)));
     }},
    {"center", do_center},
    {"count",
     [](const Value& v, const Args& a) {
       no_args("count", a);
       return Value(length(v));
     }},
    {"d",
     [](const Value& v, const Args& a) {
       const Bound b("default", a, {"default_value", "boolean"});
       const bool boolean = truthy(b.get_or(1, Value(false)));
       if (v.is_undefined() || (boolean && !truthy(v))) return b.get_or(0, Value(""));
       return v;
     }},
    {"default", nullptr},  // same as "d"; resolved in call_filter
    {"dictsort", do_dictsort},
    {"e",
     [](const Value& v, const Args& a) {
       no_args("escape", a);
       return v.is_markup() ? v : Value::markup(html_escape(to_str(v)));
     }},
    {"escape", nullptr},
    {"first",
     [](const Value& v, const Args& a) {
       no_args("first", a);
       const List items = iterate(v);
       return items.empty() ? Value::undefined("No first item, sequence was empty.") : items[0];
     }},
    {"float", do_float},
    {"forceescape", nullptr},
    {"format",
     [](const Value& v, const Args& a) {
       if (!a.keyword.empty() && !a.positional.empty())
         value_fail("format(): can't handle positional and keyword arguments at the same time");
       if (!a.keyword.empty()) {
         Dict d;
         for (const auto& [k, x] : a.keyword) d.set(Value(k), x);
         return Value(percent_format(to_str(v), Value::dict(std::move(d))));
       }
       return Value(percent_format(to_str(v), Value::tuple(a.positional)));
     }},
    {"int", do_int},
    {"indent", do_indent},
    {"items",
     [](const Value& v, const Args& a) {
       no_args("items", a);
       if (v.is_undefined()) return Value::generator({});
       if (!v.is_dict())
         value_fail("items(): can only get item pairs from a mapping, not ", v.type_name());
       List out;
       for (const auto& [k, x] : v.dict().items) out.push_back(Value::tuple({k, x}));
       return Value::generator(std::move(out));
     }},
    {"join", do_join},
    {"last",
     [](const Value& v, const Args& a) {
       no_args("last", a);
       if (v.is_generator()) value_fail("'generator' object is not reversible");
       const List items = iterate(v);
       return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
     }},
    {"length", nullptr},
    {"list",
     [](const Value& v, const Args& a) {
       no_args("list", a);
       return Value::list(iterate(v));
     }},
    {"lower",
     [](const Value& v, const Args& a) {
       no_args("lower", a);
       return Value(py_lower(to_str(v)));
     }},
    {"map", do_map},
    {"max", [](const Value& v, const Args& a) { return min_max(v, a, true); }},
    {"min", [](const Value& v, const Args& a) { return min_max(v, a, false); }},
    {"reject",
     [](const Value& v, const Args& a) { return select_like(v, a, false, false, "reject"); }},
    {"rejectattr",
     [](const Value& v, const Args& a) { return select_like(v, a, true, false, "rejectattr"); }},
    {"replace",
     [](const Value& v, const Args& a) {
       const Bound b("replace", a, {"old", "new", "count"});
       if (!b.get(1)) value_fail("replace(): needs old and new");
       return Value(py_replace(to_str(v), to_str(*b.get(0)), to_str(*b.get(1)),
                               b.get(2) && !b.get(2)->is_none() ? *b.integer(2) : -1));
     }},
    {"reverse",
     [](const Value& v, const Args& a) {
       no_args("reverse", a);
       if (v.is_string()) return get_slice(v, Value(), Value(), Value(int64_t{-1}));
       List items = iterate(v);
       std::reverse(items.begin(), items.end());
       return Value::list(std::move(items));
     }},
    {"round", do_round},
    {"safe",
     [](const Value& v, const Args& a) {
       no_args("safe", a);
       return v.is_markup() ? v : Value::markup(to_str(v));
     }},
    {"select",
     [](const Value& v, const Args& a) { return select_like(v, a, false, true, "select"); }},
    {"selectattr",
     [](const Value& v, const Args& a) { return select_like(v, a, true, true, "selectattr"); }},
    {"sort", do_sort},
    {"string",
     [](const Value& v, const Args& a) {
       no_args("string", a);
       return Value(to_str(v));
     }},
    {"sum", do_sum},
    {"title",
     [](const Value& v, const Args& a) {
       no_args("title", a);
       return Value(jinja_title(to_str(v)));
     }},
    {"tojson", do_tojson},
    {"trim",
     [](const Value& v, const Args& a) {
       const Bound b("trim", a, {"chars"});
       std::optional<std::string> chars;
       if (b.get(0) && !b.get(0)->is_none()) chars = b.str(0);
       return Value(py_strip(to_str(v), chars, true, true));
     }},
    {"truncate", do_truncate},
    {"unique", do_unique},
    {"upper",
     [](const Value& v, const Args& a) {
       no_args("upper", a);
       return Value(py_upper(to_str(v)));
     }},
    {"wordcount",
     [](const Value& v, const Args& a) {
       no_args("wordcount", a);
       return do_wordcount(v);
     }},
};

std::string_view canonical_filter(std::string_view name) {
  if (name == "default") return "d";
  if (name == "escape" || name == "forceescape") return "e";
  if (name == "length") return "count";
  return name;
}

const FilterEntry* find_filter(std::string_view name) {
  name = canonical_filter(name);
  for (const FilterEntry& f : kFilters)
    if (name == f.name && f.fn) return &f;
  return nullptr;
}

bool integer_test(const Value& v, const char* test) {
  if (!v.is_int() && !v.is_bool())
    value_fail("test '", test, "' needs an integer, not ", v.type_name());
  return true;
}

}  // namespace

bool has_filter(std::string_view name) {
  return find_filter(name) != nullptr;
}

Value call_filter(std::string_view name, const Value& v, const Args& args) {
  const FilterEntry* f = find_filter(name);
  if (!f) value_fail("no filter named '", name, "'");
  return f->fn(v, args);
}

namespace {
const char* const kTests[] = {"defined",     "undefined", "none",        "string",   "number",
                              "integer",     "float",     "mapping",     "iterable", "sequence",
                              "boolean",     "true",      "false",       "odd",      "even",
                              "divisibleby", "eq",        "equalto",     "==",       "ne",
                              "!=",          "lt",        "lessthan",    "<",        "le",
                              "<=",          "gt",        "greaterthan", ">",        "ge",
                              ">=",          "in",        "sameas",      "callable", "lower",
                              "upper",       "escaped",   "filter",      "test"};
}  // namespace

bool has_test(std::string_view name) {
  for (const char* t : kTests)
    if (name == t) return true;
  return false;
}

bool call_test(std::string_view name, const Value& v, const Args& a) {
  const std::string fn = cat("test '", name, "'");
  auto other = [&]() -> const Value& {
    if (a.positional.size() != 1 || !a.keyword.empty()) value_fail(fn, " takes one argument");
    return a.positional[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.boolean();
  if (name == "false") return v.is_bool() && !v.boolean();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable")
    return v.is_undefined() || v.is_string() || v.is_sequence() || v.is_dict();
  if (name == "sequence")
    return v.is_string() || (v.is_sequence() && !v.is_generator()) || v.is_dict();
  if (name == "callable") return v.is_callable();
  if (name == "escaped") return false;
  if (name == "odd") return integer_test(v, "odd") && (v.integer() % 2 != 0);
  if (name == "even") return integer_test(v, "even") && (v.integer() % 2 == 0);
  if (name == "divisibleby") {
    const Value& d = other();
    integer_test(v, "divisibleby");
    integer_test(d, "divisibleby");
    if (d.integer() == 0) value_fail("integer division or modulo by zero");
    return d.integer() == -1 || v.integer() % d.integer() == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return equal(v, other());
  if (name == "ne" || name == "!=") return !equal(v, other());
  if (name == "lt" || name == "lessthan" || name == "<") return less(v, other());
  if (name == "le" || name == "<=") return !less(other(), v);
  if (name == "gt" || name == "greaterthan" || name == ">") return less(other(), v);
  if (name == "ge" || name == ">=") return !less(v, other());
  if (name == "in") return contains(other(), v);
  if (name == "sameas") {
    const Value& o = other();
    if (v.kind() != o.kind()) return false;
    if (v.is_none() || v.is_undefined()) return true;
    if (v.is_bool() || v.is_int()) return v.integer() == o.integer();
    return v.identity() == o.identity() && v.identity() != nullptr;
  }
  if (name == "lower" || name == "upper") {
    const std::string s = to_str(v);
    bool cased = false;
    for (char c : s) {
      if (name == "lower" && c >= 'A' && c <= 'Z') return false;
      if (name == "upper" && c >= 'a' && c <= 'z') return false;
      cased = cased || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    }
    return cased;
  }
  if (name == "filter") return other().is_string() && has_filter(other().str());
  if (name == "test") return other().is_string() && has_test(other().str());
  value_fail("no test named '", name, "'");
}

}  // namespace tessera::jinja
