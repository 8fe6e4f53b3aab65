// Runs a parsed template. Scopes follow jinja2's: a for loop's body gets a fresh scope each
// iteration (a `set` inside it is gone after the loop, hence namespace()), if blocks share their
// surroundings, a macro call sees the template's top level and its arguments.
#include "jinja/eval.h"

#include "core/error.h"
#include "jinja/builtins.h"

namespace tessera::jinja {
namespace {

struct Scope {
  Scope* parent = nullptr;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* find(const std::string& n) const {
    for (const Scope* s = this; s; s = s->parent)
      for (const auto& kv : s->vars)
        if (kv.first == n) return &kv.second;
    return nullptr;
  }
  void set(const std::string& n, Value v) {
    for (auto& kv : vars)
      if (kv.first == n) {
        kv.second = std::move(v);
        return;
      }
    vars.emplace_back(n, std::move(v));
  }
};

enum class Flow { normal, break_, continue_ };

class Evaluator {
 public:
  Evaluator(const std::string& name, const EvalLimits& limits) : name_(name), limits_(limits) {}

  std::string run(const Body& body, const Value& context) {
    add_builtins(&root_);
    if (context.is_dict())
      for (const auto& [k, v] : context.dict().items) root_.set(to_str(k), v);
    else if (!context.is_undefined() && !context.is_none())
      fail("[jinja] ", name_, ": the render context must be a dict, not ", context.type_name());
    std::string out;
    out_ = &out;
    exec(body, root_);
    return out;
  }

 private:
  [[noreturn]] void fail_at(Pos pos, const std::string& what) const {
    fail("[jinja] ", where(name_, pos), ": ", what);
  }

  void step(Pos pos) {
    if (++steps_ > limits_.max_steps)
      fail_at(pos, cat("template ran more than ", limits_.max_steps,
                       " steps (a runaway loop or recursion?)"));
  }

  void emit(const std::string& s, Pos pos) {
    if (out_->size() + s.size() > limits_.max_output_bytes)
      fail_at(pos, cat("output larger than ", limits_.max_output_bytes, " bytes"));
    *out_ += s;
  }

  static void add_builtins(Scope* s) {
    s->set("range", Value::callable("range", [](Args& a) {
             if (!a.keyword.empty()) value_fail("range() takes no keyword arguments");
             int64_t start = 0, stop = 0, st = 1;
             auto arg = [&](size_t i) {
               const Value& v = a.positional[i];
               if (!v.is_int() && !v.is_bool())
                 value_fail("range(): '", v.type_name(),
                            "' object cannot be interpreted as an integer");
               return v.integer();
             };
             if (a.positional.size() == 1) {
               stop = arg(0);
             } else if (a.positional.size() == 2 || a.positional.size() == 3) {
               start = arg(0);
               stop = arg(1);
               if (a.positional.size() == 3) st = arg(2);
             } else {
               value_fail("range expected 1 to 3 arguments, got ", a.positional.size());
             }
             if (st == 0) value_fail("range() arg 3 must not be zero");
             const double n =
                 st > 0 ? (static_cast<double>(stop) - static_cast<double>(start) + st - 1) / st
                        : (static_cast<double>(start) - static_cast<double>(stop) - st - 1) / -st;
             if (n > static_cast<double>(kMaxRange))
               value_fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (",
                          kMaxRange, ").");
             List out;
             for (int64_t i = start; st > 0 ? i < stop : i > stop; i += st) out.emplace_back(i);
             return Value::list(std::move(out));
           }));
    s->set("namespace", Value::callable("namespace", [](Args& a) {
             auto ns = std::make_shared<Object>();
             ns->type = "Namespace";
             ns->settable = true;
             if (a.positional.size() > 1)
               value_fail("namespace() takes at most one positional argument");
             if (!a.positional.empty()) {
               if (!a.positional[0].is_dict())
                 value_fail("namespace(): the positional argument must be a dict");
               for (const auto& [k, v] : a.positional[0].dict().items) ns->set(to_str(k), v);
             }
             for (const auto& [k, v] : a.keyword) ns->set(k, v);
             for (const auto& [k, v] : ns->attrs)
               if (!k.empty() && k[0] == '_')
                 value_fail(
                     "Chat templates cannot store underscore-prefixed attributes on a namespace, "
                     "but got '",
                     k, "'");
             return Value::object(std::move(ns));
           }));
    s->set("dict", Value::callable("dict", [](Args& a) {
             Dict d;
             if (a.positional.size() > 1) value_fail("dict expected at most 1 argument");
             if (!a.positional.empty()) {
               const Value& src = a.positional[0];
               if (src.is_dict()) {
                 d = src.dict();
               } else {
                 for (const Value& kv : iterate(src)) {
                   const List pair = iterate(kv);
                   if (pair.size() != 2) value_fail("dict(): each item must be a pair");
                   d.set(pair[0], pair[1]);
                 }
               }
             }
             for (const auto& [k, v] : a.keyword) d.set(Value(k), v);
             return Value::dict(std::move(d));
           }));
  }

  // ----- statements -----

  Flow exec(const Body& body, Scope& scope) {
    for (const StmtPtr& s : body) {
      const Flow f = exec(*s, scope);
      if (f != Flow::normal) return f;
    }
    return Flow::normal;
  }

  std::string capture(const Body& body, Scope& scope) {
    std::string buf;
    std::string* saved = out_;
    out_ = &buf;
    try {
      exec(body, scope);
    } catch (...) {
      out_ = saved;
      throw;
    }
    out_ = saved;
    return buf;
  }

  Flow exec(const Stmt& s, Scope& scope) {
    step(s.pos);
    switch (s.kind) {
      case Stmt::Kind::text:
        emit(s.text, s.pos);
        return Flow::normal;
      case Stmt::Kind::output:
        emit(printed(eval(*s.expr, scope), s.pos), s.pos);
        return Flow::normal;
      case Stmt::Kind::if_:
        for (size_t i = 0; i < s.conds.size(); ++i)
          if (truthy(eval(*s.conds[i], scope))) return exec(s.bodies[i], scope);
        if (s.bodies.size() > s.conds.size()) return exec(s.bodies.back(), scope);
        return Flow::normal;
      case Stmt::Kind::for_:
        exec_for(s, scope);
        return Flow::normal;
      case Stmt::Kind::set:
        assign(s.target, eval(*s.expr, scope), scope);
        return Flow::normal;
      case Stmt::Kind::set_block: {
        Value v(capture(s.body, scope));
        if (s.filter) v = apply_filters(*s.filter, std::move(v), scope);
        assign(s.target, std::move(v), scope);
        return Flow::normal;
      }
      case Stmt::Kind::macro:
        scope.set(s.name, make_macro(s, &root_));
        return Flow::normal;
      case Stmt::Kind::call_block: {
        // The body becomes the macro `caller`, passed to the called macro.
        const Value caller = make_macro(s, &scope, "caller");
        const Expr& call = *s.expr;
        Value callee = eval(*call.kids[0], scope);
        Args args = eval_args(call, scope);
        args.keyword.emplace_back("caller", caller);
        emit(printed(invoke(callee, args, call.pos), s.pos), s.pos);
        return Flow::normal;
      }
      case Stmt::Kind::filter_block:
        emit(printed(apply_filters(*s.filter, Value(capture(s.body, scope)), scope), s.pos), s.pos);
        return Flow::normal;
      case Stmt::Kind::break_:
        return Flow::break_;
      case Stmt::Kind::continue_:
        return Flow::continue_;
      case Stmt::Kind::scope:
        return exec(s.body, scope);
    }
    return Flow::normal;
  }

  // A filter chain parsed with a null innermost operand (set blocks, filter blocks) applied to v.
  Value apply_filters(const Expr& chain, Value v, Scope& scope) {
    if (!chain.kids[0]) {
      Args args = eval_args(chain, scope, 1);
      try {
        return call_filter(chain.str, v, args);
      } catch (const ValueError& e) {
        fail_at(chain.pos, e.message);
      }
    }
    Value inner = apply_filters(*chain.kids[0], std::move(v), scope);
    Args args = eval_args(chain, scope, 1);
    try {
      return call_filter(chain.str, inner, args);
    } catch (const ValueError& e) {
      fail_at(chain.pos, e.message);
    }
  }

  void assign(const Target& t, Value v, Scope& scope) {
    if (!t.attr.empty()) {
      const Value* ns = scope.find(t.name);
      if (!ns || !ns->is_object() || !ns->object().settable)
        fail_at(t.pos, cat("cannot assign attribute '", t.attr, "' on '", t.name,
                           "': it is not a namespace()"));
      if (!t.attr.empty() && t.attr[0] == '_')
        fail_at(t.pos, "Chat templates cannot store underscore-prefixed attributes on a namespace");
      ns->object().set(t.attr, std::move(v));
      return;
    }
    if (!t.is_tuple) {
      scope.set(t.name, std::move(v));
      return;
    }
    List items;
    try {
      items = iterate(v);
    } catch (const ValueError& e) {
      fail_at(t.pos, "cannot unpack: " + e.message);
    }
    if (items.size() != t.items.size())
      fail_at(t.pos, items.size() < t.items.size()
                         ? cat("not enough values to unpack (expected ", t.items.size(), ", got ",
                               items.size(), ")")
                         : cat("too many values to unpack (expected ", t.items.size(), ")"));
    for (size_t i = 0; i < items.size(); ++i) assign(t.items[i], items[i], scope);
  }

  void exec_for(const Stmt& s, Scope& scope) {
    const Value seq = eval(*s.expr, scope);
    List all;
    try {
      all = iterate(seq);
    } catch (const ValueError& e) {
      fail_at(s.expr->pos, e.message);
    }
    // The loop's `if` filters before the loop runs, so loop.length counts the kept items.
    List items;
    if (s.filter) {
      for (const Value& x : all) {
        step(s.pos);
        Scope f{&scope, {}};
        assign(s.target, x, f);
        if (truthy(eval(*s.filter, f))) items.push_back(x);
      }
    } else {
      items = std::move(all);
    }
    if (items.empty()) {
      exec(s.else_body, scope);
      return;
    }
    const int64_t n = static_cast<int64_t>(items.size());
    auto last_changed = std::make_shared<Value>();
    auto has_changed = std::make_shared<bool>(false);
    for (int64_t i = 0; i < n; ++i) {
      step(s.pos);
      Scope it{&scope, {}};
      auto loop = std::make_shared<Object>();
      loop->type = "LoopContext";
      loop->attrs = {
          {"index", Value(i + 1)},
          {"index0", Value(i)},
          {"revindex", Value(n - i)},
          {"revindex0", Value(n - i - 1)},
          {"first", Value(i == 0)},
          {"last", Value(i == n - 1)},
          {"length", Value(n)},
          {"depth", Value(int64_t{1})},
          {"depth0", Value(int64_t{0})},
          {"previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item")},
          {"nextitem", i + 1 < n ? items[i + 1] : Value::undefined("there is no next item")},
          {"cycle",
           Value::callable("loop.cycle",
                           [i](Args& a) {
                             if (a.positional.empty())
                               value_fail("loop.cycle(): no items for cycling given");
                             return a.positional[static_cast<size_t>(i) % a.positional.size()];
                           })},
          {"changed", Value::callable("loop.changed",
                                      [last_changed, has_changed](Args& a) {
                                        const Value now = Value::list(a.positional);
                                        if (*has_changed && equal(*last_changed, now))
                                          return Value(false);
                                        *last_changed = now;
                                        *has_changed = true;
                                        return Value(true);
                                      })},
      };
      it.set("loop", Value::object(std::move(loop)));
      assign(s.target, items[i], it);
      if (exec(s.body, it) == Flow::break_) break;
    }
  }

  // A macro (or a call block's `caller`) as a callable: arguments bind to its parameters,
  // missing ones take their defaults (evaluated at the call) or are undefined.
  Value make_macro(const Stmt& s, Scope* parent, const std::string& name = "") {
    const Stmt* stmt = &s;
    const std::string macro_name = name.empty() ? s.name : name;
    return Value::callable(macro_name, [this, stmt, parent, macro_name](Args& a) {
      if (a.positional.size() > stmt->params.size())
        value_fail("macro '", macro_name, "' takes not more than ", stmt->params.size(),
                   " argument(s)");
      if (++call_depth_ > limits_.max_call_depth) {
        --call_depth_;
        value_fail("macro calls nested deeper than ", limits_.max_call_depth,
                   " (runaway recursion?)");
      }
      struct Depth {
        int* d;
        ~Depth() { --*d; }
      } depth{&call_depth_};
      Scope local{parent, {}};
      std::vector<bool> given(stmt->params.size(), false);
      for (size_t i = 0; i < a.positional.size(); ++i) {
        local.set(stmt->params[i], a.positional[i]);
        given[i] = true;
      }
      for (auto& [k, v] : a.keyword) {
        size_t i = 0;
        while (i < stmt->params.size() && stmt->params[i] != k) ++i;
        if (i == stmt->params.size()) {
          if (k == "caller") {
            local.set("caller", v);
            continue;
          }
          value_fail("macro '", macro_name, "' takes no keyword argument '", k, "'");
        }
        if (given[i])
          value_fail("macro '", macro_name, "' got multiple values for argument '", k, "'");
        local.set(k, v);
        given[i] = true;
      }
      for (size_t i = 0; i < stmt->params.size(); ++i) {
        if (given[i]) continue;
        local.set(stmt->params[i], stmt->defaults[i]
                                       ? eval(*stmt->defaults[i], local)
                                       : Value::undefined(cat("parameter '", stmt->params[i],
                                                              "' was not provided")));
      }
      return Value(capture(stmt->body, local));
    });
  }

  // ----- expressions -----

  Args eval_args(const Expr& e, Scope& scope, size_t first = 1) {
    Args a;
    for (size_t i = first; i < e.kids.size(); ++i) a.positional.push_back(eval(*e.kids[i], scope));
    for (const auto& [k, x] : e.kwargs) a.keyword.emplace_back(k, eval(*x, scope));
    return a;
  }

  // v as the output prints it; a value with no printed form fails at pos.
  std::string printed(const Value& v, Pos pos) {
    try {
      return to_str(v);
    } catch (const ValueError& err) {
      fail_at(pos, err.message);
    }
  }

  Value invoke(const Value& callee, Args& args, Pos pos) {
    step(pos);
    if (callee.is_undefined()) value_fail(callee.undefined_hint());
    if (!callee.is_callable()) value_fail("'", callee.type_name(), "' object is not callable");
    return callee.callable().fn(args);
  }

  Value eval(const Expr& e, Scope& scope) {
    try {
      return eval_node(e, scope);
    } catch (const ValueError& err) {
      fail_at(e.pos, err.message);
    }
  }

  Value eval_node(const Expr& e, Scope& scope) {
    switch (e.kind) {
      case Expr::Kind::literal:
        return e.value;
      case Expr::Kind::name: {
        const Value* v = scope.find(e.str);
        return v ? *v : Value::undefined(cat("'", e.str, "' is undefined"));
      }
      case Expr::Kind::list:
      case Expr::Kind::tuple: {
        List items;
        for (const auto& k : e.kids) items.push_back(eval(*k, scope));
        return e.kind == Expr::Kind::list ? Value::list(std::move(items))
                                          : Value::tuple(std::move(items));
      }
      case Expr::Kind::dict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.kids.size(); i += 2)
          d.set(eval(*e.kids[i], scope), eval(*e.kids[i + 1], scope));
        return Value::dict(std::move(d));
      }
      case Expr::Kind::getattr:
        return get_attr(eval(*e.kids[0], scope), e.str);
      case Expr::Kind::getitem: {
        const Value obj = eval(*e.kids[0], scope);
        const Expr& idx = *e.kids[1];
        if (idx.kind == Expr::Kind::slice) {
          auto part = [&](size_t i) { return idx.kids[i] ? eval(*idx.kids[i], scope) : Value(); };
          return get_slice(obj, part(0), part(1), part(2));
        }
        return get_item(obj, eval(idx, scope));
      }
      case Expr::Kind::slice:
        value_fail("a slice outside a subscript");
      case Expr::Kind::call: {
        const Value callee = eval(*e.kids[0], scope);
        Args args = eval_args(e, scope);
        return invoke(callee, args, e.pos);
      }
      case Expr::Kind::filter: {
        const Value v = eval(*e.kids[0], scope);
        Args args = eval_args(e, scope);
        return call_filter(e.str, v, args);
      }
      case Expr::Kind::test: {
        const Value v = eval(*e.kids[0], scope);
        Args args = eval_args(e, scope);
        return Value(call_test(e.str, v, args) != e.negated);
      }
      case Expr::Kind::neg:
        return negate(eval(*e.kids[0], scope));
      case Expr::Kind::pos: {
        Value v = eval(*e.kids[0], scope);
        if (v.is_undefined()) value_fail(v.undefined_hint());
        if (!v.is_number()) value_fail("bad operand type for unary +: '", v.type_name(), "'");
        return v.is_bool() ? Value(v.integer()) : v;
      }
      case Expr::Kind::not_:
        return Value(!truthy(eval(*e.kids[0], scope)));
      case Expr::Kind::binary: {
        const Value a = eval(*e.kids[0], scope);
        const Value b = eval(*e.kids[1], scope);
        return binary_op(e.str, a, b);
      }
      case Expr::Kind::and_: {
        Value a = eval(*e.kids[0], scope);
        return truthy(a) ? eval(*e.kids[1], scope) : a;
      }
      case Expr::Kind::or_: {
        Value a = eval(*e.kids[0], scope);
        return truthy(a) ? a : eval(*e.kids[1], scope);
      }
      case Expr::Kind::compare: {
        Value left = eval(*e.kids[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.kids[i + 1], scope);
          const std::string& op = e.ops[i];
          bool ok;
          if (op == "==") {
            ok = equal(left, right);
          } else if (op == "!=") {
            ok = !equal(left, right);
          } else if (op == "in" || op == "notin") {
            ok = contains(right, left) == (op == "in");
          } else {
            if (left.is_undefined()) value_fail(left.undefined_hint());
            if (right.is_undefined()) value_fail(right.undefined_hint());
            ok = op == "<"    ? less(left, right)
                 : op == "<=" ? !less(right, left)
                 : op == ">"  ? less(right, left)
                              : !less(left, right);
          }
          if (!ok) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::Kind::condexpr:
        if (truthy(eval(*e.kids[0], scope))) return eval(*e.kids[1], scope);
        if (e.kids[2]) return eval(*e.kids[2], scope);
        return Value::undefined(
            "the inline if-expression evaluated to false and no else section was defined.");
    }
    value_fail("unknown expression");
  }

  const std::string& name_;
  const EvalLimits& limits_;
  Scope root_;
  std::string* out_ = nullptr;
  int64_t steps_ = 0;
  int call_depth_ = 0;
};

void check_expr(const Expr* e, const std::string& name) {
  if (!e) return;
  if (e->kind == Expr::Kind::filter && !has_filter(e->str))
    fail("[jinja] ", where(name, e->pos), ": no filter named '", e->str, "'");
  if (e->kind == Expr::Kind::test && !has_test(e->str))
    fail("[jinja] ", where(name, e->pos), ": no test named '", e->str, "'");
  for (const auto& k : e->kids) check_expr(k.get(), name);
  for (const auto& kv : e->kwargs) check_expr(kv.second.get(), name);
}

}  // namespace

void check_names(const Body& body, const std::string& name) {
  for (const StmtPtr& s : body) {
    check_expr(s->expr.get(), name);
    check_expr(s->filter.get(), name);
    for (const auto& c : s->conds) check_expr(c.get(), name);
    for (const auto& d : s->defaults) check_expr(d.get(), name);
    // jinja2 compiles if bodies in a "soft" frame: an unknown name there fails only when it
    // runs, so `{% if x is filter %}` guards work. Those fail in call_filter/call_test instead.
    check_names(s->body, name);
    check_names(s->else_body, name);
  }
}

std::string evaluate(const Body& body, const Value& context, const std::string& name,
                     const EvalLimits& limits) {
  return Evaluator(name, limits).run(body, context);
}

}  // namespace tessera::jinja
