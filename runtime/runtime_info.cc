#include "runtime/runtime_info.h"

#include <dlfcn.h>
#include <link.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <climits>
#include <cstdlib>
#include <sstream>
#include <string>

#include "common/errors.h"

namespace zerostep {
namespace {

int find_blas(struct dl_phdr_info* info, size_t, void* data) {
  std::string name = info->dlpi_name ? info->dlpi_name : "";
  if (name.find("libblas") != std::string::npos ||
      name.find("libopenblas") != std::string::npos) {
    auto* out = static_cast<std::string*>(data);
    if (out->empty()) {
      char resolved[PATH_MAX];
      *out = realpath(name.c_str(), resolved) ? resolved : name;
    }
  }
  return 0;
}

int find_torch_cuda(struct dl_phdr_info* info, size_t, void* data) {
  const std::string name = info->dlpi_name ? info->dlpi_name : "";
  if (name.find("libtorch_cuda") != std::string::npos)
    *static_cast<bool*>(data) = true;
  return 0;
}

}  // namespace

void set_compute_threads(int threads) {
  torch::set_num_threads(threads);
  using SetThreads = void (*)(int);
  if (auto f = reinterpret_cast<SetThreads>(
          dlsym(RTLD_DEFAULT, "openblas_set_num_threads")))
    f(threads);
}

std::string runtime_info() {
  std::string blas;
  dl_iterate_phdr(find_blas, &blas);
  std::ostringstream os;
  os << "blas=" << (blas.empty() ? "(none loaded)" : blas);
  using GetConfig = char* (*)();
  using GetThreads = int (*)();
  if (auto f = reinterpret_cast<GetConfig>(
          dlsym(RTLD_DEFAULT, "openblas_get_config")))
    os << " (" << f() << ")";
  if (auto f = reinterpret_cast<GetThreads>(
          dlsym(RTLD_DEFAULT, "openblas_get_num_threads")))
    os << " blas_threads=" << f();
  os << " torch_threads=" << torch::get_num_threads();
  return os.str();
}

int cuda_devices(std::string* why_none) {
  const int n = static_cast<int>(torch::cuda::device_count());
  if (n == 0 && why_none != nullptr) {
    // at::hasCUDA() is false without a driver too, so ask whether the
    // process loaded LibTorch's CUDA library instead.
    bool cuda_lib = false;
    dl_iterate_phdr(find_torch_cuda, &cuda_lib);
    *why_none = cuda_lib ? "no CUDA device is visible to this process "
                           "(LibTorch " + std::string(TORCH_VERSION) +
                               " has CUDA; no GPU or no driver here)"
                         : "this LibTorch (" + std::string(TORCH_VERSION) +
                               ") was built without CUDA";
  }
  return n;
}

void check_engine_device(const std::string& device) {
  if (device == "cpu") return;
  if (device != "cuda")
    throw UsageError("--device=" + device + ": not one of cpu, cuda");
  std::string why;
  if (cuda_devices(&why) == 0)
    throw UsageError("--device=cuda: " + why +
                     ". Fix: run on a GPU node (tools/gpu_check.sh packs a "
                     "build for one), or drop --device to run on the CPU.");
}

void use_deterministic_cuda() {
  // cuBLAS picks reduction orders per workspace unless told this (CUDA's
  // documented requirement for reproducible GEMMs); it is read when cuBLAS
  // first starts, so before any CUDA work.
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
}

}  // namespace zerostep
