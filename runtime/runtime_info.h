// What the process computes with: the BLAS library LibTorch resolved at run
// time and the thread counts, so every tool can print them at start.
#ifndef ZEROSTEP_RUNTIME_RUNTIME_INFO_H_
#define ZEROSTEP_RUNTIME_RUNTIME_INFO_H_

#include <string>

namespace zerostep {

// Sets LibTorch's intra-op threads and, when OpenBLAS is loaded, its thread
// count to `threads` (Debian's LibTorch starts with 1 and resets OpenMP's).
void set_compute_threads(int threads);

// e.g. "blas=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3
// (OpenBLAS 0.3.21, 1 thread) torch_threads=1"
std::string runtime_info();

// The CUDA devices this process can use: 0 when LibTorch was built without
// CUDA (Debian's) or none is visible. `why_none`, when non-null and the
// count is 0, says which of the two.
int cuda_devices(std::string* why_none = nullptr);

// Checks that `device` ("cpu" or "cuda", the tools' --device flag) can be
// used in this process (cuda: a CUDA LibTorch and a visible device);
// throws UsageError naming the device, why not, and the fix. What the
// engine accepts on that device is the engine's check.
void check_engine_device(const std::string& device);

// Bitwise parity on a GPU: LibTorch's deterministic algorithms (an op
// without a deterministic CUDA kernel throws instead of racing) and
// CUBLAS_WORKSPACE_CONFIG=:4096:8 unless the environment sets it. Call
// before any CUDA work.
void use_deterministic_cuda();

}  // namespace zerostep

#endif  // ZEROSTEP_RUNTIME_RUNTIME_INFO_H_
