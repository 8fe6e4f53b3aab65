// The values a Jinja chat template computes with, modelled on the Python objects jinja2 sees:
// undefined, None, bool, int, float, str, list, tuple, dict (insertion ordered), callables and
// attribute objects (namespace(), loop). Strings are UTF-8 bytes; operations that Python defines
// per code point (len, indexing, slicing) decode them (py_string.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"

namespace tessera::jinja {

class Value;
using List = std::vector<Value>;

// A failure inside a value operation, without a template position: the evaluator catches it at
// the expression that caused it and rethrows a tessera::Error naming line and column.
struct ValueError {
  std::string message;
};
template <typename... Args>
[[noreturn]] void value_fail(Args&&... args);

// Python's dict: keys compare with Python == (1, 1.0 and True are one key), order is insertion
// order. Lookups are linear: chat template dicts (messages, tool schemas) are small.
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(Value key, Value value);  // replaces in place, else appends
};

// Positional and keyword arguments of a call.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

struct Callable {
  std::string name;
  std::function<Value(Args&)> fn;
};

// An object with attributes: jinja2's Namespace (mutable: `{% set ns.x = 1 %}`) and the loop
// variable. Shared by reference, as Python objects are.
struct Object {
  std::string type;  // "Namespace", "LoopContext"
  bool settable = false;
  std::vector<std::pair<std::string, Value>> attrs;
  const Value* find(std::string_view name) const;
  void set(const std::string& name, Value v);
};

class Value {
 public:
  enum class Kind {
    undefined,
    none,
    boolean,
    integer,
    floating,
    string,
    list,
    tuple,
    dict,
    callable,
    object
  };

  Value() = default;  // undefined
  Value(std::nullptr_t) : kind_(Kind::none) {}
  Value(bool b) : kind_(Kind::boolean), i_(b) {}
  Value(int v) : kind_(Kind::integer), i_(v) {}
  Value(int64_t v) : kind_(Kind::integer), i_(v) {}
  Value(double d) : kind_(Kind::floating), d_(d) {}
  Value(std::string s)
      : kind_(Kind::string), p_(std::make_shared<const std::string>(std::move(s))) {}
  Value(const char* s) : Value(std::string(s)) {}
  Value(std::string_view s) : Value(std::string(s)) {}

  // An undefined value; `hint` is what jinja2 reports when it is used ("'x' is undefined").
  static Value undefined(std::string hint);
  // A string marked safe (markupsafe's Markup: the safe and escape filters make one): adding a
  // plain string to it, on either side, HTML-escapes the plain one.
  static Value markup(std::string s) {
    Value v(std::move(s));
    v.i_ = 1;
    return v;
  }
  static Value none() { return Value(nullptr); }
  static Value list(List items);
  // What jinja2's select/reject/selectattr/rejectattr/map/unique/items filters return: a Python
  // generator. It iterates as a list does, but is always true; it has no length, no JSON and no
  // reverse (refused as in Python), its items are undefined (jinja2's getitem), and printing it,
  // which in jinja2 prints its address, is refused. Being consumed by a first iteration is not
  // modelled.
  static Value generator(List items) {
    Value v = list(std::move(items));
    v.generator_ = true;
    return v;
  }
  static Value tuple(List items);
  static Value dict(Dict d);
  static Value callable(std::string name, std::function<Value(Args&)> fn);
  static Value object(std::shared_ptr<Object> o);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::undefined; }
  bool is_none() const { return kind_ == Kind::none; }
  bool is_bool() const { return kind_ == Kind::boolean; }
  bool is_int() const { return kind_ == Kind::integer; }
  bool is_float() const { return kind_ == Kind::floating; }
  // bool counts as a number, as in Python (True + 1 == 2).
  bool is_number() const { return kind_ == Kind::boolean || is_int() || is_float(); }
  bool is_string() const { return kind_ == Kind::string; }
  bool is_markup() const { return kind_ == Kind::string && i_ != 0; }
  bool is_generator() const { return generator_; }
  bool is_list() const { return kind_ == Kind::list; }
  bool is_tuple() const { return kind_ == Kind::tuple; }
  bool is_sequence() const { return is_list() || is_tuple(); }  // list or tuple
  bool is_dict() const { return kind_ == Kind::dict; }
  bool is_callable() const { return kind_ == Kind::callable; }
  bool is_object() const { return kind_ == Kind::object; }

  bool boolean() const { return i_ != 0; }
  int64_t integer() const { return i_; }  // also a bool's 0/1 (a container's nesting depth)
  double number() const { return is_float() ? d_ : static_cast<double>(i_); }
  const std::string& str() const { return *static_cast<const std::string*>(p_.get()); }
  const List& items() const { return *static_cast<const List*>(p_.get()); }
  const Dict& dict() const { return *static_cast<const Dict*>(p_.get()); }
  const Callable& callable() const { return *static_cast<const Callable*>(p_.get()); }
  Object& object() const { return *static_cast<Object*>(const_cast<void*>(p_.get())); }
  const std::string& undefined_hint() const;
  // Identity of shared values (for `is sameas` and Python's `is` on objects).
  const void* identity() const { return p_.get(); }

  // Python's type name as jinja2 messages write it ("str", "int", "list", "dict object", ...).
  std::string type_name() const;

 private:
  Kind kind_ = Kind::undefined;
  int64_t i_ = 0;
  double d_ = 0;
  bool generator_ = false;
  std::shared_ptr<const void> p_;  // string, List, Dict, Callable, Object, undefined hint
};

template <typename... Args>
[[noreturn]] void value_fail(Args&&... args) {
  throw ValueError{cat(std::forward<Args>(args)...)};
}

// Python truthiness: "", [], {}, 0, 0.0, None, False and undefined are false.
bool truthy(const Value& v);
// Python ==: numbers across int/float/bool, lists and tuples never equal each other, dicts
// ignore order, undefined equals undefined only.
bool equal(const Value& a, const Value& b);
// Python's <: numbers, strings (code point order), lists/tuples lexicographic; anything else
// fails naming both types.
bool less(const Value& a, const Value& b);
// Python's str(): None -> "None", True -> "True", 1.0 -> "1.0", lists as their repr; undefined
// prints as "" (jinja2's default Undefined).
std::string to_str(const Value& v);
// Python's repr(): strings quoted as Python quotes them.
std::string repr(const Value& v);
// json.dumps(v, ensure_ascii=False, indent=indent (< 0: None), sort_keys) as transformers' tojson
// filter calls it; fails on undefined, callables and objects.
std::string to_json(const Value& v, int indent, bool sort_keys);
// Python's len(): code points of a string, items of a list/tuple/dict; undefined has 0.
int64_t length(const Value& v);

// JSON values as jinja2 sees json.loads output: objects keep their key order (with
// nlohmann::json, whose objects are sorted by key, that order is the sorted one).
Value from_json(const nlohmann::json& j);
Value from_json(const nlohmann::ordered_json& j);

}  // namespace tessera::jinja
