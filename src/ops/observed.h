// Internal to ops/: runs an entry point's backend call and, when the context has an observer,
// tells it the call begins, times it, and reports it with its shape and cost (computed only
// then).
#pragma once

#include <chrono>
#include <string_view>
#include <type_traits>

#include "ops/context.h"
#include "ops/observe.h"

namespace tessera::ops::detail {

template <typename ShapeFn, typename CostFn, typename CallFn>
decltype(auto) observed(const Context& ctx, std::string_view op, ShapeFn&& shape, CostFn&& cost,
                        CallFn&& call) {
  using Result = decltype(call());
  if (ctx.dry_run) {
    if (ctx.observer) ctx.observer->on_op(OpRecord{op, ctx.device, shape(), cost(), 0.0});
    if constexpr (std::is_void_v<Result>)
      return;
    else
      return std::remove_cvref_t<Result>{};
  }
  if (!ctx.observer || !ctx.observer->watching()) return call();
  ctx.observer->on_begin(op, ctx);
  const auto t0 = std::chrono::steady_clock::now();
  auto report = [&] {
    const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
    ctx.observer->on_op(OpRecord{op, ctx.device, shape(), cost(), dt.count()});
  };
  if constexpr (std::is_void_v<Result>) {
    call();
    report();
  } else {
    auto r = call();
    report();
    return r;
  }
}

}  // namespace tessera::ops::detail
