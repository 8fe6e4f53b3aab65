// The backend registry: one slot per device, filled by the program before its first op.
#include "ops/backend.h"

#include <array>
#include <atomic>

#include "core/error.h"

namespace tessera::ops {

namespace {
// Atomic slots: ops on several threads read them while nothing writes after start-up.
std::array<std::atomic<Backend*>, 2> g_backends{};
}  // namespace

std::string_view device_name(Device d) {
  return d == Device::cpu ? "cpu" : "cuda";
}

void register_backend(Device d, Backend* b) {
  g_backends[static_cast<size_t>(d)].store(b, std::memory_order_release);
}

Backend& backend(Device d) {
  Backend* b = g_backends[static_cast<size_t>(d)].load(std::memory_order_acquire);
  TS_CHECK(b != nullptr, "[ops] no backend registered for device ", device_name(d),
           d == Device::cuda ? " (a build without CUDA, or a program that did not call "
                               "backend::register_cuda_ops_backend())"
                             : " (the program must call cpu::register_backend() first)");
  return *b;
}

void require_device(const Context& ctx, std::string_view user) {
  if (ctx.device != Device::cpu) backend(ctx.device).require_device(user);
}

}  // namespace tessera::ops
