#!/usr/bin/env bash
# own_model at stages 0-3 over 2 Gloo processes: a run that saves at step 2
# and goes on to step 4, and a run that resumes from that checkpoint, end
# with the same parameters bit for bit; the export is written.
set -u
bin="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
# A free port below the kernel's ephemeral range, where no other job's
# port-0 socket can take it before rank 0 binds it (as tools/launch picks).
free_port() {
  python3 - <<'PY'
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for _ in range(64):
    port = random.randrange(10000, low) if low - 10000 >= 1000 else 0
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        print(s.getsockname()[1])
        break
    except OSError:
        pass
    finally:
        s.close()
PY
}
# Runs 2 ranks of own_model with the given flags; rank 0's output to $1.
run_pair() {
  local out="$1"; shift
  local port; port=$(free_port)
  RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$bin" "$@" > "$out.rank1" 2>&1 &
  local pid=$!
  RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$bin" "$@" > "$out" 2>&1
  local rc0=$?
  wait $pid
  local rc1=$?
  if [ $rc0 -ne 0 ] || [ $rc1 -ne 0 ]; then
    echo "FAIL: own_model $* exited $rc0 (rank 0), $rc1 (rank 1)"
    cat "$out" "$out.rank1"
    exit 1
  fi
}
for stage in 0 1 2 3; do
  dir="$tmp/ckpt$stage"
  run_pair "$tmp/full$stage" --stage=$stage --steps=4 --save-at=2 --dir="$dir"
  run_pair "$tmp/resumed$stage" --stage=$stage --steps=4 --resume \
    --dir="$dir" --export="$tmp/model$stage.safetensors"
  full=$(grep '^digest' "$tmp/full$stage")
  resumed=$(grep '^digest' "$tmp/resumed$stage")
  [ -n "$full" ] || { echo "FAIL: stage $stage printed no digest"; cat "$tmp/full$stage"; exit 1; }
  [ "$full" = "$resumed" ] || {
    echo "FAIL: stage $stage: resumed run ends with $resumed, uninterrupted with $full"
    cat "$tmp/full$stage" "$tmp/resumed$stage"; exit 1; }
  # The resumed run trained steps 2 and 3 only.
  [ "$(grep -c '^step' "$tmp/resumed$stage")" -eq 2 ] || {
    echo "FAIL: stage $stage: resumed run did not start at step 2"; cat "$tmp/resumed$stage"; exit 1; }
  # safetensors: an 8-byte little-endian header length, then a JSON header
  # naming the module's parameters.
  st="$tmp/model$stage.safetensors"
  [ -s "$st" ] || { echo "FAIL: stage $stage: no export"; exit 1; }
  names=$(python3 - "$st" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
print(" ".join(sorted(k + ":" + v["dtype"] for k, v in h.items()
                      if k != "__metadata__")))
PY
)
  for name in embed.weight block0.up.weight block1.down.bias head.weight; do
    [[ " $names " == *" $name:F32 "* ]] || {
      echo "FAIL: stage $stage: the export lacks $name as F32: $names"; exit 1; }
  done
  echo "stage $stage: $full (resumed bit for bit), loss $(grep '^step 3' "$tmp/full$stage")"
done
echo "4 passed, 0 failed"
