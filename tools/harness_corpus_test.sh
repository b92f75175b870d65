#!/usr/bin/env bash
# tools/harness over config/testdata/real: every file runs as written, or
# is refused with the message its .expect states, at the world size and
# with the trainer values that .expect states (config/corpus_test.cc says
# the format). The harness must print exactly those trainer values, and
# the values it filled in for "auto".
set -u
harness="$1"
corpus="$2"  # config/testdata/real
dir="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*"; exit 1; }

runs=0
refused=0
for expect in "$corpus"/*.expect; do
  name=$(basename "$expect" .expect)
  file="${expect%.expect}.json"
  world=$(sed -n 's/^world_size: *//p' "$expect")
  trainer=$(sed -n 's/^trainer: *//p' "$expect")
  out=$("$harness" --config="$file" --json --world="$world" --backwards=2 \
        --steps=2 --scaling=configured 2>"$dir/err")
  rc=$?
  if grep -qx accept "$expect"; then
    [ "$rc" -eq 0 ] || fail "$name exited $rc: $(tail -5 "$dir/err")"
    n=$(echo "$out" | wc -l)
    [ "$(echo "$out" | grep -c '"ok":true')" -eq "$n" ] \
      || fail "$name not ok: $out"
    grep -qxF "  trainer values: $trainer" "$dir/err" \
      || fail "$name: the harness's trainer values are not the .expect's: $(grep 'trainer values' "$dir/err")"
    # The values filled in, once, as the .expect lists them.
    filled=$(sed -n '/^filled_auto:$/,/^config:$/p' "$expect" \
             | sed '1d;$d;s/^  //' \
             | awk 'NR > 1 { printf ", " } { printf "%s", $0 }')
    if [ -n "$filled" ]; then
      [ "$(grep -cF "$filled" "$dir/err")" -eq 1 ] \
        || fail "$name: stderr does not list the filled values once ($filled): $(cat "$dir/err")"
    fi
    runs=$((runs + 1))
  else
    [ "$rc" -eq 2 ] || fail "$name exited $rc, want 2 (refused): $(tail -5 "$dir/err")"
    # Every problem line of the .expect, in the harness's message.
    while IFS= read -r line; do
      grep -qF -- "$line" "$dir/err" \
        || fail "$name: the harness's message lacks: $line"
    done < <(sed -n 's/^  - /  - /p' "$expect")
    refused=$((refused + 1))
  fi
done
[ "$runs" -ge 50 ] || fail "only $runs real files ran"
echo "$runs real files ran as written, $refused were refused as expected"
