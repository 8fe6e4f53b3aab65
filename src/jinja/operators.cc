// Python's arithmetic, concatenation and membership on Jinja values. Integers are 64-bit: where
// Python would grow a big integer the operation fails naming the overflow.
#include <cmath>

#include "jinja/builtins.h"
#include "jinja/py_string.h"

namespace tessera::jinja {
namespace {

[[noreturn]] void unsupported(std::string_view op, const Value& a, const Value& b) {
  value_fail("unsupported operand type(s) for ", op, ": '", a.type_name(), "' and '", b.type_name(),
             "'");
}

void check_defined(const Value& a, const Value& b) {
  if (a.is_undefined()) value_fail(a.undefined_hint());
  if (b.is_undefined()) value_fail(b.undefined_hint());
}

// Fails when an int64 operation overflowed (`overflow` is what __builtin_*_overflow returned).
void check_overflow(bool overflow, std::string_view op) {
  if (overflow) value_fail("integer overflow in '", op, "' (Python would use a big integer)");
}

Value repeat(const Value& seq, int64_t n) {
  if (n <= 0)
    return seq.is_string() ? Value("") : seq.is_tuple() ? Value::tuple({}) : Value::list({});
  const size_t unit = seq.is_string() ? seq.str().size() : seq.items().size();
  if (unit != 0 && static_cast<uint64_t>(n) > kMaxValueBytes / unit)
    value_fail("repetition result too large (", unit, " x ", n, ")");
  if (seq.is_string()) {
    std::string out;
    out.reserve(unit * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value(std::move(out));
  }
  List out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return seq.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

double py_fmod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

}  // namespace

Value binary_op(std::string_view op, const Value& a, const Value& b) {
  if (op == "~") {
    std::string s = to_str(a) + to_str(b);
    if (s.size() > kMaxValueBytes) value_fail("string result too large");
    return Value(std::move(s));
  }
  check_defined(a, b);
  const bool nums = a.is_number() && b.is_number();
  const bool ints = nums && !a.is_float() && !b.is_float();
  const int64_t x = a.integer(), y = b.integer();
  int64_t r = 0;
  if (op == "+") {
    if (ints) {
      check_overflow(__builtin_add_overflow(x, y, &r), op);
      return Value(r);
    }
    if (nums) return Value(a.number() + b.number());
    if (a.is_string() && b.is_string()) {
      if (a.str().size() + b.str().size() > kMaxValueBytes) value_fail("string result too large");
      if (a.is_markup() || b.is_markup())  // Markup + str, str + Markup: the str is escaped
        return Value::markup((a.is_markup() ? a.str() : html_escape(a.str())) +
                             (b.is_markup() ? b.str() : html_escape(b.str())));
      return Value(a.str() + b.str());
    }
    if (a.is_generator() || b.is_generator()) unsupported(op, a, b);
    if ((a.is_list() && b.is_list()) || (a.is_tuple() && b.is_tuple())) {
      List out = a.items();
      out.insert(out.end(), b.items().begin(), b.items().end());
      if (out.size() > kMaxValueBytes / sizeof(Value)) value_fail("list result too large");
      return a.is_tuple() ? Value::tuple(std::move(out)) : Value::list(std::move(out));
    }
    if (a.is_string()) value_fail("can only concatenate str (not \"", b.type_name(), "\") to str");
    if (a.is_list()) value_fail("can only concatenate list (not \"", b.type_name(), "\") to list");
    unsupported(op, a, b);
  }
  if (op == "-") {
    if (ints) {
      check_overflow(__builtin_sub_overflow(x, y, &r), op);
      return Value(r);
    }
    if (nums) return Value(a.number() - b.number());
    unsupported(op, a, b);
  }
  if (op == "*") {
    if (ints) {
      check_overflow(__builtin_mul_overflow(x, y, &r), op);
      return Value(r);
    }
    if (nums) return Value(a.number() * b.number());
    if (a.is_generator() || b.is_generator()) unsupported(op, a, b);
    const bool a_seq = a.is_string() || a.is_sequence(), b_seq = b.is_string() || b.is_sequence();
    if (a_seq && (b.is_int() || b.is_bool())) return repeat(a, y);
    if (b_seq && (a.is_int() || a.is_bool())) return repeat(b, x);
    if (a_seq || b_seq)
      value_fail("can't multiply sequence by non-int of type '", (a_seq ? b : a).type_name(), "'");
    unsupported(op, a, b);
  }
  if (op == "/") {
    if (!nums) unsupported(op, a, b);
    if (b.number() == 0) value_fail("division by zero");
    return Value(a.number() / b.number());
  }
  if (op == "//") {
    if (!nums) unsupported(op, a, b);
    if (ints) {
      if (y == 0) value_fail("integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) value_fail("integer overflow in '//'");
      int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
      return Value(q);
    }
    if (b.number() == 0) value_fail("float floor division by zero");
    return Value(std::floor(a.number() / b.number()));
  }
  if (op == "%") {
    if (a.is_string()) return Value(percent_format(a.str(), b));
    if (!nums) unsupported(op, a, b);
    if (ints) {
      if (y == 0) value_fail("integer division or modulo by zero");
      if (y == -1) return Value(int64_t{0});
      int64_t m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value(m);
    }
    if (b.number() == 0) value_fail("float modulo");
    return Value(py_fmod(a.number(), b.number()));
  }
  if (op == "**") {
    if (!nums) unsupported("** or pow()", a, b);
    if (ints && y >= 0) {
      int64_t result = 1, base = x, e = y;
      while (e > 0) {
        if (e & 1) check_overflow(__builtin_mul_overflow(result, base, &result), op);
        e >>= 1;
        if (e > 0) check_overflow(__builtin_mul_overflow(base, base, &base), op);
      }
      return Value(result);
    }
    if (a.number() == 0 && b.number() < 0) value_fail("0.0 cannot be raised to a negative power");
    return Value(std::pow(a.number(), b.number()));
  }
  value_fail("unknown operator '", op, "'");
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::string:
      if (!item.is_string())
        value_fail("'in <string>' requires string as left operand, not ", item.type_name());
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::list:
    case Value::Kind::tuple:
      for (const Value& x : container.items())
        if (equal(x, item)) return true;
      return false;
    case Value::Kind::dict:
      return container.dict().find(item) != nullptr;
    case Value::Kind::undefined:
      return false;  // jinja2's Undefined iterates as empty
    default:
      value_fail("argument of type '", container.type_name(), "' is not iterable");
  }
}

Value negate(const Value& v) {
  if (v.is_undefined()) value_fail(v.undefined_hint());
  if (v.is_float()) return Value(-v.number());
  if (v.is_number()) {
    if (v.integer() == INT64_MIN) value_fail("integer overflow in unary '-'");
    return Value(-v.integer());
  }
  value_fail("bad operand type for unary -: '", v.type_name(), "'");
}

}  // namespace tessera::jinja
