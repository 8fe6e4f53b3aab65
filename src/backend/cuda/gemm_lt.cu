// cuBLASLt GEMM: argument checks, the row-major to column-major mapping, a per-device handle,
// per-(device, stream) workspaces and the cache of heuristic algorithm choices.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm_lt.h"
#include "backend/cuda/memory_pool.h"
#include "backend/cuda/runtime.h"
#include "core/error.h"

namespace tessera::cuda {

const char* lt_type_name(LtType t) {
  switch (t) {
    case LtType::f32:
      return "f32";
    case LtType::bf16:
      return "bf16";
    case LtType::f16:
      return "f16";
    case LtType::e4m3:
      return "e4m3";
  }
  return "?";
}

size_t lt_type_bytes(LtType t) {
  switch (t) {
    case LtType::f32:
      return 4;
    case LtType::bf16:
    case LtType::f16:
      return 2;
    case LtType::e4m3:
      return 1;
  }
  return 0;
}

const char* lt_epilogue_name(LtEpilogue e) {
  switch (e) {
    case LtEpilogue::none:
      return "none";
    case LtEpilogue::bias:
      return "bias";
    case LtEpilogue::bias_gelu:
      return "bias_gelu";
    case LtEpilogue::bias_grad:
      return "bias_grad";
  }
  return "?";
}

bool check_gemm_lt_args(const LtGemmArgs& g) {
  TS_CHECK(g.m >= 0 && g.n >= 0, "[gemm_lt] negative size m=", g.m, " n=", g.n);
  TS_CHECK(g.k > 0, "[gemm_lt] k must be positive, got ", g.k);
  TS_CHECK(g.a_type == g.b_type, "[gemm_lt] a_type ", lt_type_name(g.a_type), " and b_type ",
           lt_type_name(g.b_type), " differ");
  const LtType in = g.a_type, out = g.c_type;
  const bool types_ok = (in == LtType::bf16 && (out == LtType::bf16 || out == LtType::f32)) ||
                        (in == LtType::f16 && (out == LtType::f16 || out == LtType::f32)) ||
                        (in == LtType::f32 && out == LtType::f32) ||
                        (in == LtType::e4m3 && out != LtType::e4m3);
  TS_CHECK(types_ok, "[gemm_lt] unsupported c_type ", lt_type_name(out), " for inputs ",
           lt_type_name(in));
  if (g.m == 0 || g.n == 0) return false;
  const int64_t a_cols = g.trans_a ? g.m : g.k;
  const int64_t b_cols = g.trans_b ? g.k : g.n;
  TS_CHECK(g.lda >= a_cols, "[gemm_lt] lda ", g.lda, " < ", a_cols);
  TS_CHECK(g.ldb >= b_cols, "[gemm_lt] ldb ", g.ldb, " < ", b_cols);
  TS_CHECK(g.ldc >= g.n, "[gemm_lt] ldc ", g.ldc, " < n ", g.n);
  TS_CHECK(g.a != nullptr, "[gemm_lt] a is null");
  TS_CHECK(g.b != nullptr, "[gemm_lt] b is null");
  TS_CHECK(g.c != nullptr, "[gemm_lt] c is null");
  TS_CHECK(g.epilogue == LtEpilogue::none || g.bias != nullptr, "[gemm_lt] epilogue ",
           lt_epilogue_name(g.epilogue), " needs bias");
  TS_CHECK(g.epilogue != LtEpilogue::none || g.bias == nullptr,
           "[gemm_lt] bias is set but the epilogue is none (it would be ignored)");
  // cuBLASLt's BGRADB reduces its B operand (our a) over k, which it supports only with B
  // transposed: our a stored (K, M), the wgrad form dW = dy^T x.
  TS_CHECK(g.epilogue != LtEpilogue::bias_grad || g.trans_a,
           "[gemm_lt] epilogue bias_grad needs trans_a (the dW = dy^T x form)");
  TS_CHECK(g.gelu_input == nullptr || g.epilogue == LtEpilogue::bias_gelu,
           "[gemm_lt] gelu_input is only written by the bias_gelu epilogue");
  if (g.gelu_input)
    TS_CHECK(g.ld_gelu_input >= g.n && g.ld_gelu_input % 8 == 0, "[gemm_lt] ld_gelu_input ",
             g.ld_gelu_input, " must be >= n ", g.n, " and a multiple of 8");
  if (in == LtType::e4m3) {
    TS_CHECK(!g.trans_a && g.trans_b,
             "[gemm_lt] e4m3 supports only the y = x W^T form (trans_a false, trans_b true)");
    TS_CHECK(g.k % 16 == 0, "[gemm_lt] e4m3 needs k a multiple of 16, got ", g.k);
    TS_CHECK(g.lda % 16 == 0 && g.ldb % 16 == 0,
             "[gemm_lt] e4m3 needs lda and ldb multiples of "
             "16, got ",
             g.lda, " and ", g.ldb);
    TS_CHECK(g.epilogue == LtEpilogue::none || g.epilogue == LtEpilogue::bias,
             "[gemm_lt] e4m3 supports epilogues none and bias, got ", lt_epilogue_name(g.epilogue));
    TS_CHECK(g.epilogue == LtEpilogue::none || out != LtType::f32,
             "[gemm_lt] e4m3 with a bias needs c_type bf16 or f16");
  } else {
    TS_CHECK(g.a_scale == nullptr && g.b_scale == nullptr,
             "[gemm_lt] a_scale/b_scale apply to e4m3 inputs only");
  }
  return true;
}

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

cudaDataType_t to_cuda(LtType t) {
  switch (t) {
    case LtType::f32:
      return CUDA_R_32F;
    case LtType::bf16:
      return CUDA_R_16BF;
    case LtType::f16:
      return CUDA_R_16F;
    case LtType::e4m3:
      return CUDA_R_8F_E4M3;
  }
  return CUDA_R_32F;
}

cublasLtEpilogue_t to_cublas(LtEpilogue e, bool save_gelu_input) {
  switch (e) {
    case LtEpilogue::none:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case LtEpilogue::bias:
      return CUBLASLT_EPILOGUE_BIAS;
    case LtEpilogue::bias_gelu:
      return save_gelu_input ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS;
    // Row sums of op(a) reduce cuBLAS's second operand (our a) over k: BGRADB.
    case LtEpilogue::bias_grad:
      return CUBLASLT_EPILOGUE_BGRADB;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// Largest power of two (up to 256) dividing the address: cuBLASLt assumes 256-byte alignment
// unless told otherwise, and its heuristic must not pick a kernel that needs more than we have.
uint32_t alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && (a % al) != 0) al /= 2;
  return al;
}

// Everything the heuristic's choice depends on.
using PlanKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int,
                           int, int, int64_t, uint32_t, uint32_t, uint32_t, uint32_t, uint32_t>;

PlanKey make_key(const LtGemmArgs& g) {
  return PlanKey{g.trans_a,
                 g.trans_b,
                 g.m,
                 g.n,
                 g.k,
                 g.lda,
                 g.ldb,
                 g.ldc,
                 static_cast<int>(g.a_type),
                 static_cast<int>(g.c_type),
                 static_cast<int>(g.epilogue) * 2 + (g.gelu_input ? 1 : 0),
                 g.gelu_input ? g.ld_gelu_input : 0,
                 alignment(g.a),
                 alignment(g.b),
                 alignment(g.c),
                 g.bias ? alignment(g.bias) : 256u,
                 g.gelu_input ? alignment(g.gelu_input) : 256u};
}

// Descriptors and the chosen algorithm for one problem. Pointer attributes (bias, scales, aux)
// are set on the descriptor at each call, under the device's lock.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLAS's A, B, C (= D)
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

struct DeviceState {
  int device = 0;
  int sm = 0;  // major * 10 + minor
  cublasLtHandle_t handle = nullptr;
  std::mutex mu;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
  std::map<cudaStream_t, DeviceBuffer> workspaces;
};

// One state per device, created on first use and never destroyed (handles must not be torn
// down during static destruction, after the runtime may be gone).
struct AllStates {
  std::mutex mu;
  std::map<int, std::unique_ptr<DeviceState>> by_device;
};
AllStates& all_states() {
  static auto* states = new AllStates();
  return *states;
}

DeviceState& state_for_current_device() {
  AllStates& all = all_states();
  const int dev = current_device();
  std::lock_guard<std::mutex> lock(all.mu);
  auto& s = all.by_device[dev];
  if (!s) {
    auto st = std::make_unique<DeviceState>();
    st->device = dev;
    int major = 0, minor = 0;
    TS_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    TS_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    st->sm = major * 10 + minor;
    TS_CUBLAS_CHECK(cublasLtCreate(&st->handle));
    s = std::move(st);
  }
  return *s;
}

template <typename T>
void set_desc(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v) {
  TS_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
}

std::string describe(const LtGemmArgs& g) {
  return cat("m=", g.m, " n=", g.n, " k=", g.k, " trans_a=", g.trans_a, " trans_b=", g.trans_b,
             " lda=", g.lda, " ldb=", g.ldb, " ldc=", g.ldc, " ", lt_type_name(g.a_type), "->",
             lt_type_name(g.c_type), " epilogue=", lt_epilogue_name(g.epilogue));
}

std::unique_ptr<Plan> make_plan(DeviceState& st, const LtGemmArgs& g) {
  const ColMajorGemm cm = to_col_major(g.trans_a, g.trans_b, g.m, g.n, g.k, g.lda, g.ldb, g.ldc);
  auto plan = std::make_unique<Plan>();
  TS_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const int32_t ta = cm.op_t_first ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int32_t tb = cm.op_t_second ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_desc(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, ta);
  set_desc(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, tb);
  const uint32_t epi = to_cublas(g.epilogue, g.gelu_input != nullptr);
  set_desc(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE, epi);
  // The heuristic reads pointer attributes for their alignment, so set them now too.
  if (g.bias) set_desc(plan->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
  if (g.gelu_input) {
    set_desc(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.gelu_input);
    set_desc(plan->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.ld_gelu_input);
  }

  const cudaDataType_t in = to_cuda(g.a_type);
  const cudaDataType_t out = to_cuda(g.c_type);
  TS_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&plan->a, in, cm.first_rows, cm.first_cols, cm.first_ld));
  TS_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&plan->b, in, cm.second_rows, cm.second_cols, cm.second_ld));
  TS_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->c, out, cm.c_rows, cm.c_cols, cm.c_ld));

  cublasLtMatmulPreference_t pref = nullptr;
  TS_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  struct PrefGuard {
    cublasLtMatmulPreference_t p;
    ~PrefGuard() { cublasLtMatmulPreferenceDestroy(p); }
  } pref_guard{pref};
  const uint64_t ws = kWorkspaceBytes;
  TS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // cuBLAS's A is our b, its B our a; C and D are both our c.
  const uint32_t al_a = alignment(g.b), al_b = alignment(g.a), al_c = alignment(g.c);
  TS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
  TS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
  TS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)));
  TS_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c)));

  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st_h = cublasLtMatmulAlgoGetHeuristic(
      st.handle, plan->op, plan->a, plan->b, plan->c, plan->c, pref, 1, &result, &found);
  TS_CHECK(st_h == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS,
           "[gemm_lt] cuBLASLt has no algorithm for ", describe(g), " (status ",
           static_cast<int>(st_h), ", result state ", static_cast<int>(result.state), ", sm_",
           st.sm, ")");
  plan->algo = result.algo;
  plan->workspace = result.workspaceSize;
  return plan;
}

}  // namespace

void gemm_lt(const LtGemmArgs& g, cudaStream_t stream) {
  if (!check_gemm_lt_args(g)) return;
  DeviceState& st = state_for_current_device();
  if (g.a_type == LtType::e4m3)
    TS_CHECK(st.sm >= 89, "[gemm_lt] e4m3 inputs need an sm_89+ GPU (Ada or Hopper); device ",
             st.device, " is sm_", st.sm);

  std::lock_guard<std::mutex> lock(st.mu);
  auto& slot = st.plans[make_key(g)];
  if (!slot) slot = make_plan(st, g);
  Plan& plan = *slot;

  if (g.bias) set_desc(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias);
  if (g.gelu_input) set_desc(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.gelu_input);
  if (g.a_type == LtType::e4m3) {
    // cuBLAS's A is our b: the scales swap places too.
    set_desc(plan.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, g.b_scale);
    set_desc(plan.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, g.a_scale);
  }

  void* workspace = nullptr;
  if (plan.workspace > 0) {
    // Keyed by the stream handle: a stream destroyed and another created at the same address
    // inherits the workspace, which is safe once the old stream's work has finished.
    auto it = st.workspaces.find(stream);
    if (it == st.workspaces.end())
      it = st.workspaces
               .emplace(stream,
                        DeviceBuffer(MemoryPool::for_device(st.device), kWorkspaceBytes, stream))
               .first;
    workspace = it->second.get();
  }

  const float alpha = g.alpha;
  const float beta = g.accumulate ? 1.0f : 0.0f;
  // cuBLAS's A = our b, B = our a.
  TS_CUBLAS_CHECK(cublasLtMatmul(st.handle, plan.op, &alpha, g.b, plan.a, g.a, plan.b, &beta, g.c,
                                 plan.c, g.c, plan.c, &plan.algo, workspace,
                                 workspace ? kWorkspaceBytes : 0, stream));
}

void gemm_lt_retire_stream(cudaStream_t stream) noexcept {
  AllStates& all = all_states();
  std::lock_guard<std::mutex> lock(all.mu);
  for (auto& [dev, st] : all.by_device) {
    std::lock_guard<std::mutex> st_lock(st->mu);
    st->workspaces.erase(stream);  // back to the pool, under the stream's own key
  }
}

size_t gemm_lt_workspaces() {
  DeviceState& st = state_for_current_device();
  std::lock_guard<std::mutex> lock(st.mu);
  return st.workspaces.size();
}

size_t gemm_lt_cached_plans() {
  DeviceState& st = state_for_current_device();
  std::lock_guard<std::mutex> lock(st.mu);
  return st.plans.size();
}

}  // namespace tessera::cuda
