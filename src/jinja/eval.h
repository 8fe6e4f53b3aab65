// The tree-walking evaluator of a parsed template (eval.cc). Internal to the renderer.
#pragma once

#include <cstdint>
#include <string>

#include "jinja/ast.h"

namespace tessera::jinja {

struct EvalLimits {
  int64_t max_steps = 10'000'000;  // statements run plus loop iterations plus calls
  int max_call_depth = 100;        // macro calls nested (recursive macros)
  size_t max_output_bytes = size_t{1} << 28;
};

// Renders `body` with the names of `context` (a dict; undefined for none) as globals beside
// jinja2's range, dict and namespace. Throws tessera::Error naming "<name>:line:col".
std::string evaluate(const Body& body, const Value& context, const std::string& name,
                     const EvalLimits& limits);

// Fails, naming the position, on a filter or test name jinja2 does not know: jinja2 reports
// those when it compiles the template, before anything renders.
void check_names(const Body& body, const std::string& name);

}  // namespace tessera::jinja
