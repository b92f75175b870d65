#!/usr/bin/env bash
# tools/trainer_server: a number flag that is not one, or is out of its
# range, exits 2 before anything starts, naming the flag, the text and the
# rule (atoi and atof read "8000x" as 8000, "abc" as 0 and "99999" as a
# port that then failed to bind or wrapped). So does a state folder that
# cannot be created or written (a save_weights hours later would have
# failed); a good one is left as it was found. Issue 45: a --host beyond
# loopback without API keys is refused naming the flags, and so are bad
# keys settings; --allow-unauthenticated serves and warns.
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
bad --max-connections=0 "must be an integer from 1 to 1048576"
bad --max-body-bytes=1X "not a byte count"
bad --tenant-max-bytes=-1 "not a byte count"
bad --header-timeout-s=0 "must be a finite number from 0.01 to 3600"
refused() {  # what the error must say, then the arguments
  want="$1"; shift
  err=$(timeout 60 "$server" --port=0 "--state-dir=$TEST_TMPDIR/s" "$@" 2>&1 >/dev/null); rc=$?
  [ "$rc" -eq 2 ] || { echo "FAIL: $* exited $rc, want 2: $err"; exit 1; }
  [[ "$err" == *"$want"* ]] || { echo "FAIL: $*: $err"; exit 1; }
  passed=$((passed + 1))
}
refused "trainer_server: --host=0.0.0.0 serves beyond this machine, and no API keys are set" --host=0.0.0.0
refused "Fix: give --api-keys=FILE (or ZEROSTEP_API_KEYS), or pass --allow-unauthenticated" --host=::
refused "--api-keys: cannot read '$TEST_TMPDIR/none'" "--api-keys=$TEST_TMPDIR/none"
printf 'tml-short alice\n' > "$TEST_TMPDIR/keys"
refused "line 1: the key (field 1) is shorter than 24 characters" "--api-keys=$TEST_TMPDIR/keys"
printf 'tml-flags-test-000000000000001 alice\n' > "$TEST_TMPDIR/keys"
refused "--allow-unauthenticated with --api-keys" "--api-keys=$TEST_TMPDIR/keys" --allow-unauthenticated
err=$(ZEROSTEP_API_KEYS=tml-flags-test-000000000000002 timeout 60 "$server" --port=0 "--state-dir=$TEST_TMPDIR/s" "--api-keys=$TEST_TMPDIR/keys" 2>&1 >/dev/null); rc=$?
[ "$rc" -eq 2 ] && [[ "$err" == *"--api-keys and ZEROSTEP_API_KEYS are both set"* ]] || { echo "FAIL: both key sources: $rc $err"; exit 1; }
[[ "$err" != *"tml-flags-test"* ]] || { echo "FAIL: a key in the message: $err"; exit 1; }
# Starts the server with the arguments, waits until it listens (at most 60
# s: longer means a hang), stops it with SIGTERM; its output in $out. Each
# start writes a file of its own, emptied before the server starts: the
# shell opens a background job's redirection in the job, so a file shared
# with the previous start could still hold that start's "listening" line
# when the loop first reads it (and the server be stopped before it wrote
# anything).
serves=0
serve() {
  serves=$((serves + 1))
  local log="$TEST_TMPDIR/out.$serves"
  : > "$log"
  "$server" --port=0 "$@" > "$log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do
    grep -q "listening on http" "$log" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -TERM "$pid" 2>/dev/null; wait "$pid"
  out=$(cat "$log")
}
serve "--state-dir=$TEST_TMPDIR/s" --host=0.0.0.0 --allow-unauthenticated
[[ "$out" == *"WARNING: serving --host=0.0.0.0 without API keys (--allow-unauthenticated)"*"listening on http://0.0.0.0:"* ]] || { echo "FAIL: --allow-unauthenticated: $out"; exit 1; }
passed=$((passed + 2))
touch "$TEST_TMPDIR/afile"
err=$(timeout 60 "$server" "--state-dir=$TEST_TMPDIR/afile/sub" 2>&1 >/dev/null); rc=$?
[ "$rc" -eq 2 ] || { echo "FAIL: an unusable --state-dir exited $rc, want 2: $err"; exit 1; }
[[ "$err" == *"the state folder '$TEST_TMPDIR/afile/sub' (--state-dir) cannot be used: cannot create folder"*"Fix: give --state-dir a folder"* ]] || { echo "FAIL: $err"; exit 1; }
good="$TEST_TMPDIR/state"
mkdir -p "$TEST_TMPDIR/old/session-ab12-1_train_0"
serve "--state-dir=$TEST_TMPDIR/old"
[[ "$out" == *"the state folder holds 1 run folder from before tenants (session-ab12-1_train_0), which this server does not read"*"Fix: move them into $TEST_TMPDIR/old/tenants/default/"* ]] || { echo "FAIL: a state folder from before tenants: $out"; exit 1; }
passed=$((passed + 1))
serve "--state-dir=$good"
[[ "$out" == *"listening on http://127.0.0.1:"* ]] || { echo "FAIL: a good --state-dir: $out"; exit 1; }
[ -d "$good" ] && [ -z "$(ls -A "$good")" ] || { echo "FAIL: $good not created, or the probe left behind: $(ls -A "$good")"; exit 1; }
passed=$((passed + 2))
echo "$passed passed, 0 failed"
