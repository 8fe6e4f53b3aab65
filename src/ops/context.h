// Where an op runs: the device, the thread pool for CPU kernels or the stream for an
// accelerator's, and whether to force the plain reference kernels (the test oracle). Passed down
// with the work: nothing process-wide decides it.
#pragma once

#include "core/thread_pool.h"
#include "ops/observe.h"

namespace tessera::ops {

enum class Device { cpu, cuda };

struct Context {
  Device device = Device::cpu;
  ThreadPool* pool = nullptr;      // CPU: null means default_pool()
  void* stream = nullptr;          // CUDA: the cudaStream_t ops are queued on; null: the backend's
  bool reference = false;          // CPU: use backend/cpu/ref kernels instead of the SIMD ones
  OpObserver* observer = nullptr;  // sees every op call (ops/observe.h); null: none
  // Every op is checked and reported to the observer (with zero seconds) but not run: the
  // planner walks a forward pass's ops, shapes and costs at any batch and context without the
  // work or the memory. Results are unspecified (ops returning a value return zero).
  bool dry_run = false;
  ThreadPool& threads() const { return pool ? *pool : default_pool(); }
};

inline Scope::Scope(const Context& ctx, std::string_view name) : ctx_(ctx), name_(name) {
  if (ctx_.observer) ctx_.observer->enter_scope(name_, ctx_);
}
inline Scope::~Scope() {
  if (ctx_.observer) ctx_.observer->exit_scope(name_, ctx_);
}

}  // namespace tessera::ops
