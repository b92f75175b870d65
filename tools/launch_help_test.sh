#!/usr/bin/env bash
# tools/launch: --help prints the usage and exits 0; an unknown argument
# prints it to stderr and exits 2; so does a number that is not one, or out
# of its range (atoi read "2x" as 2, "abc" as 0 and wrapped large values),
# naming the flag, the text and the rule, before any rank starts.
set -u
launch="$1"
out=$("$launch" --help) || { echo "FAIL: --help exited $?"; exit 1; }
for want in "usage: launch --nproc=N" "MASTER_PORT" "--master-port=P"; do
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
# The bounds themselves are taken.
out=$("$launch" --nproc=1 --master-port=65535 -- /bin/echo ok 2>&1) || { echo "FAIL: valid flags: $out"; exit 1; }
[[ "$out" == *"ok"* ]] || { echo "FAIL: $out"; exit 1; }
echo "2 passed, 0 failed"
