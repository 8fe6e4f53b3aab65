// Python semantics of the Jinja value type: truthiness, ==, <, str(), repr(), json.dumps, len().
#include "jinja/value.h"

#include <algorithm>
#include <cmath>

#include "jinja/py_string.h"

namespace tessera::jinja {

const Value* Dict::find(const Value& key) const {
  for (const auto& kv : items)
    if (equal(kv.first, key)) return &kv.second;
  return nullptr;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& kv : items)
    if (kv.first.is_string() && kv.first.str() == key) return &kv.second;
  return nullptr;
}

void Dict::set(Value key, Value value) {
  for (auto& kv : items)
    if (equal(kv.first, key)) {
      kv.second = std::move(value);
      return;
    }
  items.emplace_back(std::move(key), std::move(value));
}

const Value* Object::find(std::string_view name) const {
  for (const auto& kv : attrs)
    if (kv.first == name) return &kv.second;
  return nullptr;
}

void Object::set(const std::string& name, Value v) {
  for (auto& kv : attrs)
    if (kv.first == name) {
      kv.second = std::move(v);
      return;
    }
  attrs.emplace_back(name, std::move(v));
}

Value Value::undefined(std::string hint) {
  Value v;
  if (!hint.empty()) v.p_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

namespace {

// Containers record how deep they nest (in the otherwise unused integer slot) so that a
// template building nested lists in a loop fails here instead of overflowing the stack when the
// value is printed, compared or destroyed.
constexpr int64_t kMaxNesting = 1000;

int64_t nesting(const Value& v) {
  return v.is_sequence() || v.is_dict() ? v.integer() : 0;
}

int64_t check_nesting(int64_t children) {
  if (children + 1 > kMaxNesting)
    value_fail("a list or dict nested deeper than ", kMaxNesting, " levels");
  return children + 1;
}

}  // namespace

Value Value::list(List items) {
  int64_t deepest = 0;
  for (const Value& x : items) deepest = std::max(deepest, nesting(x));
  Value v;
  v.i_ = check_nesting(deepest);
  v.kind_ = Kind::list;
  v.p_ = std::make_shared<const List>(std::move(items));
  return v;
}

Value Value::tuple(List items) {
  Value v = list(std::move(items));
  v.kind_ = Kind::tuple;
  return v;
}

Value Value::dict(Dict d) {
  int64_t deepest = 0;
  for (const auto& kv : d.items)
    deepest = std::max({deepest, nesting(kv.first), nesting(kv.second)});
  Value v;
  v.i_ = check_nesting(deepest);
  v.kind_ = Kind::dict;
  v.p_ = std::make_shared<const Dict>(std::move(d));
  return v;
}

Value Value::callable(std::string name, std::function<Value(Args&)> fn) {
  Value v;
  v.kind_ = Kind::callable;
  v.p_ = std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

Value Value::object(std::shared_ptr<Object> o) {
  Value v;
  v.kind_ = Kind::object;
  v.p_ = std::move(o);
  return v;
}

const std::string& Value::undefined_hint() const {
  static const std::string kNone = "value is undefined";
  return p_ ? *static_cast<const std::string*>(p_.get()) : kNone;
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::undefined:
      return "Undefined";
    case Kind::none:
      return "NoneType";
    case Kind::boolean:
      return "bool";
    case Kind::integer:
      return "int";
    case Kind::floating:
      return "float";
    case Kind::string:
      return "str";
    case Kind::list:
      return generator_ ? "generator" : "list";
    case Kind::tuple:
      return "tuple";
    case Kind::dict:
      return "dict";
    case Kind::callable:
      return "function";
    case Kind::object:
      return object().type;
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::undefined:
    case Value::Kind::none:
      return false;
    case Value::Kind::boolean:
    case Value::Kind::integer:
      return v.integer() != 0;
    case Value::Kind::floating:
      return v.number() != 0.0;
    case Value::Kind::string:
      return !v.str().empty();
    case Value::Kind::list:
    case Value::Kind::tuple:
      return v.is_generator() || !v.items().empty();
    case Value::Kind::dict:
      return !v.dict().items.empty();
    case Value::Kind::callable:
    case Value::Kind::object:
      return true;
  }
  return false;
}

namespace {

// Values built by a template can nest without bound ({% set ns.x = [ns.x] %} in a loop); the
// comparisons stop at a depth instead of overflowing the stack.
constexpr int kMaxCompareDepth = 1000;

bool equal_at(const Value& a, const Value& b, int depth);
bool less_at(const Value& a, const Value& b, int depth);

}  // namespace

bool equal(const Value& a, const Value& b) {
  return equal_at(a, b, 0);
}
bool less(const Value& a, const Value& b) {
  return less_at(a, b, 0);
}

namespace {

bool equal_at(const Value& a, const Value& b, int depth) {
  if (depth > kMaxCompareDepth) value_fail("comparison: values nested too deeply");
  // A generator equals only itself (Python compares it by identity).
  if (a.is_generator() || b.is_generator()) return a.identity() == b.identity();
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.number() == b.number();
    return a.integer() == b.integer();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::undefined:
    case Value::Kind::none:
      return true;
    case Value::Kind::string:
      return a.str() == b.str();
    case Value::Kind::list:
    case Value::Kind::tuple: {
      const List &x = a.items(), &y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!equal_at(x[i], y[i], depth + 1)) return false;
      return true;
    }
    case Value::Kind::dict: {
      const Dict &x = a.dict(), &y = b.dict();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* w = y.find(k);
        if (!w || !equal_at(v, *w, depth + 1)) return false;
      }
      return true;
    }
    default:
      return a.identity() == b.identity();
  }
}

bool less_at(const Value& a, const Value& b, int depth) {
  if (depth > kMaxCompareDepth) value_fail("comparison: values nested too deeply");
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.number() < b.number();
    return a.integer() < b.integer();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();  // UTF-8 order is code point order
  if (a.kind() == b.kind() && a.is_sequence()) {
    const List &x = a.items(), &y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equal_at(x[i], y[i], depth + 1)) return less_at(x[i], y[i], depth + 1);
    }
    return x.size() < y.size();
  }
  value_fail("'<' not supported between instances of '", a.type_name(), "' and '", b.type_name(),
             "'");
}

void repr_into(const Value& v, std::string* out, int depth);

void items_repr(const List& items, std::string* out, int depth) {
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) *out += ", ";
    repr_into(items[i], out, depth + 1);
  }
}

void repr_into(const Value& v, std::string* out, int depth) {
  if (depth > 200) value_fail("repr: value nested too deeply");
  switch (v.kind()) {
    case Value::Kind::string:
      *out += py_repr_string(v.str());
      return;
    case Value::Kind::list:
      *out += '[';
      items_repr(v.items(), out, depth);
      *out += ']';
      return;
    case Value::Kind::tuple:
      *out += '(';
      items_repr(v.items(), out, depth);
      if (v.items().size() == 1) *out += ',';
      *out += ')';
      return;
    case Value::Kind::dict: {
      *out += '{';
      bool first = true;
      for (const auto& [k, x] : v.dict().items) {
        if (!first) *out += ", ";
        first = false;
        repr_into(k, out, depth + 1);
        *out += ": ";
        repr_into(x, out, depth + 1);
      }
      *out += '}';
      return;
    }
    case Value::Kind::object: {
      const Object& o = v.object();
      if (o.type == "Namespace") {
        *out += "<Namespace {";
        bool first = true;
        for (const auto& [k, x] : o.attrs) {
          if (!first) *out += ", ";
          first = false;
          *out += py_repr_string(k) + ": ";
          repr_into(x, out, depth + 1);
        }
        *out += "}>";
      } else {
        *out += "<" + o.type + " object>";
      }
      return;
    }
    case Value::Kind::undefined:
      *out += "Undefined";
      return;
    default:
      *out += to_str(v);
  }
}

void json_into(const Value& v, int indent, bool sort_keys, int level, std::string* out) {
  if (level > 200) value_fail("tojson: value nested too deeply");
  if (v.is_generator()) value_fail("Object of type generator is not JSON serializable");
  // json.dumps: indent=None gives ", " and ": "; an indent gives "," plus a newline and ": ".
  auto newline = [&](int lvl) {
    if (indent >= 0) *out += "\n" + std::string(static_cast<size_t>(indent * lvl), ' ');
  };
  const char* item_sep = indent >= 0 ? "," : ", ";
  switch (v.kind()) {
    case Value::Kind::none:
      *out += "null";
      return;
    case Value::Kind::boolean:
      *out += v.boolean() ? "true" : "false";
      return;
    case Value::Kind::integer:
      *out += std::to_string(v.integer());
      return;
    case Value::Kind::floating: {
      const double d = v.number();
      *out += std::isnan(d)   ? "NaN"
              : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity")
                              : py_float_repr(d);
      return;
    }
    case Value::Kind::string:
      *out += json_quote(v.str());
      return;
    case Value::Kind::list:
    case Value::Kind::tuple: {
      const List& items = v.items();
      if (items.empty()) {
        *out += "[]";
        return;
      }
      *out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) *out += item_sep;
        newline(level + 1);
        json_into(items[i], indent, sort_keys, level + 1, out);
      }
      newline(level);
      *out += ']';
      return;
    }
    case Value::Kind::dict: {
      std::vector<std::pair<std::string, const Value*>> entries;
      for (const auto& [k, x] : v.dict().items) {
        // json.dumps turns None/bool/int/float keys into their JSON text; other keys fail.
        std::string key;
        if (k.is_string())
          key = k.str();
        else if (k.is_none())
          key = "null";
        else if (k.is_bool())
          key = k.boolean() ? "true" : "false";
        else if (k.is_int())
          key = std::to_string(k.integer());
        else if (k.is_float())
          key = py_float_repr(k.number());
        else
          value_fail("tojson: keys must be str, int, float, bool or None, not ", k.type_name());
        entries.emplace_back(std::move(key), &x);
      }
      if (entries.empty()) {
        *out += "{}";
        return;
      }
      if (sort_keys)
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      *out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) *out += item_sep;
        newline(level + 1);
        *out += json_quote(entries[i].first) + ": ";
        json_into(*entries[i].second, indent, sort_keys, level + 1, out);
      }
      newline(level);
      *out += '}';
      return;
    }
    case Value::Kind::undefined:
      value_fail("tojson: Object of type Undefined is not JSON serializable (", v.undefined_hint(),
                 ")");
    default:
      value_fail("tojson: Object of type ", v.type_name(), " is not JSON serializable");
  }
}

template <typename J>
Value from_json_impl(const J& j, int depth) {
  if (depth > 512) value_fail("JSON input nested deeper than 512 levels");
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const uint64_t u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (const auto& x : j) items.push_back(from_json_impl(x, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it)
        d.items.emplace_back(Value(it.key()), from_json_impl(it.value(), depth + 1));
      return Value::dict(std::move(d));
    }
    default:
      return Value::none();  // binary and discarded values do not come from JSON text
  }
}

}  // namespace

std::string to_str(const Value& v) {
  // jinja2 prints <generator object ... at 0x...>: refused rather than guessed.
  if (v.is_generator()) value_fail("cannot print a generator (apply |list first)");
  switch (v.kind()) {
    case Value::Kind::undefined:
      return "";
    case Value::Kind::none:
      return "None";
    case Value::Kind::boolean:
      return v.boolean() ? "True" : "False";
    case Value::Kind::integer:
      return std::to_string(v.integer());
    case Value::Kind::floating:
      return py_float_repr(v.number());
    case Value::Kind::string:
      return v.str();
    case Value::Kind::callable:
      return "<function " + v.callable().name + ">";
    default: {
      std::string out;
      repr_into(v, &out, 0);
      return out;
    }
  }
}

std::string repr(const Value& v) {
  std::string out;
  repr_into(v, &out, 0);
  return out;
}

std::string to_json(const Value& v, int indent, bool sort_keys) {
  std::string out;
  json_into(v, indent, sort_keys, 0, &out);
  return out;
}

int64_t length(const Value& v) {
  if (v.is_generator()) value_fail("object of type 'generator' has no len()");
  switch (v.kind()) {
    case Value::Kind::undefined:
      return 0;
    case Value::Kind::string:
      return code_point_count(v.str());
    case Value::Kind::list:
    case Value::Kind::tuple:
      return static_cast<int64_t>(v.items().size());
    case Value::Kind::dict:
      return static_cast<int64_t>(v.dict().items.size());
    case Value::Kind::object:
      if (v.object().type == "Namespace") break;
      return static_cast<int64_t>(v.object().attrs.size());
    default:
      break;
  }
  value_fail("object of type '", v.type_name(), "' has no len()");
}

Value from_json(const nlohmann::json& j) {
  return from_json_impl(j, 0);
}
Value from_json(const nlohmann::ordered_json& j) {
  return from_json_impl(j, 0);
}

}  // namespace tessera::jinja
