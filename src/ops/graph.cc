// Recorded op sequences through the device's backend.
#include "ops/graph.h"

#include <utility>

#include "core/error.h"
#include "ops/backend.h"

namespace tessera::ops {

Graph::~Graph() {
  if (handle_) backend(device_).destroy_graph(handle_);
}

Graph& Graph::operator=(Graph&& o) noexcept {
  if (this != &o) {
    Graph old(std::move(*this));
    device_ = o.device_;
    handle_ = std::exchange(o.handle_, nullptr);
  }
  return *this;
}

void Graph::replay(const Context& ctx) const {
  TS_CHECK(handle_ != nullptr, "[ops] replay of an empty graph");
  TS_CHECK(ctx.device == device_, "[ops] a graph recorded on ", device_name(device_),
           " replayed on ", device_name(ctx.device));
  backend(ctx.device).replay_graph(ctx, handle_);
}

bool records_graphs(const Context& ctx) {
  return (!ctx.observer || !ctx.observer->watching()) && backend(ctx.device).records_graphs();
}

Graph record(const Context& ctx, const std::function<void()>& ops) {
  Graph g;
  Backend& b = backend(ctx.device);
  if (!records_graphs(ctx)) return g;
  b.begin_graph(ctx);
  try {
    ops();
  } catch (...) {
    b.destroy_graph(b.end_graph(ctx));  // leaves the device able to run ops again
    throw;
  }
  g.device_ = ctx.device;
  g.handle_ = b.end_graph(ctx);
  return g;
}

}  // namespace tessera::ops
