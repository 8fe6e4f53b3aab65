// Built-in filters, tests, attribute and item access, and the str/list/dict methods templates
// call (filters.cc, methods.cc), and the Python operators (operators.cc). Internal to
// the renderer. Each throws ValueError (no position); the evaluator adds line and column.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "jinja/value.h"

namespace tessera::jinja {

// Limits the value operations keep to, so hostile templates fail instead of exhausting memory.
inline constexpr size_t kMaxValueBytes = size_t{1} << 28;  // one string or list: 256 MiB
inline constexpr int64_t kMaxRange = 100000;               // jinja2 sandbox's MAX_RANGE

// Binds a call's arguments to Python-style parameter names, in order; fails on too many
// positional arguments, unknown or repeated keywords (naming the function).
class Bound {
 public:
  Bound(std::string_view fn, const Args& args, std::initializer_list<const char*> names);
  const Value* get(size_t i) const { return i < values_.size() ? values_[i] : nullptr; }
  Value get_or(size_t i, Value fallback) const { return get(i) ? *get(i) : fallback; }
  // The argument as a str / int / bool, failing naming the function and parameter otherwise.
  std::optional<std::string> str(size_t i) const;
  std::optional<int64_t> integer(size_t i) const;

 private:
  std::string fn_;
  std::vector<const char*> names_;
  std::vector<const Value*> values_;
};

bool has_filter(std::string_view name);
bool has_test(std::string_view name);
Value call_filter(std::string_view name, const Value& v, const Args& args);
bool call_test(std::string_view name, const Value& v, const Args& args);

// jinja2's getattr: a method of str/list/dict when the name is one, else the dict key / object
// attribute; undefined (with jinja2's hint) when there is none. Fails on undefined.
Value get_attr(const Value& obj, const std::string& name);
// jinja2's getitem: obj[key] first (negative indexes count from the end), then the attribute
// of that name; undefined when neither exists.
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step] on a string, list or tuple, with Python's clamping.
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// The items a for loop (or a filter) walks: a list's items, a dict's keys, a string's
// characters; undefined gives none. Fails on anything else.
List iterate(const Value& v);

// Python's binary operators: + - * / // % ** and ~ (str concat), `in`.
Value binary_op(std::string_view op, const Value& a, const Value& b);
bool contains(const Value& container, const Value& item);
Value negate(const Value& v);

}  // namespace tessera::jinja
