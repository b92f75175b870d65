#!/usr/bin/env bash
# tools/harness --config: a user's file runs as written (its dtype, its
# offload, its stage), flags override it without conflict, and errors name
# the file.
set -u
harness="$1"
corpus="$2"  # config/testdata/corpus: every file it accepts must run
dir="${TEST_TMPDIR:-$(mktemp -d)}"
pass=0
fail() { echo "FAIL: $*"; exit 1; }

# DeepSpeed's other bf16 spelling, optimizer offload at stage 2, a harmless
# monitoring section, a GAS the harness replaces.
cat > "$dir/bf16_offload.json" <<'JSON'
{
  "train_micro_batch_size_per_gpu": 4,
  "gradient_accumulation_steps": 8,
  "bfloat16": {"enabled": true},
  "gradient_clipping": 1.0,
  "zero_optimization": {"stage": 2,
                        "offload_optimizer": {"device": "cpu", "pin_memory": true}},
  "tensorboard": {"enabled": false}
}
JSON
out=$("$harness" --config="$dir/bf16_offload.json" --json --world=1,3 \
      --steps=2 --scaling=configured 2>"$dir/err") \
  || fail "bf16 offload file exited $?: $(cat "$dir/err")"
lines=$(echo "$out" | wc -l)
[ "$lines" -eq 2 ] || fail "want 2 scenarios (stage 2 x worlds 1,3), got $lines: $out"
for want in '"dtype":"bf16"' '"offload":"cpu"' '"stage":2' '"ok":true' \
            '"ref_tolerance":0.01' '"ignored_keys":["tensorboard"]'; do
  n=$(echo "$out" | grep -cF "$want")
  [ "$n" -eq 2 ] || fail "$want in $n of 2 records: $out"
done
grep -q "zerostep info: ds_config keys accepted without effect.*tensorboard" \
  "$dir/err" || fail "stderr lacks the ignored keys: $(cat "$dir/err")"
[ "$(grep -c 'accepted without effect' "$dir/err")" -eq 1 ] \
  || fail "the ignored keys are not listed exactly once: $(cat "$dir/err")"
pass=$((pass + 1))

# Flags override the file: other dtypes, no offload, other stages.
out=$("$harness" --config="$dir/bf16_offload.json" --json --world=2 \
      --steps=1 --scaling=none --dtype=fp32,fp16 --offload=none \
      --stages=0,3 2>"$dir/err") \
  || fail "overriding flags exited $?: $(cat "$dir/err")"
[ "$(echo "$out" | grep -c '"offload":"none"')" -eq 4 ] || fail "offload: $out"
[ "$(echo "$out" | grep -c '"dtype":"fp16"')" -eq 2 ] || fail "fp16: $out"
[ "$(echo "$out" | grep -c '"dtype":"fp32"')" -eq 2 ] || fail "fp32: $out"
[ "$(echo "$out" | grep -c '"ok":true')" -eq 4 ] || fail "not ok: $out"
pass=$((pass + 1))

# An fp16 file: its dtype, and an injected overflow without --dtype.
cat > "$dir/fp16.json" <<'JSON'
{"train_batch_size": 16, "fp16": {"enabled": true, "initial_scale_power": 8,
 "loss_scale_window": 2}, "zero_optimization": {"stage": 1}}
JSON
out=$("$harness" --config="$dir/fp16.json" --json --world=2 --steps=3 \
      --scaling=configured --overflow=1:1:0 2>"$dir/err") \
  || fail "fp16 file exited $?: $(cat "$dir/err")"
for want in '"dtype":"fp16"' '"skipped_steps":1' '"ok":true'; do
  echo "$out" | grep -qF "$want" || fail "fp16 file: no $want in $out"
done
pass=$((pass + 1))

# "auto" takes the harness's trainer values (Note [Trainer values]), which
# it prints once, with what it filled.
cat > "$dir/auto.json" <<'JSON'
{"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
 "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
 "bf16": {"enabled": "auto"},
 "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto"}},
 "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}}
JSON
out=$("$harness" --config="$dir/auto.json" --json --world=2 --steps=1 \
      --scaling=none --micro-batch=3 --clip=0.5 2>"$dir/err") \
  || fail "auto file exited $?: $(cat "$dir/err")"
echo "$out" | grep -qF '"ok":true' || fail "auto file not ok: $out"
want="train_micro_batch_size_per_gpu = 3, gradient_accumulation_steps = 4, \
train_batch_size = 24, gradient_clipping = 0.5, optimizer.params.lr = 0.001, \
optimizer.params.betas = [0.9,0.999], bf16.enabled = false, \
zero_optimization.reduce_bucket_size = 4096"
[ "$(grep -cF "filled with the trainer's values (Hugging Face's rules; see docs/config.md): $want" "$dir/err")" -eq 1 ] \
  || fail "the filled values are not printed once as $want: $(cat "$dir/err")"
grep -qF "trainer values: micro_batch_size=3 gradient_accumulation_steps=4" \
  "$dir/err" || fail "no trainer values: $(cat "$dir/err")"
# Errors name the file: an "auto" nobody fills.
echo '{"train_micro_batch_size_per_gpu": 2,
       "zero_optimization": {"sub_group_size": "auto"}}' > "$dir/auto2.json"
err=$("$harness" --config="$dir/auto2.json" 2>&1 >/dev/null); rc=$?
[ "$rc" -eq 2 ] || fail "auto file exited $rc, want 2"
[[ "$err" == *"$dir/auto2.json"*"zero_optimization.sub_group_size"* ]] \
  || fail "the error does not name the file and the key: $err"
err=$("$harness" --config="$dir/fp16.json" --offload=cpu --stages=0 2>&1 \
      >/dev/null); rc=$?
[ "$rc" -eq 2 ] || fail "no scenario left exited $rc, want 2"
[[ "$err" == *"no scenario to run"* ]] || fail "empty matrix: $err"
pass=$((pass + 1))
# Every corpus file the parser accepts runs as written, at the world size
# its .expect states.
runs=0
for expect in "$corpus"/*.expect; do
  grep -qx accept "$expect" || continue
  file="${expect%.expect}.json"
  world=$(sed -n 's/^world_size: *//p' "$expect")
  out=$("$harness" --config="$file" --json --world="$world" --steps=2 \
        --scaling=configured 2>"$dir/err")
  rc=$?
  [ "$rc" -eq 0 ] || fail "$(basename "$file") exited $rc: $(tail -5 "$dir/err")"
  n=$(echo "$out" | wc -l)
  [ "$n" -ge 1 ] || fail "$(basename "$file"): no scenario"
  [ "$(echo "$out" | grep -c '"ok":true')" -eq "$n" ] \
    || fail "$(basename "$file") not ok: $out"
  runs=$((runs + 1))
done
[ "$runs" -ge 10 ] || fail "only $runs accepted corpus files ran"
echo "  $runs accepted corpus files ran"
pass=$((pass + 1))
echo "$pass passed, 0 failed"
