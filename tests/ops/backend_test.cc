// The backend registry: ops/ calls go to the backend registered for the context's device, and a
// device without one is refused with its name.
#include "ops/backend.h"

#include <gtest/gtest.h>

#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "ops/ops.h"
#include "test_util/expect_error.h"

namespace tessera::ops {
namespace {

TEST(Backend, RegisteredCpuBackendRunsOps) {
  EXPECT_EQ(backend(Device::cpu).name(), "cpu");
  const std::vector<float> a = {1, 2, 3}, b = {10, 20, 30};
  std::vector<float> out(3);
  add(Context{}, out.data(), a.data(), b.data(), 3);
  EXPECT_EQ(out, (std::vector<float>{11, 22, 33}));
}

TEST(Backend, DeviceWithoutBackendIsRefusedByName) {
  Context cuda;
  cuda.device = Device::cuda;
  std::vector<float> x(4, 1.0f);
  test::expect_error([&] { add(cuda, x.data(), x.data(), x.data(), 4); },
                     "no backend registered for device cuda");
}

TEST(Backend, UnregisteredCpuIsRefusedThenRegisteredAgain) {
  register_backend(Device::cpu, nullptr);
  std::vector<float> x(4, 1.0f);
  test::expect_error([&] { scale(Context{}, x.data(), 4, 2.0f); },
                     "no backend registered for device cpu");
  cpu::register_backend();
  scale(Context{}, x.data(), 4, 2.0f);
  EXPECT_EQ(x, std::vector<float>(4, 2.0f));
}

}  // namespace
}  // namespace tessera::ops
