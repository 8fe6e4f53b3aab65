// Recorded op sequences: a device whose launches cost more than a small step's work (a GPU
// decoding one token: hundreds of kernels of a few microseconds) records the ops of a step once
// and replays them as one launch. A recording keeps every argument as it was given (pointers and
// scalars); the memory behind the pointers is read when the graph replays, so a caller replays a
// graph only for inputs of the same shape, staged into the same buffers. On the CPU nothing is
// recorded: ops cost no launch, and record() says so by returning an empty graph.
#pragma once

#include <functional>

#include "ops/context.h"

namespace tessera::ops {

class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(Graph&& o) noexcept : device_(o.device_), handle_(o.handle_) { o.handle_ = nullptr; }
  Graph& operator=(Graph&& o) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  bool empty() const { return handle_ == nullptr; }
  // Runs the recorded ops on ctx (ctx.device must be the recording's), in order after the ops
  // already issued there.
  void replay(const Context& ctx) const;

 private:
  friend Graph record(const Context& ctx, const std::function<void()>& ops);
  Device device_ = Device::cpu;
  void* handle_ = nullptr;
};

// Whether ctx.device's backend records graphs, and ctx has no observer: an observed context
// runs every op eagerly, so the observer sees (and times) each one.
bool records_graphs(const Context& ctx);
// Records the ops `ops` issues on ctx without running them, where the device records graphs
// (the ops must not synchronize with the host or allocate); elsewhere returns an empty graph and
// runs nothing. Replay the graph to run them.
Graph record(const Context& ctx, const std::function<void()>& ops);

}  // namespace tessera::ops
