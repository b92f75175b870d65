#!/usr/bin/env bash
# `harness --device=cuda` on a machine that cannot use CUDA (no device, or
# a LibTorch without CUDA) fails at once: exit 2, a message that names the
# flag and why, and no scenario run.
set -uo pipefail
harness="$1"
start=$(date +%s)
out="$("$harness" --device=cuda --stages=0 --world=1 --steps=1 2>&1)"
rc=$?
elapsed=$(( $(date +%s) - start ))
echo "$out"
fail() { echo "FAIL: $*"; exit 1; }
[ $rc -eq 2 ] || fail "exit $rc, expected 2"
grep -q '^harness: --device=cuda: ' <<<"$out" || fail "no 'harness: --device=cuda: ...' line"
grep -q 'Fix: ' <<<"$out" || fail "the message names no fix"
grep -q 'PASS\|FAIL ' <<<"$out" && fail "a scenario ran"
[ $elapsed -le 30 ] || fail "took ${elapsed}s, not at once"
echo "PASS: --device=cuda refused at once (${elapsed}s)"
