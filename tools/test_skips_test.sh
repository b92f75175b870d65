#!/usr/bin/env bash
# tools/test_skips.py and common/test_skip.sh on made-up test logs: a shell
# test's skip is written as a skipped case and listed with its reason; a
# log that says SKIPPED with no skip in its XML is an error; with a list of
# expected skips, a listed skip passes and any other (another case,
# another configuration, a target Bazel skipped) fails; and CI's own list
# (.ci/expected_skips) parses.
set -uo pipefail
skips="$1" helper="$2" expected_ci="$3"
dir="${TEST_TMPDIR:-$(mktemp -d)}/skips"
rm -rf "$dir"
fail() { echo "FAIL: $*"; exit 1; }
run() { python3 "$skips" "$@" >"$dir/out" 2>&1; echo $? >"$dir/rc"; }
rc() { cat "$dir/rc"; }

# A shell test that cannot run, through common/test_skip.sh.
mkdir -p "$dir/logs/pkg/shell_test"
(
  export XML_OUTPUT_FILE="$dir/logs/pkg/shell_test/test.xml" TEST_TARGET=//pkg:shell_test
  source "$helper"
  test_skip NoVenv 'the venv <x> & "y" is absent'
  echo "not reached"
) >"$dir/logs/pkg/shell_test/test.log"
[ $? -eq 0 ] || fail "test_skip did not exit 0"
grep -q "not reached" "$dir/logs/pkg/shell_test/test.log" && fail "test_skip returned"
grep -qx 'SKIPPED: the venv <x> & "y" is absent' "$dir/logs/pkg/shell_test/test.log" \
  || fail "test_skip printed: $(cat "$dir/logs/pkg/shell_test/test.log")"
run "$dir/logs"
[ "$(rc)" -eq 0 ] || fail "listing without --expected failed: $(cat "$dir/out")"
grep -qF 'SKIPPED //pkg:shell_test //pkg:shell_test.NoVenv: the venv <x> & "y" is absent' "$dir/out" \
  || fail "the shell skip is not listed with its reason: $(cat "$dir/out")"

# A gtest skip, as Google Test writes it.
mkdir -p "$dir/logs/zero/isa_test"
cat >"$dir/logs/zero/isa_test/test.xml" <<'EOF'
<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="2" failures="0" disabled="0" errors="0">
  <testsuite name="EveryIsa/KernelIsaTest" tests="2">
    <testcase name="Bits/avx2" status="run" result="completed" classname="EveryIsa/KernelIsaTest"/>
    <testcase name="Bits/avx512" status="run" result="skipped" classname="EveryIsa/KernelIsaTest">
      <skipped message="this CPU lacks AVX-512F"/>
    </testcase>
  </testsuite>
</testsuites>
EOF
cat >"$dir/expected" <<'EOF'
# a comment
default //pkg:shell_test *.NoVenv -- no venv on a fresh machine
default,cuda //zero:isa_test EveryIsa/*.*/avx512 -- a CPU without AVX-512
cuda //comm:gpu_test (target) -- cuda only
EOF
run --expected "$dir/expected" --config default "$dir/logs"
[ "$(rc)" -eq 0 ] || fail "expected skips failed the run: $(cat "$dir/out")"
grep -q "expected: a CPU without AVX-512" "$dir/out" || fail "no reason shown: $(cat "$dir/out")"
grep -q "2 skip(s), 0 unexpected" "$dir/out" || fail "$(cat "$dir/out")"

# The same skips under a configuration that does not expect the shell one.
run --expected "$dir/expected" --config cuda "$dir/logs"
[ "$(rc)" -eq 1 ] || fail "an unexpected skip passed: $(cat "$dir/out")"
grep -q "ERROR: not an expected skip of configuration 'cuda'" "$dir/out" || fail "$(cat "$dir/out")"
grep -q "2 skip(s), 1 unexpected" "$dir/out" || fail "$(cat "$dir/out")"

# A target Bazel skipped: expected under cuda here, not under default.
printf '//comm:gpu_test                         SKIPPED\n//zero:isa_test   PASSED in 0.1s\n' >"$dir/bazel.log"
run --bazel-log "$dir/bazel.log" --expected "$dir/expected" --config default "$dir/logs"
[ "$(rc)" -eq 1 ] || fail "an unexpected target skip passed: $(cat "$dir/out")"
grep -q "SKIPPED //comm:gpu_test (target)" "$dir/out" || fail "$(cat "$dir/out")"

# --since leaves older logs out (the shell test's, dated 2000 here).
touch -d 2001-01-01 "$dir/stamp"
touch -d 2000-01-01 "$dir/logs/pkg/shell_test/test.xml"
run --since "$dir/stamp" --expected "$dir/expected" --config cuda "$dir/logs"
[ "$(rc)" -eq 0 ] || fail "--since read an older log: $(cat "$dir/out")"
grep -q "1 skip(s), 0 unexpected" "$dir/out" || fail "$(cat "$dir/out")"

# A log that says SKIPPED while its XML records none reads as a pass: an
# error even without --expected.
mkdir -p "$dir/logs/benchmarks/quiet_test"
printf '<?xml version="1.0"?><testsuites><testsuite name="q" tests="1"><testcase name="q" status="run"/></testsuite></testsuites>\n' \
  >"$dir/logs/benchmarks/quiet_test/test.xml"
printf 'building...\nSKIPPED: torch is absent\n' >"$dir/logs/benchmarks/quiet_test/test.log"
run "$dir/logs"
[ "$(rc)" -eq 1 ] || fail "an unreported skip passed: $(cat "$dir/out")"
grep -q "its log says SKIPPED but its test.xml records no skip" "$dir/out" || fail "$(cat "$dir/out")"

# A malformed line of the list names itself.
echo "default //a:b" >"$dir/bad"
run --expected "$dir/bad" "$dir/logs"
[ "$(rc)" -ne 0 ] || fail "a malformed list was accepted"
grep -q "bad:1: expected 'CONFIGS TARGET CASE -- REASON'" "$dir/out" || fail "$(cat "$dir/out")"

# CI's own list parses.
mkdir -p "$dir/empty"
run --expected "$expected_ci" --config cuda "$dir/empty"
[ "$(rc)" -eq 0 ] || fail ".ci/expected_skips: $(cat "$dir/out")"
echo "PASS"
