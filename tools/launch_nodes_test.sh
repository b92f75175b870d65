#!/usr/bin/env bash
# tools/launch across two nodes on loopback (two launchers of this machine,
# --nnodes=2): torchrun's variables count ranks across the nodes, a job
# whose every rank exits 0 ends with 0 on both, and a rank that fails on
# node 1 stops node 0's ranks (which would otherwise sleep for a minute):
# node 1's launcher exits with the rank's status, node 0's with 1, naming
# node 1, its host and the rank, and no rank is left behind.
set -u
launch="$1"
tmp="$TEST_TMPDIR"
marker="zerostep-launch-nodes-$$"
two_nodes() {  # port, then the ranks' shell script
  local port="$1" script="$2"
  "$launch" --nnodes=2 --node-rank=0 --master-addr=127.0.0.1 --master-port="$port" \
    --nproc-per-node=2 --node-failure-grace-s=0.5 -- /bin/sh -c "$script" "$marker" > "$tmp/n0" 2>&1 &
  local p0=$!
  "$launch" --nnodes 2 --node_rank 1 --master_addr 127.0.0.1 --master_port "$port" \
    --nproc_per_node 2 --node-failure-grace-s=0.5 -- /bin/sh -c "$script" "$marker" > "$tmp/n1" 2>&1 &
  local p1=$!
  wait $p0; rc0=$?
  wait $p1; rc1=$?
}
port=$((20000 + RANDOM % 9000))
two_nodes $port 'echo "r=$RANK l=$LOCAL_RANK w=$WORLD_SIZE lw=$LOCAL_WORLD_SIZE g=$GROUP_RANK gw=$GROUP_WORLD_SIZE"'
[ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] || { echo "FAIL: exit $rc0 $rc1"; cat "$tmp/n0" "$tmp/n1"; exit 1; }
for want in "[rank 0] r=0 l=0 w=4 lw=2 g=0 gw=2" "[rank 1] r=1 l=1 w=4 lw=2 g=0 gw=2"; do
  grep -qF "$want" "$tmp/n0" || { echo "FAIL: node 0 lacks '$want'"; cat "$tmp/n0"; exit 1; }
done
for want in "[rank 2] r=2 l=0 w=4 lw=2 g=1 gw=2" "[rank 3] r=3 l=1 w=4 lw=2 g=1 gw=2"; do
  grep -qF "$want" "$tmp/n1" || { echo "FAIL: node 1 lacks '$want'"; cat "$tmp/n1"; exit 1; }
done
two_nodes $((port + 2)) 'if [ "$RANK" = 3 ]; then exit 3; fi; i=0; while [ $i -lt 60 ]; do sleep 1; i=$((i + 1)); done'
[ "$rc1" -eq 3 ] || { echo "FAIL: node 1 exited $rc1, want 3"; cat "$tmp/n1"; exit 1; }
[ "$rc0" -eq 1 ] || { echo "FAIL: node 0 exited $rc0, want 1"; cat "$tmp/n0"; exit 1; }
want="launch: failed: node 1 (host $(uname -n), 127.0.0.1) failed: rank 3 exited with status 3"
grep -qF "$want" "$tmp/n0" || { echo "FAIL: node 0 lacks '$want'"; cat "$tmp/n0"; exit 1; }
grep -qF "launch: failed: rank 3 exited with status 3" "$tmp/n1" || { echo "FAIL: node 1:"; cat "$tmp/n1"; exit 1; }
if pgrep -f "$marker" > /dev/null; then echo "FAIL: ranks left behind:"; pgrep -af "$marker"; exit 1; fi
echo "2 passed, 0 failed"
