#!/usr/bin/env bash
# tools/harness refuses a simulated world that cannot fit in this machine's
# memory before it starts any rank (Note [Refusing a world that cannot fit]
# in tools/harness.cc): exit 2 and a message that names the flag, the
# memory needed and available, and the fix, instead of running until the
# kernel kills it. Worlds that fit still run. No wall-clock bound: a
# world that started its ranks would run into Bazel's test timeout (size
# small, 60 s; each refusal takes 3-4 s on AMD EPYC, 2 cores).
set -u
harness="$1"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*"; exit 1; }

# 2e9 ranks need at least 2e9 x 0.5 MiB = 954 TiB: no machine has that.
for mode in "" "--faults=lost:0@1" "--swarm=2"; do
  # shellcheck disable=SC2086
  "$harness" --world=2000000000 --stages=0 $mode >"$dir/out" 2>"$dir/err"
  rc=$?
  [ "$rc" -eq 2 ] || fail "--world=2000000000 $mode exited $rc, want 2: $(head -c 2000 "$dir/err")"
  # Scenario rows go to stdout: none may have started.
  [ -s "$dir/out" ] && fail "$mode: a scenario started: $(head -c 2000 "$dir/out")"
  for want in 'harness: --world=2000000000: the scenario stage=0 world=2000000000 model=mlp needs at least' \
              'this process may take' 'Fix: simulate fewer ranks' '--simulate-scale'; do
    grep -qF -- "$want" "$dir/err" || fail "$mode: stderr lacks '$want': $(head -c 2000 "$dir/err")"
  done
done

# A world that fits runs as before.
"$harness" --world=2 --stages=0 --steps=1 >"$dir/out" 2>"$dir/err" \
  || fail "--world=2 exited $?: $(cat "$dir/err")"
grep -q "3 of 3 scenarios ok" "$dir/err" || fail "--world=2: $(cat "$dir/err")"
[ -s "$dir/out" ] || fail "--world=2 ran with nothing on stdout: the check above cannot see a start"
echo "PASS"
