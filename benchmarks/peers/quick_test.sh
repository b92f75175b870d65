#!/usr/bin/env bash
# //benchmarks/peers:quick_test: run.py --quick, then checks its JSON and SVG.
# DeepSpeed runs too where --test_env=ZEROSTEP_DEEPSPEED_SITE=<folder> names
# a folder holding deepspeed 0.19.8 and its needs (pip install --target):
# then its stage 0-3 rows must come out paired with zerostep's. Without the
# pinned torch venv it records a skip (common/test_skip.sh), never a pass.
set -euo pipefail
run="$1" zbin="$2" launch="$3"
source "$4"  # common/test_skip.sh
dir="${TEST_TMPDIR:-$(mktemp -d)}"
ds=()
if [ -n "${ZEROSTEP_DEEPSPEED_SITE:-}" ]; then ds=(--deepspeed-site="$ZEROSTEP_DEEPSPEED_SITE"); fi
# --zerostep-lib-path as gpu_pack/run.sh passes it: the zerostep launch's
# own library path (here one it does not need: the binaries carry theirs).
out=$(python3 "$run" --quick --skip-without-torch --zerostep-bin="$zbin" \
  --launch-bin="$launch" --zerostep-lib-path="$dir/no-such-lib" "${ds[@]}" \
  --out="$dir/peers.json" --svg="$dir/peers.svg")
echo "$out"
if [[ "$out" == SKIPPED* ]]; then test_skip PinnedTorchVenv "${out#SKIPPED: }"; fi
python3 - "$dir/peers.json" "${ZEROSTEP_DEEPSPEED_SITE:-}" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
modes = [row["mode"] for row in r["summary"]]
want = ["stage0", "stage1", "stage2", "stage3", "stage2_once", "stage3_once",
        "stage0_overlap", "stage2_overlap", "stage2_once_overlap",
        "stage3_gather", "stage3_once_gather"]
assert modes == want, modes
got = {(x["framework"], x["mode"]) for x in r["runs"]}
assert {("torch", "ddp"), ("torch", "fsdp2")} <= got, got
assert len({x["params"] for x in r["runs"]}) == 1, "parameter counts differ"
# Timing runs leave glibc's allocator as it is: resident memory (and the
# mmap threshold it needs) only with zerostep_step --rss (memory_rss.py).
assert all(x.get("rss_kib") is None for x in r["runs"] if x["framework"] == "zerostep"), \
    [x["rss_kib"] for x in r["runs"] if x.get("rss_kib") is not None][:1]
for row in r["summary"]:
    assert row["ratio_faster_peer"]["median"] > 0, row
paired = [row["mode"] for row in r["summary"] if "ratio_deepspeed" in row]
if sys.argv[2]:
    assert paired == ["stage0", "stage1", "stage2", "stage3"], paired
    assert {("deepspeed", m) for m in paired} <= got, got
else:
    assert not paired and r["settings"]["deepspeed"].startswith("not run"), r["settings"]
print("quick_test: %d modes, %d runs, params %d: ok" % (len(modes), len(r["runs"]), r["runs"][0]["params"]))
PY
grep -q "<svg" "$dir/peers.svg"
# The table and plot again from the JSON alone, titled with its world.
python3 "$run" --from-json="$dir/peers.json" --svg="$dir/again.svg" >/dev/null
grep -q "2 Gloo ranks" "$dir/again.svg"
