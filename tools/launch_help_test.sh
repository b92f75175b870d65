#!/usr/bin/env bash
# tools/launch: --help prints the usage and exits 0; an unknown argument
# prints it to stderr and exits 2; so does a number that is not one, or out
# of its range (atoi read "2x" as 2, "abc" as 0 and wrapped large values),
# naming the flag, the text and the rule, before any rank starts.
set -u
launch="$1"
out=$("$launch" --help) || { echo "FAIL: --help exited $?"; exit 1; }
for want in "usage: launch [--nproc-per-node=N] [--nnodes=M --node-rank=K" "MASTER_PORT" "--master-port=P" "GROUP_RANK" "--node-failure-grace-s"; do
  [[ "$out" == *"$want"* ]] || { echo "FAIL: --help lacks '$want':"; echo "$out"; exit 1; }
done
err=$("$launch" --bogus 2>&1 >/dev/null); rc=$?
[ "$rc" -eq 2 ] || { echo "FAIL: --bogus exited $rc, want 2"; exit 1; }
[[ "$err" == *"unknown argument '--bogus'"*"usage: launch"* ]] || { echo "FAIL: $err"; exit 1; }
marker="$TEST_TMPDIR/ran"
bad() {  # flag=value, then the rule the error must state
  err=$("$launch" "$1" -- /bin/sh -c "touch $marker" 2>&1 >/dev/null); rc=$?
  [ "$rc" -eq 2 ] || { echo "FAIL: $1 exited $rc, want 2: $err"; exit 1; }
  [[ "$err" == "launch: $1: "*"$2"* ]] || { echo "FAIL: $1: $err"; exit 1; }
  [ ! -e "$marker" ] || { echo "FAIL: $1 started a rank"; exit 1; }
}
for v in 2x abc "" +2 1.5 " 2"; do bad "--nproc=$v" "not an integer: must be an integer from 1 to 4096"; done
bad --nproc=0 "must be an integer from 1 to 4096. Fix: write e.g. --nproc=2"
bad --nproc=100000000000 "must be an integer from 1 to 4096"
bad --nproc=99999999999999999999 "out of range"
bad --master-port=99999 "must be an integer from 0 to 65535"
bad --master-port=abc "not an integer"
bad --nnodes=1:4 "not an integer"
bad --nnodes=0 "must be an integer from 1 to 65536"
bad --node-rank=-1 "must be an integer from 0 to"
bad --node-timeout-s=0 "must be a finite number from 0.01 to 86400"
# Values checked against each other, before any rank starts.
err=$("$launch" --nnodes=2 --node-rank=2 --master-addr=127.0.0.1 -- /bin/sh -c "touch $marker" 2>&1 >/dev/null); rc=$?
[ "$rc" -eq 2 ] && [[ "$err" == "launch: --node-rank=2: must be 0 to --nnodes - 1 = 1"* ]] || { echo "FAIL: node rank: $rc $err"; exit 1; }
err=$("$launch" --nnodes=2 --node-rank=1 -- /bin/sh -c "touch $marker" 2>&1 >/dev/null); rc=$?
[ "$rc" -eq 2 ] && [[ "$err" == "launch: --nnodes=2 needs --master-addr"* ]] || { echo "FAIL: master addr: $rc $err"; exit 1; }
[ ! -e "$marker" ] || { echo "FAIL: a rank started"; exit 1; }
err=$("$launch" --nproc 2>&1 >/dev/null); rc=$?
[ "$rc" -eq 2 ] && [[ "$err" == "launch: --nproc needs a value"* ]] || { echo "FAIL: no value: $rc $err"; exit 1; }
# torchrun's spellings: a value after a space, underscores; torchrun's
# variables, with RANK counted from this node's first rank.
out=$("$launch" --nproc_per_node 2 --master_port=29999 -- /bin/sh -c 'echo "r=$RANK l=$LOCAL_RANK w=$WORLD_SIZE lw=$LOCAL_WORLD_SIZE g=$GROUP_RANK gw=$GROUP_WORLD_SIZE a=$MASTER_ADDR p=$MASTER_PORT"' 2>&1) || { echo "FAIL: torchrun spellings: $out"; exit 1; }
[[ "$out" == *"[rank 1] r=1 l=1 w=2 lw=2 g=0 gw=1 a=127.0.0.1 p=29999"* ]] || { echo "FAIL: variables: $out"; exit 1; }
# The bounds themselves are taken.
out=$("$launch" --nproc=1 --master-port=65535 -- /bin/echo ok 2>&1) || { echo "FAIL: valid flags: $out"; exit 1; }
[[ "$out" == *"ok"* ]] || { echo "FAIL: $out"; exit 1; }
echo "3 passed, 0 failed"
