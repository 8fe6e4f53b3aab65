// NCCL communicators and collectives; without NCCL (TESSERA_HAVE_NCCL unset) every entry throws.
#include <cuda_runtime.h>

#include <cstring>
#include <string>
#include <utility>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/nccl_comm.h"
#include "backend/cuda/runtime.h"
#include "core/error.h"

#if TESSERA_HAVE_NCCL
#include <nccl.h>
#endif

namespace tessera::cuda {

#if TESSERA_HAVE_NCCL

static_assert(sizeof(NcclId) == sizeof(ncclUniqueId), "NcclId must hold an ncclUniqueId");

void fail_nccl(int result, const char* expr, const char* file, int line) {
  const char* last = ncclGetLastError(nullptr);
  fail("[nccl] ", expr, " failed at ", file, ":", line, ": ",
       ncclGetErrorString(static_cast<ncclResult_t>(result)),
       (last && *last) ? cat(" (", last, ")") : std::string());
}

bool nccl_available() {
  return true;
}

namespace {

ncclDataType_t to_nccl(NcclType t) {
  return t == NcclType::bf16 ? ncclBfloat16 : ncclFloat32;
}

ncclRedOp_t to_nccl(NcclOp op) {
  return op == NcclOp::avg ? ncclAvg : ncclSum;
}

}  // namespace

NcclId nccl_make_id() {
  ncclUniqueId id;
  TS_NCCL_CHECK(ncclGetUniqueId(&id));
  NcclId out;
  static_assert(sizeof(out.bytes) == sizeof(id.internal));
  std::memcpy(out.bytes, id.internal, sizeof(out.bytes));
  return out;
}

NcclComm::NcclComm(const NcclId& id, int rank, int size, int device) {
  TS_CHECK(size >= 1, "[nccl] size must be >= 1, got ", size);
  TS_CHECK(rank >= 0 && rank < size, "[nccl] rank ", rank, " out of range for size ", size);
  DeviceGuard guard(device);
  ncclUniqueId uid;
  std::memcpy(uid.internal, id.bytes, sizeof(uid.internal));
  TS_NCCL_CHECK(ncclCommInitRank(&comm_, size, uid, rank));
  rank_ = rank;
  size_ = size;
  device_ = device;
}

std::vector<NcclComm> NcclComm::init_all(const std::vector<int>& devices) {
  TS_CHECK(!devices.empty(), "[nccl] init_all: no devices given");
  const int n = device_count();
  for (int d : devices)
    TS_CHECK(d >= 0 && d < n, "[nccl] init_all: device ", d, " out of range (", n, " devices)");
  std::vector<ncclComm_t> comms(devices.size(), nullptr);
  TS_NCCL_CHECK(ncclCommInitAll(comms.data(), static_cast<int>(devices.size()), devices.data()));
  std::vector<NcclComm> out;
  out.reserve(devices.size());
  for (size_t i = 0; i < devices.size(); ++i) {
    NcclComm c;
    c.comm_ = comms[i];
    c.rank_ = static_cast<int>(i);
    c.size_ = static_cast<int>(devices.size());
    c.device_ = devices[i];
    out.push_back(std::move(c));
  }
  return out;
}

NcclComm::~NcclComm() {
  if (comm_) ncclCommDestroy(comm_);
}

NcclComm::NcclComm(NcclComm&& o) noexcept
    : comm_(o.comm_), rank_(o.rank_), size_(o.size_), device_(o.device_) {
  o.comm_ = nullptr;
}

NcclComm& NcclComm::operator=(NcclComm&& o) noexcept {
  if (this != &o) {
    if (comm_) ncclCommDestroy(comm_);
    comm_ = o.comm_;
    rank_ = o.rank_;
    size_ = o.size_;
    device_ = o.device_;
    o.comm_ = nullptr;
  }
  return *this;
}

void NcclComm::all_reduce(const void* send, void* recv, int64_t count, NcclType type, NcclOp op,
                          cudaStream_t stream) {
  TS_CHECK(comm_ != nullptr, "[nccl] all_reduce on a moved-from communicator");
  TS_CHECK(count >= 0, "[nccl] all_reduce: negative count ", count);
  if (count == 0) return;
  TS_CHECK(send != nullptr && recv != nullptr, "[nccl] all_reduce: null buffer");
  DeviceGuard guard(device_);
  TS_NCCL_CHECK(ncclAllReduce(send, recv, static_cast<size_t>(count), to_nccl(type), to_nccl(op),
                              comm_, stream));
}

void NcclComm::reduce_scatter(const void* send, void* recv, int64_t recv_count, NcclType type,
                              NcclOp op, cudaStream_t stream) {
  TS_CHECK(comm_ != nullptr, "[nccl] reduce_scatter on a moved-from communicator");
  TS_CHECK(recv_count >= 0, "[nccl] reduce_scatter: negative recv_count ", recv_count);
  if (recv_count == 0) return;
  TS_CHECK(send != nullptr && recv != nullptr, "[nccl] reduce_scatter: null buffer");
  DeviceGuard guard(device_);
  TS_NCCL_CHECK(ncclReduceScatter(send, recv, static_cast<size_t>(recv_count), to_nccl(type),
                                  to_nccl(op), comm_, stream));
}

NcclGroup::NcclGroup() {
  TS_NCCL_CHECK(ncclGroupStart());
  open_ = true;
}

NcclGroup::~NcclGroup() {
  if (open_) ncclGroupEnd();
}

void NcclGroup::end() {
  TS_CHECK(open_, "[nccl] group ended twice");
  open_ = false;
  TS_NCCL_CHECK(ncclGroupEnd());
}

#else  // built without NCCL

namespace {
[[noreturn]] void no_nccl(const char* what) {
  fail("[nccl] ", what, ": built without NCCL (libnccl was not found at configure time)");
}
}  // namespace

void fail_nccl(int result, const char* expr, const char* file, int line) {
  fail("[nccl] ", expr, " failed at ", file, ":", line, ": result ", result);
}

bool nccl_available() {
  return false;
}

NcclId nccl_make_id() {
  no_nccl("nccl_make_id");
}

NcclComm::NcclComm(const NcclId&, int, int, int) {
  no_nccl("NcclComm");
}

std::vector<NcclComm> NcclComm::init_all(const std::vector<int>&) {
  no_nccl("init_all");
}

NcclComm::~NcclComm() = default;

NcclComm::NcclComm(NcclComm&& o) noexcept
    : comm_(o.comm_), rank_(o.rank_), size_(o.size_), device_(o.device_) {
  o.comm_ = nullptr;
}

NcclComm& NcclComm::operator=(NcclComm&& o) noexcept {
  comm_ = o.comm_;
  rank_ = o.rank_;
  size_ = o.size_;
  device_ = o.device_;
  o.comm_ = nullptr;
  return *this;
}

void NcclComm::all_reduce(const void*, void*, int64_t, NcclType, NcclOp, cudaStream_t) {
  no_nccl("all_reduce");
}

void NcclComm::reduce_scatter(const void*, void*, int64_t, NcclType, NcclOp, cudaStream_t) {
  no_nccl("reduce_scatter");
}

NcclGroup::NcclGroup() {
  no_nccl("NcclGroup");
}

NcclGroup::~NcclGroup() = default;

void NcclGroup::end() {
  no_nccl("NcclGroup::end");
}

#endif

}  // namespace tessera::cuda
