#!/usr/bin/env bash
# `harness --device=cuda` on a machine that cannot use CUDA (no device, or
# a LibTorch without CUDA) fails before any scenario starts: exit 2, a
# message that names the flag and why, and nothing on stdout (where
# scenario rows go; tools/harness_world_test.sh checks that a run that
# fits writes them). No wall-clock bound: a hang is Bazel's test timeout
# (size small, 60 s; the call takes 3-4 s on AMD EPYC, 2 cores).
set -uo pipefail
harness="$1"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
"$harness" --device=cuda --stages=0 --world=1 --steps=1 >"$dir/out" 2>"$dir/err"
rc=$?
cat "$dir/err" "$dir/out"
fail() { echo "FAIL: $*"; exit 1; }
[ $rc -eq 2 ] || fail "exit $rc, expected 2"
grep -q '^harness: --device=cuda: ' "$dir/err" || fail "no 'harness: --device=cuda: ...' line"
grep -q 'Fix: ' "$dir/err" || fail "the message names no fix"
[ -s "$dir/out" ] && fail "a scenario started"
echo "PASS: --device=cuda refused before any scenario started"
