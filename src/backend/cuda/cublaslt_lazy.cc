// The cuBLASLt entry points the backend calls, loaded with dlopen on first use instead of linked.
// Why: linking libcublasLt maps and initializes it in every process, and its static data alone
// made a CPU-only `tessera generate` about 146 MB larger in resident memory (62 MB of library
// pages and 84 MB of zeroed data it touches at load), more than the KV cache of most runs.
// Each function here has the header's signature and forwards to the library's own.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <string>

#include "backend/cuda/gemm_lt.h"
#include "core/error.h"

namespace tessera::cuda {
namespace {

// The library's soname for the toolkit we compiled against (libcublasLt.so.13 for CUDA 13).
const std::string& library_name() {
  static const std::string name = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
  return name;
}

// Loaded once: by soname (LD_LIBRARY_PATH, the executable's run path, ld.so.cache), then next to
// the libcudart this process uses (the toolkit's lib folder, often outside the loader's paths).
void* library() {
  static void* const handle = [] {
    if (void* h = dlopen(library_name().c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    const std::string first = dlerror();
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&cudaGetDeviceCount), &info) && info.dli_fname) {
      std::string dir = info.dli_fname;
      dir = dir.substr(0, dir.find_last_of('/') + 1);
      if (void* h = dlopen((dir + library_name()).c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    }
    fail("[cuda] cannot load ", library_name(), " (cuBLASLt, for the GEMMs): ", first);
  }();
  return handle;
}

template <typename Fn>
Fn resolve(const char* name) {
  void* p = dlsym(library(), name);
  TS_CHECK(p != nullptr, "[cuda] ", library_name(), " has no symbol ", name);
  return reinterpret_cast<Fn>(p);
}

}  // namespace
}  // namespace tessera::cuda

namespace lt = tessera::cuda;

// One forwarding definition per entry point: resolved on its first call, then a plain call.
#define TS_CUBLASLT_FORWARD(name, params, args)                   \
  cublasStatus_t CUBLASWINAPI name params {                       \
    static const auto fn = lt::resolve<decltype(&::name)>(#name); \
    return fn args;                                               \
  }

TS_CUBLASLT_FORWARD(cublasLtCreate, (cublasLtHandle_t * h), (h))
TS_CUBLASLT_FORWARD(cublasLtDestroy, (cublasLtHandle_t h), (h))
TS_CUBLASLT_FORWARD(cublasLtMatmul,
                    (cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void* alpha,
                     const void* A, cublasLtMatrixLayout_t Adesc, const void* B,
                     cublasLtMatrixLayout_t Bdesc, const void* beta, const void* C,
                     cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
                     const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                     cudaStream_t stream),
                    (h, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace,
                     workspace_bytes, stream))
TS_CUBLASLT_FORWARD(cublasLtMatrixLayoutCreate,
                    (cublasLtMatrixLayout_t * layout, cudaDataType type, uint64_t rows,
                     uint64_t cols, int64_t ld),
                    (layout, type, rows, cols, ld))
TS_CUBLASLT_FORWARD(cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t layout), (layout))
TS_CUBLASLT_FORWARD(cublasLtMatmulDescCreate,
                    (cublasLtMatmulDesc_t * desc, cublasComputeType_t compute,
                     cudaDataType_t scale),
                    (desc, compute, scale))
TS_CUBLASLT_FORWARD(cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t desc), (desc))
TS_CUBLASLT_FORWARD(cublasLtMatmulDescSetAttribute,
                    (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                     const void* buf, size_t bytes),
                    (desc, attr, buf, bytes))
TS_CUBLASLT_FORWARD(cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * pref), (pref))
TS_CUBLASLT_FORWARD(cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref), (pref))
TS_CUBLASLT_FORWARD(cublasLtMatmulPreferenceSetAttribute,
                    (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
                     const void* buf, size_t bytes),
                    (pref, attr, buf, bytes))
TS_CUBLASLT_FORWARD(cublasLtMatmulAlgoGetHeuristic,
                    (cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,
                     cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc,
                     cublasLtMatrixLayout_t Ddesc, cublasLtMatmulPreference_t pref, int requested,
                     cublasLtMatmulHeuristicResult_t results[], int* returned),
                    (h, desc, Adesc, Bdesc, Cdesc, Ddesc, pref, requested, results, returned))

#undef TS_CUBLASLT_FORWARD

void tessera::cuda::load_cublaslt_entry_points() {
  for (const char* name :
       {"cublasLtCreate", "cublasLtDestroy", "cublasLtMatmul", "cublasLtMatrixLayoutCreate",
        "cublasLtMatrixLayoutDestroy", "cublasLtMatmulDescCreate", "cublasLtMatmulDescDestroy",
        "cublasLtMatmulDescSetAttribute", "cublasLtMatmulPreferenceCreate",
        "cublasLtMatmulPreferenceDestroy", "cublasLtMatmulPreferenceSetAttribute",
        "cublasLtMatmulAlgoGetHeuristic"})
    resolve<void (*)()>(name);
}
