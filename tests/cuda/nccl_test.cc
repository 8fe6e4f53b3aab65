// NCCL wrapper: single-process all-reduce (sum, avg; f32, bf16) and reduce-scatter over every
// visible GPU, with values chosen so the exact result is representable.
#include "backend/cuda/nccl_comm.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <numeric>
#include <vector>

#include "backend/cuda/runtime.h"
#include "core/dtype.h"
#include "cuda_test_util.h"

namespace tessera::cuda {
namespace {

#define TS_REQUIRE_NCCL()                                        \
  do {                                                           \
    TS_REQUIRE_CUDA_DEVICE();                                    \
    if (!nccl_available()) GTEST_SKIP() << "built without NCCL"; \
  } while (0)

std::vector<int> all_devices() {
  std::vector<int> d(device_count());
  std::iota(d.begin(), d.end(), 0);
  return d;
}

TEST(NcclHost, StubOrRealReportsAvailability) {
  std::printf("nccl: %s\n", nccl_available() ? "available" : "built without NCCL");
  if (!nccl_available()) {
    EXPECT_THROW(nccl_make_id(), Error);
  }
}

TEST(Nccl, AllReduceSumAndAvgF32) {
  TS_REQUIRE_NCCL();
  const auto devices = all_devices();
  const int n = static_cast<int>(devices.size());
  auto comms = NcclComm::init_all(devices);
  ASSERT_EQ(comms.size(), devices.size());
  const int64_t count = 1000;  // not a multiple of anything NCCL chunks by
  std::vector<std::unique_ptr<test::DeviceArray<float>>> bufs;
  for (int r = 0; r < n; ++r) {
    DeviceGuard g(devices[r]);
    std::vector<float> host(count);
    for (int64_t i = 0; i < count; ++i) host[i] = static_cast<float>((r + 1) * (i % 7 + 1));
    bufs.push_back(std::make_unique<test::DeviceArray<float>>(host));
  }
  {
    NcclGroup group;
    for (int r = 0; r < n; ++r)
      comms[r].all_reduce(bufs[r]->get(), bufs[r]->get(), count, NcclType::f32, NcclOp::sum,
                          nullptr);
    group.end();
  }
  const float rank_sum = n * (n + 1) / 2.f;
  for (int r = 0; r < n; ++r) {
    DeviceGuard g(devices[r]);
    const auto got = bufs[r]->download();
    for (int64_t i = 0; i < count; ++i) ASSERT_EQ(got[i], rank_sum * (i % 7 + 1)) << r << " " << i;
  }
  // avg of identical buffers (all now hold the sum) gives the sum back.
  {
    NcclGroup group;
    for (int r = 0; r < n; ++r)
      comms[r].all_reduce(bufs[r]->get(), bufs[r]->get(), count, NcclType::f32, NcclOp::avg,
                          nullptr);
    group.end();
  }
  // NCCL may divide by n before or after summing, so avg is exact only up to f32 rounding.
  for (int r = 0; r < n; ++r) {
    DeviceGuard g(devices[r]);
    const auto got = bufs[r]->download();
    for (int64_t i = 0; i < count; ++i) {
      const float want = rank_sum * (i % 7 + 1);
      ASSERT_NEAR(got[i], want, 4e-7f * want * n) << r << " " << i;
    }
  }
}

TEST(Nccl, AllReduceBf16) {
  TS_REQUIRE_NCCL();
  const auto devices = all_devices();
  const int n = static_cast<int>(devices.size());
  auto comms = NcclComm::init_all(devices);
  const int64_t count = 513;
  std::vector<std::unique_ptr<test::DeviceArray<uint16_t>>> send, recv;
  for (int r = 0; r < n; ++r) {
    DeviceGuard g(devices[r]);
    std::vector<uint16_t> host(count);
    // Small integers: exact in bf16 (8 significant bits) for sums up to 256.
    for (int64_t i = 0; i < count; ++i) host[i] = f32_to_bf16(static_cast<float>(i % 5 + r));
    send.push_back(std::make_unique<test::DeviceArray<uint16_t>>(host));
    recv.push_back(std::make_unique<test::DeviceArray<uint16_t>>(count));
  }
  {
    NcclGroup group;
    for (int r = 0; r < n; ++r)
      comms[r].all_reduce(send[r]->get(), recv[r]->get(), count, NcclType::bf16, NcclOp::sum,
                          nullptr);
    group.end();
  }
  for (int r = 0; r < n; ++r) {
    DeviceGuard g(devices[r]);
    const auto got = recv[r]->download();
    for (int64_t i = 0; i < count; ++i) {
      const float want = static_cast<float>(n * (i % 5) + n * (n - 1) / 2);
      ASSERT_EQ(bf16_to_f32(got[i]), want) << r << " " << i;
    }
  }
}

TEST(Nccl, ReduceScatterSum) {
  TS_REQUIRE_NCCL();
  const auto devices = all_devices();
  const int n = static_cast<int>(devices.size());
  auto comms = NcclComm::init_all(devices);
  const int64_t chunk = 257;
  std::vector<std::unique_ptr<test::DeviceArray<float>>> send, recv;
  for (int r = 0; r < n; ++r) {
    DeviceGuard g(devices[r]);
    std::vector<float> host(chunk * n);
    for (int64_t i = 0; i < chunk * n; ++i) host[i] = static_cast<float>(i + 1000 * r);
    send.push_back(std::make_unique<test::DeviceArray<float>>(host));
    recv.push_back(std::make_unique<test::DeviceArray<float>>(chunk));
  }
  {
    NcclGroup group;
    for (int r = 0; r < n; ++r)
      comms[r].reduce_scatter(send[r]->get(), recv[r]->get(), chunk, NcclType::f32, NcclOp::sum,
                              nullptr);
    group.end();
  }
  for (int r = 0; r < n; ++r) {
    DeviceGuard g(devices[r]);
    const auto got = recv[r]->download();
    for (int64_t i = 0; i < chunk; ++i) {
      // sum over ranks q of (r * chunk + i + 1000 q)
      const float want = static_cast<float>(n * (r * chunk + i) + 1000 * n * (n - 1) / 2);
      ASSERT_EQ(got[i], want) << r << " " << i;
    }
  }
}

TEST(Nccl, RankConstructorWithOneRank) {
  TS_REQUIRE_NCCL();
  const NcclId id = nccl_make_id();
  NcclComm comm(id, 0, 1, 0);
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.size(), 1);
  test::DeviceArray<float> buf(std::vector<float>{1.f, 2.f, 3.f});
  comm.all_reduce(buf.get(), buf.get(), 3, NcclType::f32, NcclOp::sum, nullptr);
  EXPECT_EQ(buf.download(), (std::vector<float>{1.f, 2.f, 3.f}));
  EXPECT_THROW(NcclComm(id, 1, 1, 0), Error);
}

}  // namespace
}  // namespace tessera::cuda
