// The one place every op call can be observed: a profiler (or a test) puts an OpObserver in the
// context, and each ops/ entry point reports its begin, then its name, shape, cost (FLOPs and
// the bytes it must move) and host time to it, whichever device ran it. Code above ops/ marks
// named parts of its work (a stage of the forward pass, a phase of a command) with ops::Scope;
// the same observer sums them. Without an observer nothing is measured: one branch per call.
#pragma once

#include <cstdint>
#include <string_view>

#include "core/dtype.h"

namespace tessera::ops {

enum class Device;
struct Context;

// Cost model for the roofline: floating-point (or integer) operations and bytes moved by one
// call. Every op has one; tests/ops/observe_test.cc checks each against a hand count.
// state_bytes: the part of bytes that is long-lived state read once per step (weights, the KV
// cache, optimizer moments), which comes from whichever memory level holds a whole step's
// state, not from the cache the previous op just wrote.
struct OpCost {
  double flops = 0, bytes = 0, state_bytes = 0;
};

// The shape of one call, for per-shape rows: up to five named extents and the element type that
// sets its bytes (the weights' for products, the cache's for attention; "bytes" for untyped
// memory). Extents that change at
// every call (a decode row's number of cached keys) are left out, so that the calls of one layer
// shape fall in one row.
struct OpShape {
  const char* names = "";  // space-separated extent names, one per dims entry, e.g. "m n k"
  int64_t dims[5] = {};
  std::string_view dtype = "f32";  // a static name (dtype_name)
};

struct OpRecord {
  std::string_view op;  // the entry point's name, e.g. "matmul_wt"
  Device device;
  OpShape shape;
  OpCost cost;
  // Host wall time of the call: the kernel's time on the CPU, the launch's on an asynchronous
  // device (a device observer times the stream between on_begin and on_op instead).
  double seconds = 0;
};

class OpObserver {
 public:
  virtual ~OpObserver() = default;
  // Called before each op, on the thread that calls it (a device observer records an event on
  // ctx.stream here).
  virtual void on_begin(std::string_view /*op*/, const Context& /*ctx*/) {}
  // Called after each op on the thread that called it.
  virtual void on_op(const OpRecord& r) = 0;
  // A named part of the work begins and ends on the calling thread; the ops called in between
  // belong to it. Scopes nest (names are static strings: the observer may keep the views).
  virtual void enter_scope(std::string_view /*name*/, const Context& /*ctx*/) {}
  virtual void exit_scope(std::string_view /*name*/, const Context& /*ctx*/) {}
  // Whether the calls are being looked at now: while they are not, no op is reported (on_begin
  // and on_op are skipped; scopes still are), and a device may record and replay graphs
  // (ops/graph.h), since a replay reports no op.
  virtual bool watching() const { return true; }
};

// Marks the ops called during its lifetime as part of `name` for ctx's observer; nothing without
// one. name must outlive the observer's report (a string literal).
class Scope {
 public:
  Scope(const Context& ctx, std::string_view name);
  ~Scope();
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  const Context& ctx_;
  std::string_view name_;
};

}  // namespace tessera::ops
