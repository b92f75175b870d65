"""Locates LibTorch for the build.

Three sources, first match wins:
- LIBTORCH_HOME: an unpacked LibTorch (include/, lib/), e.g. a GPU node's;
- ZEROSTEP_LIBTORCH=<version> (set by --config=cuda through --repo_env): the
  pinned PyPI LibTorch that third_party/libtorch/setup.sh <version> installs
  and links as libtorch-<version> in zerostep's cache (./bazelw runs it);
- otherwise Debian's libtorch-dev (headers under /usr/include, libraries on
  the default linker path).
A LibTorch other than Debian's has its lib/ on the rpath; when it is a CUDA
build (lib/libtorch_cuda.so), its CUDA libraries are linked too.
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
        # Before LibTorch: PyPI's libtorch.so exports its own static copy of
        # libstdc++'s std::filesystem, which crashes (remove_all jumps to
        # null) when the program's calls bind to it; listed first, the
        # system libstdc++ is found first.
        "-lstdc++",
        "-Wl,--no-as-needed",
        "-ltorch",
        "-ltorch_cpu",
        "-lc10",{cuda_libs}
        "-Wl,--as-needed",
        "-lpthread",
    ],
)
"""

def _cache_dirs(ctx):
    # The caches common/pinned_venv.sh may choose, in its order.
    dirs = ["/var/cache/zerostep"]
    xdg = ctx.os.environ.get("XDG_CACHE_HOME", "")
    user = ctx.os.environ.get("HOME", "/tmp")
    dirs.append((xdg if xdg != "" else user + "/.cache") + "/zerostep")
    return dirs

def _pinned_home(ctx, version):
    for d in _cache_dirs(ctx):
        link = d + "/libtorch-" + version
        if ctx.path(link + "/include/torch/csrc/api/include/torch/torch.h").exists:
            return str(ctx.path(link).realpath)
    fail(("LibTorch %s is not set up (no libtorch-%s in %s). " % (version, version, " or ".join(_cache_dirs(ctx)))) +
         ("Fix: run third_party/libtorch/setup.sh %s, or build through ./bazelw, " % version) +
         "which runs it for --config=cuda.")

def _libtorch_repository_impl(ctx):
    home = ctx.os.environ.get("LIBTORCH_HOME", "")
    pinned = ctx.os.environ.get("ZEROSTEP_LIBTORCH", "")
    if home == "" and pinned != "":
        home = _pinned_home(ctx, pinned)
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
    # Every include root but google/: PyPI's wheel bundles protobuf headers
    # there, which would shadow Debian's (the tinker protocol's generated
    # code is Debian's protoc's) in any target that also depends on LibTorch.
    # LibTorch's own headers do not include them.
    for entry in ctx.path(home + "/include").readdir():
        if entry.basename != "google":
            ctx.symlink(entry, "include/" + entry.basename)
    cuda_libs = ""
    if ctx.path(home + "/lib/libtorch_cuda.so").exists:
        cuda_libs = '\n        "-ltorch_cuda",\n        "-lc10_cuda",'
    ctx.file("BUILD", _HOME_BUILD.format(home = home, cuda_libs = cuda_libs))

libtorch_repository = repository_rule(
    implementation = _libtorch_repository_impl,
    environ = ["LIBTORCH_HOME", "ZEROSTEP_LIBTORCH", "HOME", "XDG_CACHE_HOME"],
    local = True,
)
