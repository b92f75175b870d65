#!/usr/bin/env bash
# //benchmarks/peers:gpu_run_quick_test: the GPU benchmark's driver
# (gpu_run.py) end to end on the CPU: --device=cpu --backend=gloo --quick,
# 2 ranks, a 30k-parameter GPT. zerostep, FSDP2 and DeepSpeed each run every
# mode or say why not; the parameter counts agree; the JSON and the tables
# come out. No timing is checked. It needs the pinned torch venv
# (third_party/libtorch/setup.sh) and records a skip (common/test_skip.sh)
# where that is absent, never a pass. DeepSpeed runs where --test_env=ZEROSTEP_DEEPSPEED_SITE=<folder>
# names a folder holding deepspeed 0.19.8 and its needs (pip install
# --target); otherwise each DeepSpeed mode must be reported as not run,
# naming the fix.
set -euo pipefail
gpu_run="$1" run_py="$2" zbin="$3"
source "$4"  # common/test_skip.sh
dir="${TEST_TMPDIR:-$(mktemp -d)}"
python="$(python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import run; print(run.torch_python(False) or "")' "$(dirname "$run_py")")"
if [ -z "$python" ]; then
  test_skip PinnedTorchVenv "the pinned torch venv is absent; third_party/libtorch/setup.sh 2.11.0 installs it"
fi
ds=()
if [ -n "${ZEROSTEP_DEEPSPEED_SITE:-}" ]; then ds=(--deepspeed-site="$ZEROSTEP_DEEPSPEED_SITE"); fi
python3 "$gpu_run" --device=cpu --backend=gloo --quick --zerostep-bin="$zbin" \
  --python="$python" "${ds[@]}" --out="$dir/gpu.json" --table="$dir/gpu.md"
python3 - "$dir/gpu.json" "${ZEROSTEP_DEEPSPEED_SITE:-}" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert not r["failures"], r["failures"]
rows = {x["mode"]: x for x in r["summary"]}
assert list(rows) == ["stage0", "stage1", "stage2", "stage3", "stage1_offload", "stage2_offload",
                      "stage3_offload"], list(rows)
for mode, row in rows.items():
    assert row["zerostep"]["window_s"]["median"] > 0, (mode, row)  # stage 3 runs on the CPU
    assert row["fsdp2"]["window_s"]["median"] > 0, (mode, row)
    assert row["ratio_fsdp2"]["median"] > 0, (mode, row)
assert len({x["params"] for x in r["runs"]}) == 1, "parameter counts differ"
managed = {m["framework"]: m for m in r["managed"]}
assert managed["zerostep"]["ratio"]["median"] > 0, managed
ds_modes = r["settings"]["deepspeed_modes"]
if sys.argv[2]:
    assert r["deepspeed"] == "ran", r["deepspeed"]
    assert all(row["ratio_deepspeed"]["median"] > 0 for row in rows.values())
    assert managed["deepspeed"]["ratio"]["median"] > 0, managed
else:
    refused = {k.split("/")[2]: v for k, v in r["unsupported"].items() if "/deepspeed/" in k}
    assert sorted(refused) == sorted(ds_modes), refused
    assert all("Fix:" in v for v in refused.values()), refused
    assert r["deepspeed"].startswith("did not run everywhere"), r["deepspeed"]
print("gpu_run_quick_test: %d rows, %d runs, params %d, DeepSpeed: %s: ok" % (
    len(rows), len(r["runs"]), r["runs"][0]["params"], r["deepspeed"]))
PY
grep -q "unmanaged / managed" "$dir/gpu.md"
