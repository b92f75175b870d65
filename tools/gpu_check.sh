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

# DeepSpeed for the node (issue 12 item 8), which has no network: PyPI has
# DeepSpeed 0.19.8 as an sdist only, so it is built here into a pure-Python
# wheel (DS_BUILD_OPS=0: no op compiled; the benchmark uses PyTorch's fused
# AdamW, so none is JIT-built there either), with the wheels of its needs
# that the node's /opt/torch/.venv lacks (for its Python 3.12). Needs PyPI;
# without it the pack goes on and wheels/MISSING says why, which run.sh
# reports.
deepspeed_wheels() {
  local out="$1" tmp
  tmp="$(mktemp -d)"
  mkdir -p "$out"
  local plat=(--only-binary=:all: --python-version 3.12 --implementation cp
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
  if python3 -m pip download -q --no-deps --no-binary=:all: -d "$tmp" deepspeed==0.19.8 &&
    DS_BUILD_OPS=0 python3 -m pip wheel -q --no-deps -w "$out" "$tmp"/deepspeed-0.19.8.tar.gz &&
    python3 -m pip download -q --no-deps "${plat[@]}" -d "$out" \
      pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 \
      typing-inspection==0.4.5 typing-extensions==4.16.0 hjson==3.1.0; then
    rm -f "$out/MISSING"
  else
    echo "DeepSpeed 0.19.8's wheels could not be made when packing (pip download/wheel failed: no PyPI?)" >"$out/MISSING"
  fi
  rm -rf "$tmp"
  ls "$out"
}

# transformers for the node (the GPU benchmark's Llama on the FSDP2 and
# DeepSpeed sides, which load the folder that make_hf_model writes there):
# the wheels of models/hf_py_requirements.txt for the node's Python 3.12
# (no torch: the node has its own). Needs PyPI; without it the pack goes on
# and wheels/hf/MISSING says why, which run.sh reports.
hf_wheels() {
  local out="$1"
  mkdir -p "$out"
  if grep -v -E '^(#|$)' models/hf_py_requirements.txt |
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d "$out" -r /dev/stdin; then
    rm -f "$out/MISSING"
  else
    echo "transformers' wheels could not be downloaded when packing (pip download failed: no PyPI?)" >"$out/MISSING"
  fi
  ls "$out" | wc -l
}

pack() {
  local dir=gpu_pack
  local targets=(//comm:nccl_communicator_test //tools:harness //benchmarks/peers:zerostep_step
    //tools:launch //benchmarks:device_adam_bench //benchmarks:sim_comm_bench //tools:make_hf_model)
  echo "== building ${targets[*]} (--config=cuda)"
  ./bazelw build --config=cuda "${targets[@]}"
  local bin
  bin="$(./bazelw info --config=cuda bazel-bin 2>/dev/null)"
  rm -rf "$dir"
  mkdir -p "$dir/peers"
  # sim_comm_bench: issue 16 item 4 at worlds 4 and 8 with a core per rank
  # (run.sh --only=cpu-threads).
  cp "$bin/comm/nccl_communicator_test" "$bin/tools/harness" "$bin/benchmarks/device_adam_bench" \
    "$bin/benchmarks/sim_comm_bench" "$bin/tools/make_hf_model" "$dir/"
  # The GPU benchmark against FSDP2 and DeepSpeed (benchmarks/peers/gpu_run.py),
  # and the CPU one against DDP and FSDP2 with ranks of two threads on the
  # node's cores (benchmarks/peers/run.py: run.sh --only=cpu-threads).
  cp "$bin/benchmarks/peers/zerostep_step" "$bin/tools/launch" "$dir/peers/"
  cp benchmarks/peers/gpu_run.py benchmarks/peers/ports.py benchmarks/peers/run.py benchmarks/peers/torch_step.py \
    benchmarks/peers/deepspeed_step.py "$dir/peers/"
  chmod u+w "$dir"/* "$dir"/peers/*
  strip "$dir/nccl_communicator_test" "$dir/harness" "$dir/device_adam_bench" "$dir/sim_comm_bench" \
    "$dir/make_hf_model" "$dir/peers/zerostep_step" "$dir/peers/launch"
  # The Debian libraries they need that the node may lack (liburing,
  # libstdc++ of GCC 12, ...), into lib/; glibc, LibTorch and CUDA stay
  # the node's own.
  mkdir -p "$dir/lib"
  ldd "$dir/nccl_communicator_test" "$dir/harness" "$dir/device_adam_bench" "$dir/sim_comm_bench" \
    "$dir/make_hf_model" "$dir/peers/zerostep_step" "$dir/peers/launch" |
    awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|librt|libpthread|libutil|ld-linux[^/]*)\.so|/torch[^/]*/|/libtorch-|/nvidia/|/cuda[^/]*/' |
    while read -r lib; do cp -L "$lib" "$dir/lib/"; done
  ls "$dir/lib"
  echo "== DeepSpeed wheels for the node (Python 3.12)"
  deepspeed_wheels "$dir/wheels"
  echo "== transformers wheels for the node (Python 3.12)"
  hf_wheels "$dir/wheels/hf"
  cp tools/gpu_run.sh "$dir/run.sh"
  cp third_party/libtorch/torch-*.txt "$dir/"
  du -sh "$dir"
  echo "packed: $dir (run $dir/run.sh on the node)"
}

case "${1:-all}" in
  pack) pack ;;
  all)
    pack  # not `pack && ...`: set -e does not apply inside a function of an && list
    gpu_pack/run.sh
    ;;
  *) echo "usage: tools/gpu_check.sh [pack]" >&2; exit 2 ;;
esac
