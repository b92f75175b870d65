"""What a Bazel workspace that depends on zerostep declares.

In WORKSPACE mode Bazel never reads a dependency's WORKSPACE, so a consumer
declares zerostep's repositories itself. After declaring zerostep:

    local_repository(name = "zerostep", path = "...")   # or http_archive
    load("@zerostep//third_party:consumer_deps.bzl", "zerostep_dependencies")
    zerostep_dependencies(zerostep_path = "...")

examples/consumer and examples/own_model do exactly this.
"""

load("//third_party/libtorch:libtorch.bzl", "libtorch_repository")

def zerostep_dependencies(zerostep_path):
    """Declares the repositories zerostep's targets need.

    Args:
      zerostep_path: zerostep's source tree, relative to the consumer's
        workspace root or absolute. Bazel 4 asks for rules_cc, rules_java
        and remote_coverage_tools even for native C++ rules; offline, each
        is bound to zerostep's local stand-in under third_party/ that
        re-exports the native rules. `libtorch` must be named exactly so:
        zerostep's //third_party:libtorch is an alias of @libtorch//:libtorch,
        resolved in the consumer's repository map (Debian's libtorch-dev by
        default; LIBTORCH_HOME selects another LibTorch).
    """
    for name in ["rules_cc", "rules_java", "remote_coverage_tools"]:
        native.local_repository(
            name = name,
            path = zerostep_path + "/third_party/" + name,
        )
    libtorch_repository(name = "libtorch")
