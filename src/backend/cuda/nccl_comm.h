// NCCL communicators (RAII) and the collectives data-parallel training needs: all-reduce and
// reduce-scatter on a stream. nccl.h stays out of this header so callers need no NCCL include.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

struct ncclComm;  // NCCL's opaque communicator (ncclComm_t is ncclComm*)

namespace tessera::cuda {

// Throws Error("[nccl] <expr> failed at file:line: <NCCL's message> (<last error>)").
[[noreturn]] void fail_nccl(int result, const char* expr, const char* file, int line);

}  // namespace tessera::cuda

// For NCCL calls (ncclResult_t); only usable where nccl.h is included.
#define TS_NCCL_CHECK(expr)                                                                  \
  do {                                                                                       \
    const ncclResult_t ts_nccl_res_ = (expr);                                                \
    if (ts_nccl_res_ != ncclSuccess)                                                         \
      ::tessera::cuda::fail_nccl(static_cast<int>(ts_nccl_res_), #expr, __FILE__, __LINE__); \
  } while (0)

namespace tessera::cuda {

// False when the build found no NCCL; every other call here then throws saying so.
bool nccl_available();

// ncclUniqueId's bytes (NCCL_UNIQUE_ID_BYTES = 128, checked in the .cu): rank 0 makes one and
// sends it to the others (through MPI, say) before each builds its communicator.
struct NcclId {
  char bytes[128];
};
NcclId nccl_make_id();

enum class NcclType : uint8_t { f32, bf16 };
enum class NcclOp : uint8_t { sum, avg };

class NcclComm {
 public:
  // One rank of a `size`-rank communicator, on `device` (made current for the call).
  NcclComm(const NcclId& id, int rank, int size, int device);
  // Single process, one communicator per listed device (rank i on devices[i]), via ncclCommInitAll.
  static std::vector<NcclComm> init_all(const std::vector<int>& devices);

  ~NcclComm();
  NcclComm(NcclComm&& o) noexcept;
  NcclComm& operator=(NcclComm&& o) noexcept;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }

  // recv (count) = op over ranks of send (count); recv may equal send (in place). Device
  // pointers on this communicator's device; enqueued on `stream`.
  void all_reduce(const void* send, void* recv, int64_t count, NcclType type, NcclOp op,
                  cudaStream_t stream);
  // recv (recv_count) = op over ranks of send[rank * recv_count, (rank+1) * recv_count);
  // send holds size() * recv_count elements.
  void reduce_scatter(const void* send, void* recv, int64_t recv_count, NcclType type, NcclOp op,
                      cudaStream_t stream);

 private:
  NcclComm() = default;
  ncclComm* comm_ = nullptr;
  int rank_ = 0, size_ = 0, device_ = 0;
};

// Brackets collectives issued from one thread on several communicators (single-process
// multi-GPU), which NCCL requires to be grouped. end() reports errors; the destructor closes an
// unended group and ignores errors (it may run while an exception unwinds).
class NcclGroup {
 public:
  NcclGroup();
  ~NcclGroup();
  void end();
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;

 private:
  bool open_ = false;
};

}  // namespace tessera::cuda
