"""Binds the CUDA toolkit (headers, cudart, NCCL) for --config=cuda.

CUDA_HOME selects the toolkit (default /usr/local/cuda). Only the top-level
headers and crt/ are declared: what cuda_runtime.h and nccl.h need.
"""

_BUILD = """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "cuda",
    hdrs = glob(["include/*.h", "include/*.hpp", "include/crt/**"]),
    includes = ["include"],
    linkopts = [
        "-L{home}/lib64",
        "-Wl,-rpath,{home}/lib64",
        "-lnccl",
        "-lcudart",
    ],
)
"""

_MISSING = """
package(default_visibility = ["//visibility:public"])

# No CUDA toolkit at {home}: targets that need it fail to compile
# (cuda_runtime.h not found). Fix: install it or set CUDA_HOME.
cc_library(name = "cuda")
"""

def _cuda_repository_impl(ctx):
    home = ctx.os.environ.get("CUDA_HOME", "/usr/local/cuda")
    if ctx.path(home + "/include/cuda_runtime.h").exists:
        ctx.symlink(home + "/include", "include")
        ctx.file("BUILD", _BUILD.format(home = home))
    else:
        ctx.file("BUILD", _MISSING.format(home = home))

cuda_repository = repository_rule(
    implementation = _cuda_repository_impl,
    environ = ["CUDA_HOME"],
    local = True,
)
