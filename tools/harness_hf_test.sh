#!/usr/bin/env bash
# tools/harness on a Hugging Face folder (--model=hf:DIR): make_hf_model
# writes a small random Qwen3 (tied) and Llama (untied) folder, the parity
# matrix runs on each at stages 0-3 in both accumulation modes and with
# optimizer and parameter offload, every scenario ok (bitwise managed ==
# unmanaged, offload == none); a folder that cannot be used is refused
# before any rank starts, naming it.
set -u
harness="$1"
make_hf_model="$2"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*"; exit 1; }

"$make_hf_model" --out="$dir/qwen3" --preset=tiny --arch=qwen3 --tied --seed=3 \
  || fail "make_hf_model qwen3 exited $?"
"$make_hf_model" --out="$dir/llama" --preset=tiny --arch=llama --seed=4 \
  || fail "make_hf_model llama exited $?"

for m in qwen3 llama; do
  "$harness" --model="hf:$dir/$m" --stages=0,1,2,3 --world=2 --backwards=2,1,3 \
    --scaling=per_step_count >"$dir/out" 2>"$dir/err" \
    || fail "$m: the matrix exited $?: $(tail -c 3000 "$dir/err")"
  grep -q "4 of 4 scenarios ok" "$dir/err" || fail "$m: $(tail -c 3000 "$dir/err")"
  grep -q "model=hf:$dir/$m" "$dir/err" || fail "$m: the model is not named: $(head -c 2000 "$dir/err")"
done

"$harness" --model="hf:$dir/llama" --stages=3 --world=2 --backwards=3,1 \
  --offload=cpu --offload-param >"$dir/out" 2>"$dir/err" \
  || fail "offload exited $?: $(tail -c 3000 "$dir/err")"
grep -q "3 of 3 scenarios ok" "$dir/err" || fail "offload: $(tail -c 3000 "$dir/err")"

# No folder there: refused, naming it.
"$harness" --model="hf:$dir/none" --stages=0 --world=1 >"$dir/out" 2>"$dir/err"
rc=$?
[ "$rc" -ne 0 ] || fail "a missing folder exited 0"
grep -q "$dir/none/config.json" "$dir/err" || fail "missing folder: $(cat "$dir/err")"
echo "PASS"
