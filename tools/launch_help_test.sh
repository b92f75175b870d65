#!/usr/bin/env bash
# tools/launch: --help prints the usage and exits 0; an unknown argument
# prints it to stderr and exits 2.
set -u
launch="$1"
out=$("$launch" --help) || { echo "FAIL: --help exited $?"; exit 1; }
for want in "usage: launch --nproc=N" "MASTER_PORT" "--master-port=P"; do
  [[ "$out" == *"$want"* ]] || { echo "FAIL: --help lacks '$want':"; echo "$out"; exit 1; }
done
err=$("$launch" --bogus 2>&1 >/dev/null); rc=$?
[ "$rc" -eq 2 ] || { echo "FAIL: --bogus exited $rc, want 2"; exit 1; }
[[ "$err" == *"unknown argument '--bogus'"*"usage: launch"* ]] || { echo "FAIL: $err"; exit 1; }
echo "1 passed, 0 failed"
