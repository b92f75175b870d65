#!/usr/bin/env bash
# The GPU node check: builds the nccl backend against the CUDA toolkit
# (CUDA_HOME, default /usr/local/cuda) and runs its tests, which on a
# machine with GPUs include the Communicator conformance suite over NCCL
# (one rank per device, world sizes 1, 2, 4, ... up to the device count).
# Then the parity matrix on the simulator as a sanity check of the build.
#
#   tools/gpu_check.sh            # from the repository root
#
# Prints what it ran and exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "== devices"
nvidia-smi -L 2>/dev/null || echo "(nvidia-smi not found: the test will report no device)"
echo "== nccl backend: build and conformance (--config=cuda)"
./bazelw test --config=cuda //comm:nccl_communicator_test --test_output=all
echo "== parity matrix (simulator)"
./bazelw run //tools:harness -- --stages=0,1,2,3 --world=1,2,4 --backwards=2,5,3
