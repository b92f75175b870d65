#!/usr/bin/env bash
# Runs the GPU pack that `tools/gpu_check.sh pack` made (copied there as
# run.sh) against an installed LibTorch 2.11: the node's /opt/torch/.venv, or
# TORCH_DIR=<site-packages/torch>. Prints what it runs; exits non-zero at the
# first failure, and with 3 at the end when parts of the check are not built
# yet (named below), so an incomplete check never reads as a pass.
set -euo pipefail
cd "$(dirname "$0")"

torch_dir="${TORCH_DIR:-}"
if [ -z "$torch_dir" ]; then
  for d in /opt/torch/.venv/lib/python3*/site-packages/torch /var/cache/zerostep/libtorch-2.11.0; do
    if [ -f "$d/lib/libtorch.so" ]; then torch_dir="$d"; break; fi
  done
fi
if [ -z "$torch_dir" ] || [ ! -f "$torch_dir/lib/libtorch.so" ]; then
  echo "run.sh: no LibTorch found (tried /opt/torch/.venv and /var/cache/zerostep/libtorch-2.11.0)." \
    "Fix: set TORCH_DIR to the torch/ folder of a torch 2.11.0 install." >&2
  exit 2
fi
want="$(sed -n 's/^torch==//p' torch-*.txt | head -1)"
have="$(sed -n "s/^__version__ = '\([^+']*\).*/\1/p" "$torch_dir/version.py")"
echo "== LibTorch $have at $torch_dir (the pack was built against $want)"
if [ "$have" != "$want" ]; then
  echo "run.sh: LibTorch $have is not $want, the version the pack was built against." >&2
  exit 2
fi
nvidia="$(dirname "$torch_dir")/nvidia"
export LD_LIBRARY_PATH="$torch_dir/lib:$nvidia/nccl/lib:$nvidia/cu13/lib:$PWD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

echo "== $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname)"
echo "== devices"
nvidia-smi -L 2>/dev/null || echo "(nvidia-smi not found)"

echo "== nccl backend: Communicator conformance on devices"
./nccl_communicator_test

echo "== parity matrix on the simulator (CPU ranks, this LibTorch), worlds 1, 2, 4"
./harness --stages=0,1,2,3 --world=1,2,4 --backwards=2,5,3

echo "== parity on the device: the engine on cuda:0 (stages 0-2, ZeRO state on the device), worlds 1, 2, 4 (digests printed)"
./harness --device=cuda --stages=0,1,2 --world=1,2,4 --backwards=2,5,3 --dtype=fp32,bf16
./harness --device=cuda --stages=0,1,2 --world=1,2 --model=gpt --clip=1.0

echo "== parity on the device: ZeRO-Offload, models and data on cuda:0, worlds 1, 2, 4 (digests printed)"
./harness --device=cuda --stages=1,2 --offload=cpu --world=1,2,4 --backwards=2,5,3 --dtype=fp32,bf16
./harness --device=cuda --stages=1,2 --offload=cpu --world=1,2 --model=gpt
./harness --device=cuda --stages=2 --offload=cpu --world=1 --model=gpt --overlap-comm

missing=(
  "parity on the device at stage 3: stage 3 keeps its partitions on the host (issue 12, item 2)"
  "the GPU benchmark against FSDP2 and DeepSpeed (issue 12, item 8)"
)
echo "== not built yet, so not run:"
for m in "${missing[@]}"; do echo "   - $m"; done
exit 3
