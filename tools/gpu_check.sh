#!/usr/bin/env bash
# The GPU node check, in two halves, because the node has no Bazel and no
# network:
#
#   tools/gpu_check.sh pack    # here: builds under --config=cuda (torch 2.11),
#                              # strips, packs into gpu_pack/ (git-ignored;
#                              # name it in the device tool's `carry`)
#   gpu_pack/run.sh            # on the node: runs the pack against the node's
#                              # own LibTorch (/opt/torch/.venv, torch 2.11.0)
#   tools/gpu_check.sh         # both, on a machine with Bazel and a GPU
#
# run.sh prints what it runs, stops at the first failure with a non-zero
# exit, and ends with exit 3 when it ran everything it has but a part of the
# check is not built yet (named in its output), so that an incomplete check
# never reads as a pass.
set -euo pipefail
cd "$(dirname "$0")/.."

pack() {
  local dir=gpu_pack
  local targets=(//comm:nccl_communicator_test //tools:harness)
  echo "== building ${targets[*]} (--config=cuda)"
  ./bazelw build --config=cuda "${targets[@]}"
  local bin
  bin="$(./bazelw info --config=cuda bazel-bin 2>/dev/null)"
  rm -rf "$dir"
  mkdir -p "$dir"
  cp "$bin/comm/nccl_communicator_test" "$bin/tools/harness" "$dir/"
  chmod u+w "$dir"/*
  strip "$dir/nccl_communicator_test" "$dir/harness"
  # The Debian libraries they need that the node may lack (liburing,
  # libstdc++ of GCC 12, ...), into lib/; glibc, LibTorch and CUDA stay
  # the node's own.
  mkdir -p "$dir/lib"
  ldd "$dir/nccl_communicator_test" "$dir/harness" | awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|librt|libpthread|libutil|ld-linux[^/]*)\.so|/torch[^/]*/|/libtorch-|/nvidia/|/cuda[^/]*/' |
    while read -r lib; do cp -L "$lib" "$dir/lib/"; done
  ls "$dir/lib"
  cp tools/gpu_run.sh "$dir/run.sh"
  cp third_party/libtorch/torch-*.txt "$dir/"
  du -sh "$dir"
  echo "packed: $dir (run $dir/run.sh on the node)"
}

case "${1:-all}" in
  pack) pack ;;
  all) pack && gpu_pack/run.sh ;;
  *) echo "usage: tools/gpu_check.sh [pack]" >&2; exit 2 ;;
esac
