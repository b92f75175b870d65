#!/usr/bin/env bash
# Runs the GPU pack that `tools/gpu_check.sh pack` made (copied there as
# run.sh) against an installed LibTorch 2.11: the node's /opt/torch/.venv, or
# TORCH_DIR=<site-packages/torch>. Prints what it runs; exits non-zero at the
# first failure, and with 3 at the end when parts of the check are not built
# yet (named below), so an incomplete check never reads as a pass.
#
#   run.sh                 # everything
#   run.sh --only=peers    # only the GPU benchmark against FSDP2 and
#                          # DeepSpeed (a rerun); PEERS_ARGS adds arguments
#                          # to its driver (peers/gpu_run.py), e.g.
#                          # PEERS_ARGS="--device=cpu --quick" as a smoke run
#                          # where there is no GPU
#   run.sh --only=cpu-threads
#                          # no GPU: issue 16 items 4 and 5 on the node's CPU
#                          # cores: the simulator's collectives against
#                          # memcpy with a core per rank, and each row's
#                          # read bound (sim_comm_bench, about 1.5 minutes
#                          # on 2 cores), then 2 Gloo ranks of 2
#                          # compute threads, then of 1, against DDP and
#                          # FSDP2 with the same threads (peers/run.py,
#                          # about 4 minutes); THREADS_ARGS adds arguments
#                          # to run.py, e.g. "--quick"; SIM_COMM_ARGS to
#                          # sim_comm_bench, e.g. "--benchmark_min_time=0.05"
set -euo pipefail
cd "$(dirname "$0")"
only="all"
case "${1:-}" in
  "") ;;
  --only=peers) only=peers ;;
  --only=cpu-threads) only=cpu-threads ;;
  *) echo "usage: run.sh [--only=peers|--only=cpu-threads]" >&2; exit 2 ;;
esac

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
# The Python sides of the benchmark keep the caller's library path: lib/
# holds Debian's libstdc++ of GCC 12, which torch's python must not see.
caller_ld_library_path="${LD_LIBRARY_PATH:-}"
export LD_LIBRARY_PATH="$torch_dir/lib:$nvidia/nccl/lib:$nvidia/cu13/lib:$PWD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

echo "== $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname)"
echo "== devices"
nvidia-smi -L 2>/dev/null || echo "(nvidia-smi not found)"

parity() {
  echo "== nccl backend: Communicator conformance on devices"
  ./nccl_communicator_test

  echo "== parity matrix on the simulator (CPU ranks, this LibTorch), worlds 1, 2, 4"
  ./harness --stages=0,1,2,3 --world=1,2,4 --backwards=2,5,3

  echo "== parity matrix on the device: every stage, ZeRO state on cuda:0, worlds 1, 2, 4 (digests printed)"
  ./harness --device=cuda --world=1,2,4

  echo "== parity on the device: stages 0-2, bf16 and the GPT (digests printed)"
  ./harness --device=cuda --stages=0,1,2 --world=1,2,4 --backwards=2,5,3 --dtype=fp32,bf16
  ./harness --device=cuda --stages=0,1,2 --world=1,2 --model=gpt --clip=1.0

  # Several ranks of one process on one device run stage 3's collectives
  # outside backward (Note [Stage 3 collectives outside backward]).
  echo "== parity on the device: stage 3 on cuda:0 (partitions and gathered storages on the device), worlds 1, 2, 4 (digests printed)"
  ./harness --device=cuda --stages=3 --world=1,2,4 --backwards=2,5,3 --dtype=fp32,bf16,fp16
  ./harness --device=cuda --stages=3 --world=1,2 --model=gpt --clip=1.0 --persistence-threshold=100000

  echo "== parity on the device: ZeRO-Offload (stage 3: partitions on the host, gathered groups on cuda:0), models and data on cuda:0, worlds 1, 2, 4 (digests printed)"
  ./harness --device=cuda --stages=1,2,3 --offload=cpu --world=1,2,4 --backwards=2,5,3 --dtype=fp32,bf16
  ./harness --device=cuda --stages=3 --offload=cpu --offload-param --world=1,2 --backwards=2,5,3
  ./harness --device=cuda --stages=1,2 --offload=cpu --world=1,2 --model=gpt
  ./harness --device=cuda --stages=2 --offload=cpu --world=1 --model=gpt --overlap-comm
}

# The python of $torch_dir's venv (<venv>/lib/python3.X/site-packages/torch),
# not the one it links to, so that its site-packages come along.
venv_python() {
  local python
  python="$(cd "$(dirname "$(readlink -f "$torch_dir")")/../../.." && pwd)/bin/python3"
  [ -x "$python" ] || python="$(command -v python3)"
  echo "$python"
}

# The engine's AdamW on the device against LibTorch's fused AdamW and the
# HBM bandwidth (issue 12 item 4, benchmarks/device_adam_bench.cc): 16, 64
# and 256 Mi parameters, well under a minute. Writes adam_gpu.json here (and
# into $OUT when that is set).
adam() {
  echo "== AdamW on the device: zerostep's against torch's fused AdamW and the copy bandwidth (issue 12, item 4)"
  ZS_BENCH_DEVICE=cuda ./device_adam_bench --benchmark_out=adam_gpu.json --benchmark_out_format=json
  if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then cp adam_gpu.json "$OUT/"; fi
}

# The GPU benchmark against FSDP2 and DeepSpeed (issue 12 item 8, issue 39
# item 5; benchmarks/peers/gpu_run.py): world 1 on cuda:0, Llama-shaped
# Hugging Face folders of 125M and 336M parameters that make_hf_model
# writes here (hf/llama-125m, hf/llama-350m; the FSDP2 and DeepSpeed sides
# load them with transformers from the pack's wheels), N = 4 backward calls
# per step, at most 2 rounds within 240 s. Without the transformers wheels
# it runs the GPT 125M and 350M instead and says so (hf_state). Writes
# peers_gpu.json and peers_gpu.md here (and into $OUT when that is set).
# Sets ds_state: "ran", or why DeepSpeed did not.
peers() {
  local python
  python="$(venv_python)"
  local hf_args=()
  hf_state="ran"
  if [ -f wheels/hf/MISSING ]; then
    hf_state="$(cat wheels/hf/MISSING)"
  elif ! ls wheels/hf/transformers-*.whl >/dev/null 2>&1; then
    hf_state="the pack has no transformers wheel (tools/gpu_check.sh pack makes it)"
  else
    local hf_site
    hf_site="$(mktemp -d)"
    if LD_LIBRARY_PATH="$caller_ld_library_path" "$python" -m pip install -q --no-index --no-deps \
        --no-compile --no-cache-dir --target "$hf_site" wheels/hf/*.whl &&
      ./make_hf_model --out=hf/llama-125m --preset=125m &&
      ./make_hf_model --out=hf/llama-350m --preset=350m; then
      hf_args=(--hf=hf/llama-125m,hf/llama-350m --hf-site="$hf_site")
    else
      hf_state="the transformers wheels or the Llama folders could not be set up in $hf_site"
    fi
  fi
  if [ "$hf_state" = ran ]; then
    echo "== GPU benchmark against FSDP2 and DeepSpeed (issue 12 item 8, issue 39 item 5): world 1, Llama 125M and 336M, N = 4, about 4 minutes"
  else
    echo "== GPU benchmark against FSDP2 and DeepSpeed (issue 12, item 8): world 1, GPT 125M and 350M (no Llama: $hf_state), N = 4, about 4 minutes"
  fi
  local ds_args=() ds_why=""
  if [ -f wheels/MISSING ]; then
    ds_why="$(cat wheels/MISSING)"
  elif ! ls wheels/deepspeed-*.whl >/dev/null 2>&1; then
    ds_why="the pack has no DeepSpeed wheel (tools/gpu_check.sh pack makes it)"
  else
    local site
    site="$(mktemp -d)"
    if LD_LIBRARY_PATH="$caller_ld_library_path" "$python" -m pip install -q --no-index --no-deps \
        --no-compile --no-cache-dir --target "$site" wheels/*.whl; then
      ds_args=(--deepspeed-site="$site")
    else
      ds_why="pip could not install the pack's DeepSpeed wheels into $site"
    fi
  fi
  [ -n "$ds_why" ] && ds_args=(--no-deepspeed) && echo "   DeepSpeed not run: $ds_why"
  local rc=0
  # shellcheck disable=SC2086 # PEERS_ARGS is a list of arguments
  LD_LIBRARY_PATH="$caller_ld_library_path" PYTHONUNBUFFERED=1 timeout 480 "$python" peers/gpu_run.py \
    --zerostep-bin=peers/zerostep_step --zerostep-lib-path="$LD_LIBRARY_PATH" \
    --python="$python" "${ds_args[@]}" "${hf_args[@]}" --out=peers_gpu.json --table=peers_gpu.md ${PEERS_ARGS:-} ||
    rc=$?
  # What it measured, also when it failed or was stopped ("complete": false).
  if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then cp peers_gpu.json peers_gpu.md "$OUT/" 2>/dev/null || true; fi
  if [ "$rc" -ne 0 ]; then
    echo "run.sh: the GPU benchmark exited $rc (124: stopped at 480 s); peers_gpu.json holds what it measured" >&2
    exit "$rc"
  fi
  ds_state="$("$python" -c 'import json; print(json.load(open("peers_gpu.json"))["deepspeed"])')"
  [ -n "$ds_why" ] && ds_state="not run: $ds_why"
  return 0
}

# Issue 16 item 4 (benchmarks/sim_comm_bench.cc): the simulator's
# all-reduce and reduce-scatter against memcpy, 1-64 MiB per rank, worlds
# 2, 4 and 8, and each row's read bound with a thread per rank (Note [Read
# bound]). The 2-core build machines give 8 ranks 2 cores; with a core
# per rank the ranks spin instead of sleeping (Note [Spin before sleeping]
# in sim/sim_world.cc). Writes sim_comm.json here (and into $OUT when that
# is set).
sim_comm() {
  echo "== the simulator's collectives against memcpy (issue 16, item 4): $(nproc) cores"
  # shellcheck disable=SC2086 # SIM_COMM_ARGS is a list of arguments
  timeout 180 ./sim_comm_bench --benchmark_min_time=0.5 --benchmark_out=sim_comm.json \
    --benchmark_out_format=json ${SIM_COMM_ARGS:-}
  if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then cp sim_comm.json "$OUT/"; fi
}

# Issue 16 item 5 (benchmarks/peers/run.py), on CPU cores, which this
# node has and the 2-core build machines lack: 2 Gloo ranks of 2 compute
# threads each against DDP and FSDP2 with 2 threads per process, then the
# same at 1 thread (the scaling), 7M and 26M, stages 0-3 and the two
# once-modes, 3 rounds. Writes peers_threads2.json and peers_threads1.json
# here (and into $OUT when that is set).
cpu_threads() {
  local cores
  cores="$(nproc)"
  echo "== CPU benchmark against DDP and FSDP2, ranks of 2 threads (issue 16, item 5): $cores cores"
  if [ "$cores" -lt 4 ]; then
    echo "run.sh: $cores cores: 2 ranks of 2 threads need at least 4, or they measure the oversubscription" >&2
    exit 2
  fi
  local python t
  python="$(venv_python)"
  for t in 2 1; do
    # shellcheck disable=SC2086 # THREADS_ARGS is a list of arguments
    LD_LIBRARY_PATH="$caller_ld_library_path" PYTHONUNBUFFERED=1 timeout 240 "$python" peers/run.py \
      --zerostep-bin=peers/zerostep_step --launch-bin=peers/launch --zerostep-lib-path="$LD_LIBRARY_PATH" \
      --python="$python" --world=2 --threads="$t" --sizes=7M,26M --rounds=3 \
      --zerostep-modes=stage0,stage1,stage2,stage3,stage2_once,stage3_once_gather \
      --out="peers_threads$t.json" ${THREADS_ARGS:-} || {
      local rc=$?
      echo "run.sh: the CPU benchmark at $t threads exited $rc (124: stopped at 240 s; run.py writes its JSON only at the end)" >&2
      exit "$rc"
    }
    if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then cp "peers_threads$t.json" "$OUT/"; fi
  done
}

if [ "$only" = cpu-threads ]; then
  sim_comm
  cpu_threads
  echo "== the CPU benchmark ran (--only=cpu-threads: nothing else was run)"
  exit 0
fi

ds_state=""
hf_state=""
# Not `[ ... ] && parity`: bash ignores set -e inside a function called from
# an && list, so a failing check there would not stop the run.
if [ "$only" = all ]; then
  parity
  adam
fi
peers

missing=()
if [ "$hf_state" != ran ]; then
  missing+=("the Llama models in the GPU benchmark (issue 39, item 5): $hf_state")
fi
if [ "$ds_state" != ran ]; then
  missing+=("DeepSpeed in the GPU benchmark (issue 12, item 8): $ds_state")
fi
if [ "${#missing[@]}" -eq 0 ]; then
  if [ "$only" = all ]; then echo "== all of the check ran"; else echo "== the benchmark ran (--only=peers: nothing else was run)"; fi
  exit 0
fi
echo "== not built yet, so not run:"
for m in "${missing[@]}"; do echo "   - $m"; done
exit 3
