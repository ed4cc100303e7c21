// CUDA emulator (tests only): cuBLAS GemmEx and the dlopen/dlsym stand-ins (cublas_v2.h).
#include "cublas_v2.h"

#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "cuda_bf16.h"

struct cublasContext {
  cudaStream_t stream = nullptr;
};

namespace emu {
namespace {

float Element(const void* p, cudaDataType t, int64_t i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(p)[i];
  return __bfloat162float(__ushort_as_bfloat16(static_cast<const uint16_t*>(p)[i]));
}

}  // namespace
}  // namespace emu

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t, void*, size_t) { return CUBLAS_STATUS_SUCCESS; }

// C[m, n] = alpha · op(A)[m, k] · op(B)[k, n] + beta · C, column-major, f32 accumulation.
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t, cublasGemmAlgo_t) {
  if (Ctype != CUDA_R_32F || (Atype != CUDA_R_32F && Atype != CUDA_R_16BF) ||
      (Btype != CUDA_R_32F && Btype != CUDA_R_16BF) || transa == CUBLAS_OP_C ||
      transb == CUBLAS_OP_C || m < 0 || n < 0 || k < 0) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const float al = *static_cast<const float*>(alpha), be = *static_cast<const float*>(beta);
  emu::EnqueueOnStream(handle->stream, [=] {
    std::vector<float> b(size_t(n) * k), a_row(k);  // op(B) as columns of k floats
    for (int j = 0; j < n; ++j) {
      for (int p = 0; p < k; ++p) {
        b[size_t(j) * k + p] = emu::Element(B, Btype, transb == CUBLAS_OP_N ? int64_t(j) * ldb + p : int64_t(p) * ldb + j);
      }
    }
    float* c = static_cast<float*>(C);
    for (int i = 0; i < m; ++i) {
      for (int p = 0; p < k; ++p) {
        a_row[p] = emu::Element(A, Atype, transa == CUBLAS_OP_N ? int64_t(p) * lda + i : int64_t(i) * lda + p);
      }
      for (int j = 0; j < n; ++j) {
        const float* bj = b.data() + size_t(j) * k;
        float acc = 0.0f;
        for (int p = 0; p < k; ++p) acc += a_row[p] * bj[p];
        float& out = c[int64_t(j) * ldc + i];
        out = al * acc + (be == 0.0f ? 0.0f : be * out);
      }
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusString(cublasStatus_t status) {
  return status == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_NOT_SUPPORTED";
}

// dlopen/dlsym as the emulator build of cuda_backend.cc calls them: the "library" is this file.
extern "C" void* EmuDlopen(const char* name, int) {
  static int handle;
  return std::strstr(name, "libcublas") ? &handle : nullptr;
}
extern "C" char* EmuDlerror() { return const_cast<char*>("emu: only cuBLAS can be opened"); }
extern "C" void* EmuDlsym(void*, const char* name) {
  struct Sym {
    const char* name;
    void* fn;
  };
  static const Sym syms[] = {
      {"cublasCreate_v2", reinterpret_cast<void*>(&cublasCreate_v2)},
      {"cublasDestroy_v2", reinterpret_cast<void*>(&cublasDestroy_v2)},
      {"cublasSetStream_v2", reinterpret_cast<void*>(&cublasSetStream_v2)},
      {"cublasSetWorkspace_v2", reinterpret_cast<void*>(&cublasSetWorkspace_v2)},
      {"cublasGemmEx", reinterpret_cast<void*>(&cublasGemmEx)},
      {"cublasGetStatusString", reinterpret_cast<void*>(&cublasGetStatusString)},
  };
  for (const Sym& s : syms) {
    if (std::strcmp(s.name, name) == 0) return s.fn;
  }
  return nullptr;
}
