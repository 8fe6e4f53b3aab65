// CUDA runtime helpers: the peak table and bandwidth formula (host), device description,
// streams, events and copies (device).
#include "backend/cuda/runtime.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "cuda_test_util.h"

namespace tessera::cuda {
namespace {

TEST(CudaRuntimeHost, PeakTableKnowsHopperAndAmpere) {
  const TensorPeaks h200 = tensor_peaks(9, 0, "NVIDIA H200");
  EXPECT_DOUBLE_EQ(h200.bf16, 989.4e12);
  EXPECT_DOUBLE_EQ(h200.fp8, 1978.9e12);
  EXPECT_DOUBLE_EQ(tensor_peaks(9, 0, "NVIDIA H100 80GB HBM3").bf16, 989.4e12);
  EXPECT_LT(tensor_peaks(9, 0, "NVIDIA H100 PCIe").bf16, 989.4e12);
  const TensorPeaks a100 = tensor_peaks(8, 0, "NVIDIA A100-SXM4-80GB");
  EXPECT_DOUBLE_EQ(a100.bf16, 312e12);
  EXPECT_DOUBLE_EQ(a100.fp8, 0.0);
}

TEST(CudaRuntimeHost, UnknownGpuHasZeroPeaksAndSaysSo) {
  const TensorPeaks p = tensor_peaks(7, 5, "Tesla T4");
  EXPECT_EQ(p.bf16, 0.0);
  EXPECT_EQ(p.fp16, 0.0);
  EXPECT_EQ(p.fp8, 0.0);
  EXPECT_NE(p.source.find("unknown GPU"), std::string::npos) << p.source;
  EXPECT_NE(p.source.find("Tesla T4"), std::string::npos) << p.source;
}

TEST(CudaRuntimeHost, TheoreticalBandwidthIsDoubleDataRate) {
  // H100 SXM: 2619 MHz x 5120 bits x 2 transfers per clock / 8 = 3.352 TB/s (datasheet 3.35).
  EXPECT_NEAR(theoretical_bandwidth(2619000, 5120), 3.352e12, 1e9);
}

TEST(CudaRuntime, DeviceInfoIsPlausible) {
  TS_REQUIRE_CUDA_DEVICE();
  const int n = device_count();
  ASSERT_GE(n, 1);
  for (int i = 0; i < n; ++i) {
    const DeviceInfo d = device_info(i);
    EXPECT_EQ(d.index, i);
    EXPECT_FALSE(d.name.empty());
    EXPECT_GE(d.sm_major, 7);
    EXPECT_GT(d.sm_count, 0);
    EXPECT_GT(d.total_memory, size_t{1} << 30);
    EXPECT_GT(d.memory_bandwidth, 1e11);
    EXPECT_FALSE(d.peaks.source.empty());
    std::printf(
        "device %d: %s sm_%d%d, %d SMs, %.1f GiB, %.0f GB/s theoretical, bf16 peak %.1f "
        "TFLOP/s (%s)\n",
        i, d.name.c_str(), d.sm_major, d.sm_minor, d.sm_count,
        static_cast<double>(d.total_memory) / (1 << 30), d.memory_bandwidth / 1e9,
        d.peaks.bf16 / 1e12, d.peaks.source.c_str());
  }
  EXPECT_THROW(device_info(n), Error);
  EXPECT_THROW(set_device(-1), Error);
}

TEST(CudaRuntime, SetDeviceAndGuard) {
  TS_REQUIRE_CUDA_DEVICE();
  set_device(0);
  EXPECT_EQ(current_device(), 0);
  {
    DeviceGuard g(device_count() - 1);
    EXPECT_EQ(current_device(), device_count() - 1);
  }
  EXPECT_EQ(current_device(), 0);
}

TEST(CudaRuntime, CopiesRoundTripSyncAndAsync) {
  TS_REQUIRE_CUDA_DEVICE();
  std::vector<float> host(1000);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i) * 0.5f - 7.f;
  const size_t bytes = host.size() * sizeof(float);
  test::DeviceArray<float> a(host.size()), b(host.size());
  copy_to_device(a.get(), host.data(), bytes);
  copy_device_to_device(b.get(), a.get(), bytes);
  std::vector<float> back(host.size());
  copy_to_host(back.data(), b.get(), bytes);
  EXPECT_EQ(back, host);

  Stream s;
  std::vector<float> host2(host.size(), 3.f), back2(host.size(), 0.f);
  copy_to_device_async(a.get(), host2.data(), bytes, s.get());
  copy_device_to_device_async(b.get(), a.get(), bytes, s.get());
  copy_to_host_async(back2.data(), b.get(), bytes, s.get());
  s.synchronize();
  EXPECT_EQ(back2, host2);
}

TEST(CudaRuntime, EventsMeasureElapsedTime) {
  TS_REQUIRE_CUDA_DEVICE();
  Stream s;
  Event start, stop;
  test::DeviceArray<uint8_t> buf(size_t{64} << 20);
  start.record(s.get());
  for (int i = 0; i < 4; ++i) TS_CUDA_CHECK(cudaMemsetAsync(buf.get(), i, buf.size(), s.get()));
  stop.record(s.get());
  const float ms = stop.elapsed_ms_since(start);
  EXPECT_GT(ms, 0.f);
  EXPECT_LT(ms, 10000.f);
  Event moved = std::move(stop);
  EXPECT_NE(moved.get(), nullptr);
  synchronize();
}

}  // namespace
}  // namespace tessera::cuda
