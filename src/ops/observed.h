// Internal to ops/: runs an entry point's backend call and, when the context has an observer,
// times it and reports it with its cost (computed only then).
#pragma once

#include <chrono>
#include <string_view>
#include <type_traits>

#include "ops/context.h"
#include "ops/observe.h"

namespace tessera::ops::detail {

template <typename CostFn, typename CallFn>
decltype(auto) observed(const Context& ctx, std::string_view op, CostFn&& cost, CallFn&& call) {
  if (!ctx.observer) return call();
  const auto t0 = std::chrono::steady_clock::now();
  auto report = [&] {
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    ctx.observer->on_op(OpRecord{op, ctx.device, cost(), dt.count()});
  };
  if constexpr (std::is_void_v<decltype(call())>) {
    call();
    report();
  } else {
    auto r = call();
    report();
    return r;
  }
}

}  // namespace tessera::ops::detail
