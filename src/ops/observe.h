// The one place every op call can be observed: a profiler (or a test) puts an OpObserver in the
// context, and each ops/ entry point reports its name, its cost (FLOPs and the bytes it must
// move) and its time to it, whichever device ran it. Without an observer nothing is measured.
#pragma once

#include <string_view>

namespace tessera::ops {

enum class Device;

// Cost model for the roofline: floating-point operations and bytes moved by one call (zero for
// the ops that have no cost model yet).
struct OpCost {
  double flops = 0, bytes = 0;
};

struct OpRecord {
  std::string_view op;  // the entry point's name, e.g. "matmul_wt"
  Device device;
  OpCost cost;
  // Host wall time of the call: the kernel's time on the CPU, the launch's on an asynchronous
  // device (a device profiler times its stream instead).
  double seconds = 0;
};

class OpObserver {
 public:
  virtual ~OpObserver() = default;
  // Called after each op on the thread that called it.
  virtual void on_op(const OpRecord& r) = 0;
};

}  // namespace tessera::ops
