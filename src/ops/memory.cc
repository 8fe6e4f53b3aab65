// Buffers and copies through the device's backend.
#include "ops/memory.h"

#include <utility>

#include "core/error.h"
#include "ops/backend.h"
#include "ops/observed.h"

namespace tessera::ops {

Buffer::Buffer(Device d, size_t bytes) : device_(d), bytes_(bytes) {
  if (bytes > 0) data_ = backend(d).allocate(bytes);
}

Buffer::~Buffer() {
  if (data_) backend(device_).release(data_);
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    Buffer old(std::move(*this));
    device_ = o.device_;
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void copy(const Context& ctx, void* dst, const void* src, size_t bytes, CopyKind kind) {
  if (bytes == 0) return;
  TS_CHECK(dst != nullptr && src != nullptr, "[ops] copy of ", bytes, " bytes with a null pointer");
  // Read once and written once; kind is a dimension so host-device transfers (bound by the
  // link, not by memory) get rows of their own.
  detail::observed(
      ctx, "copy",
      [&] {
        return OpShape{
            "bytes kind", {static_cast<int64_t>(bytes), static_cast<int64_t>(kind)}, "bytes"};
      },
      [&] {
        return OpCost{0, 2.0 * static_cast<double>(bytes)};
      },
      [&] { backend(ctx.device).copy(ctx, dst, src, bytes, kind); });
}

void synchronize(const Context& ctx) {
  backend(ctx.device).synchronize(ctx);
}

void zero(const Context& ctx, void* p, size_t bytes) {
  if (bytes == 0) return;
  TS_CHECK(p != nullptr, "[ops] zero of ", bytes, " bytes at a null pointer");
  detail::observed(
      ctx, "zero",
      [&] {
        return OpShape{"bytes", {static_cast<int64_t>(bytes)}, "bytes"};
      },
      [&] {
        return OpCost{0, static_cast<double>(bytes)};
      },  // written once
      [&] { backend(ctx.device).zero(ctx, p, bytes); });
}

}  // namespace tessera::ops
