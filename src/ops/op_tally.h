// An OpObserver that sums what it observes: per op, shape, element type and enclosing scope the
// calls, host time, FLOPs and bytes; per scope (ops::Scope) its calls, wall time and the cost of
// the ops inside it. Put one in a context (ops::Context::observer) for the calls to profile, then
// read totals() and scopes(): the share of a run each op took, and where each sits against the
// machine's compute and memory roofs. Safe to share between threads (a server's engine thread
// and its request threads).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ops/observe.h"

namespace tessera::ops {

struct OpTotal {
  std::string op;     // the entry point, e.g. "matmul_wt"
  std::string shape;  // its extents, e.g. "m=1 k=576 n=1728" (empty without by_shape)
  std::string dtype;  // the element type that sets its bytes, e.g. "q4_1" (empty without by_shape)
  std::string scope;  // the innermost scope around the calls, e.g. "qkv"; empty: none
  int64_t calls = 0;
  double seconds = 0, flops = 0, bytes = 0, state_bytes = 0;
};

struct ScopeTotal {
  std::string name;
  int64_t calls = 0;
  double seconds = 0;                           // wall time between enter and exit, summed
  double op_seconds = 0, flops = 0, bytes = 0;  // the ops inside it (nested scopes' included)
};

class OpTally final : public OpObserver {
 public:
  // by_shape: one total per (op, shape, dtype, scope); false: one per op (what a short summary
  // wants).
  explicit OpTally(bool by_shape = true) : by_shape_(by_shape) {}

  void on_op(const OpRecord& r) override;
  void enter_scope(std::string_view name, const Context& ctx) override;
  void exit_scope(std::string_view name, const Context& ctx) override;

  // Largest time first (ties by op, then shape).
  std::vector<OpTotal> totals() const;
  // In the order first entered.
  std::vector<ScopeTotal> scopes() const;
  // Sums of every op's time, FLOPs and bytes.
  OpTotal sum() const;
  void reset();

 private:
  struct Open {
    std::string_view name;
    double t0;
  };
  // A total's identity without formatting anything: the views point at static strings (op and
  // scope names, the shape's names and dtype), so their addresses and sizes identify them.
  struct Key {
    const char *op, *names, *dtype, *scope;
    size_t op_n, dtype_n, scope_n;
    int64_t dims[5];
    auto operator<=>(const Key&) const = default;
  };
  const bool by_shape_;
  mutable std::mutex mu_;
  std::vector<OpTotal> by_op_;
  std::map<Key, size_t> index_;  // -> the total's place in by_op_
  std::vector<ScopeTotal> scopes_;
  std::map<std::thread::id, std::vector<Open>> open_;  // each thread's open scopes, innermost last
};

// Hands what it observes to the tally `into` points at, none while it is null: one observer fixed
// in a context (a model keeps its context) that sorts the calls of a run into phases (prefill
// and decode, a step and the planning around it).
class TallySwitch final : public OpObserver {
 public:
  OpTally* into = nullptr;
  // On an asynchronous device (CUDA; CPU ops are never waited for): wait for the device before
  // and after each op and at each scope's ends, so that the times are the device's, not the
  // launches'. Each op then runs alone, without the overlap of a stream of launches and never in
  // a graph: slower than an unobserved run, by what those save. Safe across threads, as OpTally.
  bool synchronize = false;

  bool watching() const override { return into != nullptr; }
  void on_begin(std::string_view op, const Context& ctx) override;
  void on_op(const OpRecord& r) override;
  void enter_scope(std::string_view name, const Context& ctx) override;
  void exit_scope(std::string_view name, const Context& ctx) override;

 private:
  struct Begun {
    const Context* ctx;
    double t0;
  };
  // With synchronize: each thread's device ops begun and not yet reported, innermost last.
  std::mutex mu_;
  std::map<std::thread::id, std::vector<Begun>> begun_;
};

// "m=1 k=576 n=1728": the shape's named extents.
std::string shape_string(const OpShape& s);

}  // namespace tessera::ops
