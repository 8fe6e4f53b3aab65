// The CUDA backend is built and reports the device it sees, or why there is none.
#include <gtest/gtest.h>

#include "backend/device.h"
#include "cuda_test_util.h"

namespace tessera {
namespace {

TEST(CudaDevice, BuiltAndDescribesTheMachine) {
  EXPECT_TRUE(backend::cuda_built());
  const std::string summary = backend::cuda_device_summary();
  EXPECT_FALSE(summary.empty());
  std::printf("cuda: %s\n", summary.c_str());
}

TEST(CudaDevice, DeviceArrayRoundTrip) {
  TS_REQUIRE_CUDA_DEVICE();
  std::vector<float> host = {1.f, -2.f, 3.5f};
  cuda::test::DeviceArray<float> d(host);
  EXPECT_EQ(d.download(), host);
}

}  // namespace
}  // namespace tessera
