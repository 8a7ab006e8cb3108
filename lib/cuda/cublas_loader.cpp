#include "cuda/cublas_loader.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "core/error.hpp"

#ifndef FLASHATTN_CUDA_TOOLKIT_LIBDIR
#define FLASHATTN_CUDA_TOOLKIT_LIBDIR ""
#endif

namespace flashattn {
namespace cuda {

namespace {

// cuBLAS of the CUDA major version this library was compiled with: its enums and signatures
// are what the headers here describe.
constexpr int kCudaMajor = CUDART_VERSION / 1000;

std::mutex g_mutex;
CublasApi g_api;
bool g_loaded = false;
std::string g_path;

std::vector<std::string> candidates() {
  const std::string soname = "libcublas.so." + std::to_string(kCudaMajor);
  std::vector<std::string> c;
  c.push_back(soname);  // the loader's search path (LD_LIBRARY_PATH, ldconfig), or already loaded
  for (const char* env : {"CUDA_HOME", "CUDA_PATH"}) {
    const char* root = std::getenv(env);
    if (root != nullptr && root[0] != '\0') {
      c.push_back(std::string(root) + "/lib64/" + soname);
      c.push_back(std::string(root) + "/lib/" + soname);
    }
  }
  if (FLASHATTN_CUDA_TOOLKIT_LIBDIR[0] != '\0') {
    c.push_back(std::string(FLASHATTN_CUDA_TOOLKIT_LIBDIR) + "/" + soname);
  }
  c.push_back("/usr/local/cuda/lib64/" + soname);
  c.push_back("/usr/local/cuda-" + std::to_string(kCudaMajor) + "/lib64/" + soname);
  return c;
}

template <class F>
bool resolve(void* lib, const char* name, F* out, std::string* missing) {
  void* sym = dlsym(lib, name);
  if (sym == nullptr) {
    if (!missing->empty()) *missing += ", ";
    *missing += name;
    return false;
  }
  *out = reinterpret_cast<F>(sym);
  return true;
}

}  // namespace

const CublasApi& cublas() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_loaded) return g_api;

  std::string tried;
  for (const std::string& path : candidates()) {
    void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      tried += "\n  " + path + ": " + (why != nullptr ? why : "not found");
      continue;
    }
    CublasApi api;
    std::string missing;
    resolve(lib, "cublasCreate_v2", &api.create, &missing);
    resolve(lib, "cublasDestroy_v2", &api.destroy, &missing);
    resolve(lib, "cublasSetStream_v2", &api.set_stream, &missing);
    resolve(lib, "cublasSetWorkspace_v2", &api.set_workspace, &missing);
    resolve(lib, "cublasSetMathMode", &api.set_math_mode, &missing);
    resolve(lib, "cublasGetProperty", &api.get_property, &missing);
    resolve(lib, "cublasGetStatusString", &api.status_string, &missing);
    resolve(lib, "cublasGetStatusName", &api.status_name, &missing);
    resolve(lib, "cublasGemmStridedBatchedEx", &api.gemm_strided_batched, &missing);
    if (!missing.empty()) {
      tried += "\n  " + path + ": lacks " + missing;
      dlclose(lib);
      continue;
    }
    api.get_property(MAJOR_VERSION, &api.version_major);
    api.get_property(MINOR_VERSION, &api.version_minor);
    if (api.version_major != kCudaMajor) {
      tried += "\n  " + path + ": is cuBLAS " + std::to_string(api.version_major) + ", need " +
               std::to_string(kCudaMajor);
      dlclose(lib);
      continue;
    }
    // Never closed: cuBLAS keeps state until process exit, and handles may outlive contexts'
    // users in finalizers.
    g_path = path;
    api.path = g_path.c_str();
    g_api = api;
    g_loaded = true;
    return g_api;
  }
  fail(FLASHATTN_ERROR_BACKEND_UNAVAILABLE,
       "cannot load cuBLAS (libcublas.so.%d), which the CUDA backend needs; tried:%s", kCudaMajor,
       tried.c_str());
}

const char* cublas_status_text(cublasStatus_t status) {
  thread_local std::string text;
  const CublasApi& api = g_api;  // only called after a successful load
  const char* name = api.status_name != nullptr ? api.status_name(status) : nullptr;
  const char* desc = api.status_string != nullptr ? api.status_string(status) : nullptr;
  text = std::string(name != nullptr ? name : "CUBLAS_STATUS_?") + " (" +
         (desc != nullptr ? desc : "no description") + ")";
  return text.c_str();
}

}  // namespace cuda
}  // namespace flashattn
