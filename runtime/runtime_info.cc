#include "runtime/runtime_info.h"

#include <dlfcn.h>
#include <link.h>
#include <torch/torch.h>

#include <climits>
#include <cstdlib>
#include <sstream>
#include <string>

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

}  // namespace zerostep
