// The Jinja parser: statements and expressions with jinja2's grammar and precedence (condexpr <
// or < and < not < comparisons < + - < ~ < * / // % < ** < unary - + < postfix, filters and
// tests; ** is left-associative and unary minus binds tighter than **, as in jinja2).
#include "core/error.h"
#include "jinja/ast.h"

namespace tessera::jinja {
namespace {

using K = Token::Kind;

class Parser {
 public:
  Parser(const std::vector<Token>& t, const std::string& name, const ParseLimits& limits)
      : t_(t), name_(name), limits_(limits) {}

  Body run() {
    Body body = subparse({});
    if (cur().kind != K::eof) fail_tok(cur(), "unexpected token");
    return body;
  }

 private:
  struct DepthGuard {
    Parser* p;
    DepthGuard(Parser* parser, const Token& at) : p(parser) {
      if (++p->depth_ > p->limits_.max_depth)
        p->fail_tok(at, cat("template nested deeper than ", p->limits_.max_depth, " levels"));
    }
    ~DepthGuard() { --p->depth_; }
  };

  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  const Token& next() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }

  static std::string describe(const Token& t) {
    switch (t.kind) {
      case K::text:
        return "template text";
      case K::var_begin:
        return "'{{'";
      case K::var_end:
        return "'}}'";
      case K::block_begin:
        return "'{%'";
      case K::block_end:
        return "'%}'";
      case K::eof:
        return "end of template";
      case K::string:
        return "string literal";
      default:
        return "'" + t.text + "'";
    }
  }

  [[noreturn]] void fail_tok(const Token& t, const std::string& what) {
    fail("[jinja] ", where(name_, t.pos), ": ", what, " (at ", describe(t), ")");
  }

  bool is_op(const char* op) const { return cur().kind == K::op && cur().text == op; }
  bool is_name(const char* n) const { return cur().kind == K::name && cur().text == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    ++i_;
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    ++i_;
    return true;
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail_tok(cur(), cat("expected '", op, "'"));
  }
  void expect_block_end() {
    if (cur().kind != K::block_end) fail_tok(cur(), "expected end of statement '%}'");
    ++i_;
  }
  std::string expect_name(const char* what) {
    if (cur().kind != K::name) fail_tok(cur(), cat("expected ", what));
    return next().text;
  }

  static ExprPtr node(Expr::Kind k, Pos pos) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->pos = pos;
    return e;
  }

  // ----- statements -----

  // Statements up to a block tag whose first name is one of `ends` (left unconsumed, the
  // current token being that name).
  Body subparse(const std::vector<std::string>& ends) {
    open_.push_back(&ends);
    struct Pop {
      std::vector<const std::vector<std::string>*>* v;
      ~Pop() { v->pop_back(); }
    } pop{&open_};
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.kind == K::eof) {
        if (!ends.empty()) {
          std::string want;
          for (const auto& e : ends) want += (want.empty() ? "'" : " or '") + e + "'";
          fail_tok(t, cat("unexpected end of template: expected ", want));
        }
        return body;
      }
      if (t.kind == K::text) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::text;
        s->pos = t.pos;
        s->text = t.text;
        body.push_back(std::move(s));
        ++i_;
      } else if (t.kind == K::var_begin) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::output;
        s->pos = t.pos;
        ++i_;
        s->expr = parse_tuple(true, false);
        if (cur().kind != K::var_end) fail_tok(cur(), "expected end of print statement '}}'");
        ++i_;
        body.push_back(std::move(s));
      } else if (t.kind == K::block_begin) {
        const Token& nm = peek();
        if (nm.kind == K::name)
          for (const auto& e : ends)
            if (nm.text == e) {
              ++i_;
              return body;
            }
        ++i_;
        body.push_back(parse_statement());
      } else {
        fail_tok(t, "unexpected token");
      }
    }
  }

  // Consumes "{% name" ... the current token is the name; checks it and the block end.
  void end_tag(const char* name) {
    if (!skip_name(name)) fail_tok(cur(), cat("expected '", name, "'"));
    expect_block_end();
  }

  StmtPtr parse_statement() {
    const Token& t = cur();
    if (t.kind != K::name) fail_tok(t, "tag name expected");
    DepthGuard guard(this, t);
    auto s = std::make_unique<Stmt>();
    s->pos = t.pos;
    const std::string tag = next().text;
    if (tag == "if") {
      s->kind = Stmt::Kind::if_;
      s->conds.push_back(parse_tuple(false, false));
      expect_block_end();
      while (true) {
        s->bodies.push_back(subparse({"elif", "else", "endif"}));
        const std::string which = next().text;
        if (which == "elif") {
          s->conds.push_back(parse_tuple(false, false));
          expect_block_end();
        } else if (which == "else") {
          expect_block_end();
          s->bodies.push_back(subparse({"endif"}));
          end_tag("endif");
          break;
        } else {
          expect_block_end();
          break;
        }
      }
    } else if (tag == "for") {
      s->kind = Stmt::Kind::for_;
      s->target = parse_target(false, true);
      if (!skip_name("in")) fail_tok(cur(), "expected 'in' in for loop");
      s->expr = parse_tuple(false, true);
      if (skip_name("if")) s->filter = parse_expression(true);
      if (is_name("recursive")) fail_tok(cur(), "recursive for loops are not supported");
      expect_block_end();
      ++loop_depth_;
      s->body = subparse({"endfor", "else"});
      --loop_depth_;
      if (next().text == "else") {
        expect_block_end();
        s->else_body = subparse({"endfor"});
        end_tag("endfor");
      } else {
        expect_block_end();
      }
    } else if (tag == "set") {
      s->target = parse_target(true, true);
      if (skip_op("=")) {
        s->kind = Stmt::Kind::set;
        s->expr = parse_tuple(true, false);
        expect_block_end();
      } else {
        s->kind = Stmt::Kind::set_block;
        if (!s->target.attr.empty() || s->target.is_tuple)
          fail_tok(cur(), "a block set takes a single name");
        if (is_op("|")) s->filter = parse_filter_chain(nullptr);
        expect_block_end();
        s->body = subparse({"endset"});
        end_tag("endset");
      }
    } else if (tag == "macro") {
      s->kind = Stmt::Kind::macro;
      s->name = expect_name("a macro name");
      parse_signature(s.get());
      expect_block_end();
      const int outer_loops = loop_depth_;
      loop_depth_ = 0;  // a macro body is not inside the loop around its definition
      s->body = subparse({"endmacro"});
      loop_depth_ = outer_loops;
      end_tag("endmacro");
    } else if (tag == "call") {
      s->kind = Stmt::Kind::call_block;
      if (is_op("(")) parse_signature(s.get());
      s->expr = parse_expression(true);
      if (s->expr->kind != Expr::Kind::call) fail_tok(cur(), "expected a call in a call block");
      expect_block_end();
      s->body = subparse({"endcall"});
      end_tag("endcall");
    } else if (tag == "filter") {
      s->kind = Stmt::Kind::filter_block;
      s->filter = parse_filter_chain(nullptr, /*leading_pipe=*/false);
      expect_block_end();
      s->body = subparse({"endfilter"});
      end_tag("endfilter");
    } else if (tag == "break" || tag == "continue") {
      s->kind = tag == "break" ? Stmt::Kind::break_ : Stmt::Kind::continue_;
      if (loop_depth_ == 0) fail("[jinja] ", where(name_, t.pos), ": '", tag, "' outside a loop");
      expect_block_end();
    } else if (tag == "generation") {
      // transformers' {% generation %} marks assistant text for its token mask; rendering is
      // the body unchanged.
      s->kind = Stmt::Kind::scope;
      expect_block_end();
      s->body = subparse({"endgeneration"});
      end_tag("endgeneration");
    } else {
      // Inside a block, name the tags that would have closed or continued it.
      std::string expected;
      if (open_.size() > 1)
        for (const auto& e : *open_.back())
          expected += (expected.empty() ? "'" : " or '") + e + "'";
      fail("[jinja] ", where(name_, t.pos), ": unknown or unsupported tag '", tag, "'",
           expected.empty() ? "" : "; expected " + expected);
    }
    return s;
  }

  // ( name [= default], ... )
  void parse_signature(Stmt* s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s->params.empty()) expect_op(",");
      if (is_op(")")) break;
      s->params.push_back(expect_name("a parameter name"));
      s->defaults.push_back(skip_op("=") ? parse_expression(true) : nullptr);
    }
    expect_op(")");
  }

  // A name, `name.attr` (with_ns) or a tuple of names, with or without parentheses.
  Target parse_target(bool with_ns, bool allow_tuple) {
    Target t;
    t.pos = cur().pos;
    auto one = [&]() {
      Target x;
      x.pos = cur().pos;
      if (skip_op("(")) {
        x = parse_target(false, true);
        x.is_tuple = true;
        if (x.items.empty()) {
          Target inner = x;
          inner.is_tuple = false;
          x.items.push_back(inner);
        }
        expect_op(")");
        return x;
      }
      x.name = expect_name("an assignment target name");
      if (with_ns && skip_op(".")) x.attr = expect_name("an attribute name");
      return x;
    };
    t = one();
    if (!allow_tuple || !is_op(",")) return t;
    Target tuple;
    tuple.pos = t.pos;
    tuple.is_tuple = true;
    tuple.items.push_back(t);
    while (skip_op(",")) {
      if (!(cur().kind == K::name || is_op("("))) break;
      tuple.items.push_back(one());
    }
    for (const Target& x : tuple.items)
      if (!x.attr.empty())
        fail("[jinja] ", where(name_, x.pos), ": cannot unpack into ", x.name, ".", x.attr);
    return tuple;
  }

  // ----- expressions -----

  // Expressions separated by commas make a tuple (`{{ a, b }}`, `set a = 1, 2`). In a for
  // loop's iterable, an `if` ends it (the loop filter).
  ExprPtr parse_tuple(bool with_condexpr, bool in_for) {
    const Pos pos = cur().pos;
    std::vector<ExprPtr> items;
    bool comma = false;
    while (true) {
      if (!items.empty()) {
        if (!skip_op(",")) break;
        comma = true;
      }
      if (ends_tuple(in_for)) break;
      items.push_back(with_condexpr ? parse_expression(true) : parse_or());
    }
    if (!comma) {
      if (items.empty()) fail_tok(cur(), "expected an expression");
      return std::move(items[0]);
    }
    auto e = node(Expr::Kind::tuple, pos);
    e->kids = std::move(items);
    return e;
  }

  bool ends_tuple(bool in_for) const {
    const Token& t = cur();
    if (t.kind == K::var_end || t.kind == K::block_end || t.kind == K::eof) return true;
    if (t.kind == K::op && (t.text == ")" || t.text == "]" || t.text == "}" || t.text == "="))
      return true;
    return in_for && t.kind == K::name && (t.text == "if" || t.text == "recursive");
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard guard(this, cur());
    if (!with_condexpr) return parse_or();
    ExprPtr e = parse_or();
    while (is_name("if")) {
      const Pos pos = next().pos;
      auto c = node(Expr::Kind::condexpr, pos);
      c->kids.push_back(parse_or());
      c->kids.push_back(std::move(e));
      c->kids.push_back(skip_name("else") ? parse_expression(true) : nullptr);
      e = std::move(c);
    }
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      auto n = node(Expr::Kind::or_, next().pos);
      n->kids.push_back(std::move(e));
      n->kids.push_back(parse_and());
      e = std::move(n);
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      auto n = node(Expr::Kind::and_, next().pos);
      n->kids.push_back(std::move(e));
      n->kids.push_back(parse_not());
      e = std::move(n);
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(this, cur());
      auto n = node(Expr::Kind::not_, next().pos);
      n->kids.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const Pos pos = cur().pos;
    ExprPtr first = parse_math1();
    std::unique_ptr<Expr> cmp;
    while (true) {
      std::string op;
      if (cur().kind == K::op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                  cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        ++i_;
        op = "in";
      } else if (is_name("not") && peek().kind == K::name && peek().text == "in") {
        i_ += 2;
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(Expr::Kind::compare, pos);
        cmp->kids.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->kids.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr binary(const std::string& op, ExprPtr a, ExprPtr b, Pos pos) {
    auto n = node(Expr::Kind::binary, pos);
    n->str = op;
    n->kids.push_back(std::move(a));
    n->kids.push_back(std::move(b));
    return n;
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& op = next();
      e = binary(op.text, std::move(e), parse_concat(), op.pos);
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const Token& op = next();
      e = binary("~", std::move(e), parse_math2(), op.pos);
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& op = next();
      e = binary(op.text, std::move(e), parse_pow(), op.pos);
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const Token& op = next();
      e = binary("**", std::move(e), parse_unary(true), op.pos);
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(this, cur());
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token& op = next();
      e = node(op.text == "-" ? Expr::Kind::neg : Expr::Kind::pos, op.pos);
      e->kids.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    switch (t.kind) {
      case K::name: {
        ++i_;
        if (t.text == "true" || t.text == "True") return literal(Value(true), t.pos);
        if (t.text == "false" || t.text == "False") return literal(Value(false), t.pos);
        if (t.text == "none" || t.text == "None") return literal(Value::none(), t.pos);
        auto n = node(Expr::Kind::name, t.pos);
        n->str = t.text;
        return n;
      }
      case K::string: {
        // Adjacent string literals concatenate ("a" "b").
        std::string s;
        while (cur().kind == K::string) s += next().text;
        return literal(Value(std::move(s)), t.pos);
      }
      case K::integer:
        ++i_;
        return literal(Value(t.ival), t.pos);
      case K::floating:
        ++i_;
        return literal(Value(t.fval), t.pos);
      case K::op:
        if (t.text == "(") {
          ++i_;
          if (skip_op(")")) {
            auto e = node(Expr::Kind::tuple, t.pos);
            return e;
          }
          ExprPtr e = parse_tuple(true, false);
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          ++i_;
          auto e = node(Expr::Kind::list, t.pos);
          while (!is_op("]")) {
            if (!e->kids.empty()) expect_op(",");
            if (is_op("]")) break;
            e->kids.push_back(parse_expression(true));
          }
          expect_op("]");
          return e;
        }
        if (t.text == "{") {
          ++i_;
          auto e = node(Expr::Kind::dict, t.pos);
          while (!is_op("}")) {
            if (!e->kids.empty()) expect_op(",");
            if (is_op("}")) break;
            e->kids.push_back(parse_expression(true));
            expect_op(":");
            e->kids.push_back(parse_expression(true));
          }
          expect_op("}");
          return e;
        }
        break;
      default:
        break;
    }
    fail_tok(t, "unexpected token, expected an expression");
  }

  static ExprPtr literal(Value v, Pos pos) {
    auto e = node(Expr::Kind::literal, pos);
    e->value = std::move(v);
    return e;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".")) {
        const Token& dot = next();
        if (cur().kind == K::name) {
          auto n = node(Expr::Kind::getattr, dot.pos);
          n->str = next().text;
          n->kids.push_back(std::move(e));
          e = std::move(n);
        } else if (cur().kind == K::integer) {
          auto n = node(Expr::Kind::getitem, dot.pos);
          n->kids.push_back(std::move(e));
          n->kids.push_back(literal(Value(next().ival), dot.pos));
          e = std::move(n);
        } else {
          fail_tok(cur(), "expected an attribute name after '.'");
        }
      } else if (is_op("[")) {
        const Token& br = next();
        std::vector<ExprPtr> idx;
        while (!is_op("]")) {
          if (!idx.empty()) expect_op(",");
          if (is_op("]")) break;
          idx.push_back(parse_subscribed());
        }
        expect_op("]");
        if (idx.empty()) fail_tok(cur(), "expected a subscript");
        auto n = node(Expr::Kind::getitem, br.pos);
        n->kids.push_back(std::move(e));
        if (idx.size() == 1) {
          n->kids.push_back(std::move(idx[0]));
        } else {
          auto tup = node(Expr::Kind::tuple, br.pos);
          tup->kids = std::move(idx);
          n->kids.push_back(std::move(tup));
        }
        e = std::move(n);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscribed() {
    const Pos pos = cur().pos;
    std::vector<ExprPtr> parts;
    ExprPtr first;
    if (!is_op(":")) {
      first = parse_expression(true);
      if (!is_op(":")) return first;
    }
    auto s = node(Expr::Kind::slice, pos);
    s->kids.push_back(std::move(first));
    expect_op(":");
    s->kids.push_back(is_op("]") || is_op(",") || is_op(":") ? nullptr : parse_expression(true));
    if (skip_op(":"))
      s->kids.push_back(is_op("]") || is_op(",") ? nullptr : parse_expression(true));
    else
      s->kids.push_back(nullptr);
    return s;
  }

  // Arguments of a call: positional, then name=value; `*args` and `**kwargs` are not supported.
  void parse_args(Expr* n) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**"))
        fail_tok(cur(), "*args and **kwargs in calls are not supported");
      if (cur().kind == K::name && peek().kind == K::op && peek().text == "=") {
        std::string key = next().text;
        ++i_;
        n->kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!n->kwargs.empty()) fail_tok(cur(), "positional argument after keyword argument");
        n->kids.push_back(parse_expression(true));
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    // Errors of a call point at its callee ("raise_exception" rather than the parenthesis).
    auto n = node(Expr::Kind::call, callee->pos);
    n->kids.push_back(std::move(callee));
    parse_args(n.get());
    return n;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        e = parse_filter_chain(std::move(e));
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  // name[.name][(args)] after '|' (or, in a filter block, first without one), repeated while
  // '|' follows.
  ExprPtr parse_filter_chain(ExprPtr operand, bool leading_pipe = true) {
    ExprPtr e = std::move(operand);
    bool first = true;
    while ((first && !leading_pipe) || skip_op("|")) {
      first = false;
      auto n = node(Expr::Kind::filter, cur().pos);
      n->str = expect_name("a filter name");
      while (skip_op(".")) n->str += "." + expect_name("a filter name");
      n->kids.push_back(std::move(e));
      if (is_op("(")) parse_args(n.get());
      e = std::move(n);
    }
    return e;
  }

  ExprPtr parse_test(ExprPtr operand) {
    const Pos pos = next().pos;  // 'is'
    auto n = node(Expr::Kind::test, pos);
    n->negated = skip_name("not");
    n->str = expect_name("a test name");
    while (skip_op(".")) n->str += "." + expect_name("a test name");
    n->kids.push_back(std::move(operand));
    const Token& t = cur();
    if (is_op("(")) {
      parse_args(n.get());
    } else if ((t.kind == K::name || t.kind == K::string || t.kind == K::integer ||
                t.kind == K::floating || is_op("[") || is_op("{")) &&
               !(t.kind == K::name && (t.text == "else" || t.text == "or" || t.text == "and"))) {
      if (is_name("is")) fail_tok(t, "you cannot chain multiple tests with 'is'");
      n->kids.push_back(parse_postfix(parse_primary()));
    }
    return n;
  }

  const std::vector<Token>& t_;
  const std::string& name_;
  const ParseLimits& limits_;
  size_t i_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  std::vector<const std::vector<std::string>*> open_;  // the end tags of each open block
};

}  // namespace

Body parse(const std::vector<Token>& tokens, const std::string& name, const ParseLimits& limits) {
  return Parser(tokens, name, limits).run();
}

}  // namespace tessera::jinja
