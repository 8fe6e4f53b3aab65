// Tokens and syntax tree of a Jinja template, and the lexer and parser that produce them
// (lexer.cc, parser.cc). Internal to the renderer; template.h is the public header.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "jinja/value.h"

namespace tessera::jinja {

struct Pos {
  int line = 1, col = 1;
};

// Where errors point: "<name>:<line>:<col>".
std::string where(const std::string& name, Pos pos);

struct Token {
  enum class Kind {
    text,
    var_begin,
    var_end,
    block_begin,
    block_end,
    name,
    string,
    integer,
    floating,
    op,
    eof
  };
  Kind kind;
  std::string text;  // the data, name, operator or unescaped string
  Pos pos;
  int64_t ival = 0;
  double fval = 0;
};

struct LexOptions {
  bool trim_blocks = false;
  bool lstrip_blocks = false;
  bool keep_trailing_newline = false;
};

// Splits a template into tokens as jinja2's lexer does (whitespace control, trim_blocks,
// lstrip_blocks, raw blocks and comments resolved here). Throws naming line and column.
std::vector<Token> lex(std::string_view source, const LexOptions& options, const std::string& name);

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    literal,   // value
    name,      // str
    list,      // kids
    tuple,     // kids
    dict,      // kids: key, value, key, value...
    getattr,   // kids[0] . str
    getitem,   // kids[0] [ kids[1] ]
    slice,     // kids[0..2]: start, stop, step (each may be null)
    call,      // kids[0] ( kids[1..], kwargs )
    filter,    // kids[0] | str ( kids[1..], kwargs ); kids[0] null in a filter block
    test,      // kids[0] is [not] str ( kids[1..], kwargs )
    neg,       // - kids[0]
    pos,       // + kids[0]
    not_,      // not kids[0]
    binary,    // kids[0] str kids[1]: + - * / // % ** ~
    and_,      // kids[0] and kids[1]
    or_,       // kids[0] or kids[1]
    compare,   // kids[0] ops[0] kids[1] ops[1] kids[2]...: == != < <= > >= in notin
    condexpr,  // kids[1] if kids[0] else kids[2] (kids[2] null: undefined)
  };
  Kind kind;
  Pos pos;
  Value value;
  std::string str;
  bool negated = false;  // `is not`
  std::vector<ExprPtr> kids;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

// An assignment target: a name, a tuple of targets, or `name.attr` (namespace attribute; set
// only).
struct Target {
  Pos pos;
  std::string name;
  std::string attr;  // non-empty: name.attr
  std::vector<Target> items;
  bool is_tuple = false;
};

struct Stmt {
  enum class Kind {
    text,          // text
    output,        // {{ expr }}
    if_,           // conds[i] -> bodies[i]; bodies has one more when there is an else
    for_,          // for target in expr [if filter]: body [else: else_body]
    set,           // set target = expr
    set_block,     // set target [| filter chain in expr]: body
    macro,         // macro name(params = defaults): body
    call_block,    // call[(params)] expr: body  (body is the macro `caller`)
    filter_block,  // filter expr (a filter chain applied to the body's output)
    break_,
    continue_,
    scope,  // a body run as is ({% generation %})
  };
  Kind kind;
  Pos pos;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  Target target;
  std::vector<ExprPtr> conds;
  std::vector<Body> bodies;
  Body body, else_body;
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // one per param, null when none
};

struct ParseLimits {
  int max_depth = 200;  // nesting of expressions and blocks
};

// Parses the tokens of `lex` into statements. Throws naming line and column.
Body parse(const std::vector<Token>& tokens, const std::string& name, const ParseLimits& limits);

}  // namespace tessera::jinja
