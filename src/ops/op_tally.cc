// Totals of the calls and scopes an OpTally observed.
#include "ops/op_tally.h"

#include <algorithm>
#include <chrono>
#include <tuple>

#include "ops/memory.h"

namespace tessera::ops {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

ScopeTotal& scope_named(std::vector<ScopeTotal>& scopes, std::string_view name) {
  for (ScopeTotal& s : scopes)
    if (s.name == name) return s;
  scopes.emplace_back();
  scopes.back().name = name;
  return scopes.back();
}

}  // namespace

std::string shape_string(const OpShape& s) {
  std::string out;
  std::string_view names = s.names;
  for (int i = 0; i < 5 && !names.empty(); ++i) {
    const size_t sp = names.find(' ');
    const std::string_view name = names.substr(0, sp);
    if (!out.empty()) out += ' ';
    out += name;
    out += '=';
    out += std::to_string(s.dims[i]);
    names = sp == std::string_view::npos ? std::string_view() : names.substr(sp + 1);
  }
  return out;
}

void OpTally::on_op(const OpRecord& r) {
  const std::lock_guard<std::mutex> lock(mu_);
  const std::vector<Open>& open = open_[std::this_thread::get_id()];
  const std::string_view scope = open.empty() ? std::string_view() : open.back().name;
  Key key{r.op.data(), "", "", scope.data(), r.op.size(), 0, scope.size(), {}};
  if (by_shape_) {
    key.names = r.shape.names;
    key.dtype = r.shape.dtype.data();
    key.dtype_n = r.shape.dtype.size();
    std::copy(std::begin(r.shape.dims), std::end(r.shape.dims), key.dims);
  }
  auto [it, added] = index_.try_emplace(key, by_op_.size());
  if (added) {
    OpTotal t;
    t.op = r.op;
    if (by_shape_) {
      t.shape = shape_string(r.shape);
      t.dtype = r.shape.dtype;
    }
    t.scope = scope;
    by_op_.push_back(std::move(t));
  }
  OpTotal& t = by_op_[it->second];
  ++t.calls;
  t.seconds += r.seconds;
  t.flops += r.cost.flops;
  t.bytes += r.cost.bytes;
  t.state_bytes += r.cost.state_bytes;
  for (const Open& o : open) {  // every enclosing scope, nested ones included
    ScopeTotal& s = scope_named(scopes_, o.name);
    s.op_seconds += r.seconds;
    s.flops += r.cost.flops;
    s.bytes += r.cost.bytes;
  }
}

void OpTally::enter_scope(std::string_view name, const Context&) {
  const double t0 = now_seconds();
  const std::lock_guard<std::mutex> lock(mu_);
  open_[std::this_thread::get_id()].push_back(Open{name, t0});
  scope_named(scopes_, name);  // listed in the order first entered
}

void OpTally::exit_scope(std::string_view name, const Context&) {
  const double t1 = now_seconds();
  const std::lock_guard<std::mutex> lock(mu_);
  std::vector<Open>& open = open_[std::this_thread::get_id()];
  // Scopes are RAII objects, so the one closing is the innermost; a reset() in between may have
  // forgotten it.
  if (open.empty() || open.back().name != name) return;
  ScopeTotal& s = scope_named(scopes_, name);
  ++s.calls;
  s.seconds += t1 - open.back().t0;
  open.pop_back();
}

std::vector<OpTotal> OpTally::totals() const {
  std::vector<OpTotal> out;
  {
    const std::lock_guard<std::mutex> lock(mu_);
    // Rows whose names match but came from distinct copies of a string literal merge here.
    std::map<std::tuple<std::string, std::string, std::string, std::string>, size_t> seen;
    for (const OpTotal& t : by_op_) {
      auto [it, added] = seen.try_emplace({t.op, t.shape, t.dtype, t.scope}, out.size());
      if (added) {
        out.push_back(t);
        continue;
      }
      OpTotal& o = out[it->second];
      o.calls += t.calls;
      o.seconds += t.seconds;
      o.flops += t.flops;
      o.bytes += t.bytes;
      o.state_bytes += t.state_bytes;
    }
  }
  std::sort(out.begin(), out.end(), [](const OpTotal& a, const OpTotal& b) {
    if (a.seconds != b.seconds) return a.seconds > b.seconds;
    if (a.op != b.op) return a.op < b.op;
    return a.shape < b.shape;
  });
  return out;
}

std::vector<ScopeTotal> OpTally::scopes() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return scopes_;
}

OpTotal OpTally::sum() const {
  const std::lock_guard<std::mutex> lock(mu_);
  OpTotal s;
  s.op = "(all ops)";
  for (const OpTotal& t : by_op_) {
    s.calls += t.calls;
    s.seconds += t.seconds;
    s.flops += t.flops;
    s.bytes += t.bytes;
    s.state_bytes += t.state_bytes;
  }
  return s;
}

void OpTally::reset() {
  const std::lock_guard<std::mutex> lock(mu_);
  by_op_.clear();
  index_.clear();
  scopes_.clear();
  // Scopes open now stay open (their exits will come) but start their time afresh.
  const double t = now_seconds();
  for (auto& [id, open] : open_)
    for (Open& o : open) o.t0 = t;
}

void TallySwitch::on_begin(std::string_view, const Context& ctx) {
  if (!into || !synchronize || ctx.device == Device::cpu) return;
  ops::synchronize(ctx);
  const double t0 = now_seconds();
  const std::lock_guard<std::mutex> lock(mu_);
  begun_[std::this_thread::get_id()].push_back(Begun{&ctx, t0});
}

void TallySwitch::on_op(const OpRecord& r) {
  if (!into) return;
  if (!synchronize || r.device == Device::cpu) return into->on_op(r);
  Begun b{nullptr, 0};
  {
    const std::lock_guard<std::mutex> lock(mu_);
    std::vector<Begun>& mine = begun_[std::this_thread::get_id()];
    if (mine.empty()) return into->on_op(r);  // a dry run's op: nothing began
    b = mine.back();
    mine.pop_back();
  }
  OpRecord timed = r;
  ops::synchronize(*b.ctx);
  timed.seconds = now_seconds() - b.t0;
  into->on_op(timed);
}

void TallySwitch::enter_scope(std::string_view name, const Context& ctx) {
  if (!into) return;
  if (synchronize && ctx.device != Device::cpu) ops::synchronize(ctx);
  into->enter_scope(name, ctx);
}

void TallySwitch::exit_scope(std::string_view name, const Context& ctx) {
  if (!into) return;
  if (synchronize && ctx.device != Device::cpu) ops::synchronize(ctx);
  into->exit_scope(name, ctx);
}

}  // namespace tessera::ops
