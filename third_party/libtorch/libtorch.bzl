"""Locates LibTorch for the build.

Default: Debian's libtorch-dev (headers under /usr/include, libraries on the
default linker path). With LIBTORCH_HOME set to an unpacked LibTorch
(include/, lib/), that one is used instead and its lib/ goes on the rpath.
"""

_DEBIAN_BUILD = """
package(default_visibility = ["//visibility:public"])

# Debian installs ATen/c10 headers under /usr/include, which the compiler
# already searches. The C++ frontend's include root is linked in as
# api_include/ and declared, so that `includes` reaches every dependent.
cc_library(
    name = "libtorch",
    hdrs = glob(["api_include/**"]),
    includes = ["api_include"],
    linkopts = ["-ltorch", "-ltorch_cpu", "-lc10", "-lpthread"],
)
"""

_HOME_BUILD = """
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "libtorch",
    hdrs = glob(["include/**"]),
    includes = ["include", "include/torch/csrc/api/include"],
    linkopts = [
        "-L{home}/lib",
        "-Wl,-rpath,{home}/lib",
        "-Wl,--no-as-needed",
        "-ltorch",
        "-ltorch_cpu",
        "-lc10",
        "-Wl,--as-needed",
        "-lpthread",
    ],
)
"""

def _libtorch_repository_impl(ctx):
    home = ctx.os.environ.get("LIBTORCH_HOME", "")
    if home == "":
        if not ctx.path("/usr/include/torch/csrc/api/include/torch/torch.h").exists:
            fail("LibTorch not found: /usr/include/torch/csrc/api/include/torch/torch.h is missing. " +
                 "Fix: run ./bazelw (it installs Debian's libtorch-dev), or set LIBTORCH_HOME " +
                 "to an unpacked LibTorch.")
        ctx.symlink("/usr/include/torch/csrc/api/include", "api_include")
        ctx.file("BUILD", _DEBIAN_BUILD)
        return
    if not ctx.path(home + "/include/torch/csrc/api/include/torch/torch.h").exists:
        fail("LIBTORCH_HOME=%s is not a LibTorch: include/torch/csrc/api/include/torch/torch.h is missing. " % home +
             "Fix: point LIBTORCH_HOME at the folder that holds include/ and lib/.")
    ctx.symlink(home + "/include", "include")
    ctx.file("BUILD", _HOME_BUILD.format(home = home))

libtorch_repository = repository_rule(
    implementation = _libtorch_repository_impl,
    environ = ["LIBTORCH_HOME"],
    local = True,
)
