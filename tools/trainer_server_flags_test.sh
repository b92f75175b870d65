#!/usr/bin/env bash
# tools/trainer_server: a number flag that is not one, or is out of its
# range, exits 2 before anything starts, naming the flag, the text and the
# rule (atoi and atof read "8000x" as 8000, "abc" as 0 and "99999" as a
# port that then failed to bind or wrapped). So does a state folder that
# cannot be created or written (a save_weights hours later would have
# failed); a good one is left as it was found.
set -u
server="$1"
passed=0
bad() {  # flag=value, then the rule the error must state
  err=$(timeout 60 "$server" "$1" 2>&1 >/dev/null); rc=$?
  [ "$rc" -eq 2 ] || { echo "FAIL: $1 exited $rc, want 2: $err"; exit 1; }
  [[ "$err" == "trainer_server: $1: "*"$2"* ]] || { echo "FAIL: $1: $err"; exit 1; }
  passed=$((passed + 1))
}
bad --port=99999 "must be an integer from 0 to 65535. Fix: write e.g. --port=8000"
bad --port=8000x "not an integer"
bad --stage=4 "must be an integer from 0 to 3"
bad --stage=abc "not an integer"
bad --world=0 "must be an integer from 1 to 4096"
bad --world=99999999999 "must be an integer from 1 to 4096"
bad --timeout-s=1 "must be a finite number from 5 to 86400"
bad --seed=-1 "not a non-negative integer"
bad --long-poll-s=abc "not a number: must be a finite number from 0 to 3600. Fix: write e.g. --long-poll-s=30"
bad --long-poll-s=-5 "must be a finite number from 0 to 3600"
bad --seq-gap-timeout-s=inf "not a number"
touch "$TEST_TMPDIR/afile"
err=$(timeout 60 "$server" "--state-dir=$TEST_TMPDIR/afile/sub" 2>&1 >/dev/null); rc=$?
[ "$rc" -eq 2 ] || { echo "FAIL: an unusable --state-dir exited $rc, want 2: $err"; exit 1; }
[[ "$err" == *"the state folder '$TEST_TMPDIR/afile/sub' (--state-dir) cannot be used: cannot create folder"*"Fix: give --state-dir a folder"* ]] || { echo "FAIL: $err"; exit 1; }
good="$TEST_TMPDIR/state"
out=$(timeout -s TERM 15 "$server" --port=0 "--state-dir=$good" 2>&1)
[[ "$out" == *"listening on http://127.0.0.1:"* ]] || { echo "FAIL: a good --state-dir: $out"; exit 1; }
[ -d "$good" ] && [ -z "$(ls -A "$good")" ] || { echo "FAIL: $good not created, or the probe left behind: $(ls -A "$good")"; exit 1; }
passed=$((passed + 2))
echo "$passed passed, 0 failed"
