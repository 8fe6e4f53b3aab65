// Strict flag parsing and the command registry.
#include "apps/cli/args.h"

#include <charconv>
#include <cmath>

#include "core/error.h"

namespace tessera::cli {

namespace {

// Single-letter spellings of common flags (as llama.cpp-style tools accept them).
std::string long_name(const std::string& a) {
  if (a == "-m") return "--model";
  if (a == "-p") return "--prompt";
  if (a == "-n") return "--tokens";
  if (a == "-f") return "--file";
  if (a == "-t") return "--threads";
  return a;
}

}  // namespace

Args::Args(const std::vector<std::string>& argv, const std::set<std::string>& switches) {
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = long_name(argv[i]);
    if (a.size() > 2 && a[0] == '-' && a[1] == '-') {
      const auto eq = a.find('=');
      if (eq != std::string::npos) {
        values_[a.substr(0, eq)] = a.substr(eq + 1);
      } else if (switches.count(a)) {
        values_[a] = "1";
      } else {
        TS_CHECK(i + 1 < argv.size(), "flag ", a, " needs a value");
        values_[a] = argv[++i];
      }
    } else {
      positional_.push_back(a);
    }
  }
}

std::string Args::str(const std::string& flag, const std::string& def) {
  seen_.insert(flag);
  auto it = values_.find(flag);
  return it == values_.end() ? def : it->second;
}

std::string Args::required(const std::string& flag) {
  seen_.insert(flag);
  auto it = values_.find(flag);
  TS_CHECK(it != values_.end() && !it->second.empty(), "missing required flag ", flag);
  return it->second;
}

int64_t Args::i64(const std::string& flag, int64_t def, int64_t lo, int64_t hi) {
  seen_.insert(flag);
  auto it = values_.find(flag);
  if (it == values_.end()) return def;
  const std::string& s = it->second;
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  TS_CHECK(ec == std::errc() && p == s.data() + s.size(), "flag ", flag,
           " expects an integer, got '", s, "'");
  TS_CHECK(v >= lo && v <= hi, "flag ", flag, " must be in [", lo, ", ", hi, "], got ", v);
  return v;
}

double Args::f64(const std::string& flag, double def, double lo, double hi) {
  seen_.insert(flag);
  auto it = values_.find(flag);
  if (it == values_.end()) return def;
  const std::string& s = it->second;
  double v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  TS_CHECK(ec == std::errc() && p == s.data() + s.size() && std::isfinite(v), "flag ", flag,
           " expects a number, got '", s, "'");
  TS_CHECK(v >= lo && v <= hi, "flag ", flag, " must be in [", lo, ", ", hi, "], got ", v);
  return v;
}

bool Args::has(const std::string& flag) {
  seen_.insert(flag);
  return values_.count(flag) > 0;
}

void Args::finish() const {
  for (const auto& [k, v] : values_) TS_CHECK(seen_.count(k), "unknown flag ", k);
}

namespace {
std::vector<Command>& registry() {
  static std::vector<Command> r;
  return r;
}
}  // namespace

void register_command(const Command& c) {
  registry().push_back(c);
}
const std::vector<Command>& commands() {
  return registry();
}

}  // namespace tessera::cli
