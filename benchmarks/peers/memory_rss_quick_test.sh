#!/usr/bin/env bash
# //benchmarks/peers:memory_rss_quick_test: memory_rss.py on a small GPT at
# world 2, stages 0-3: every rank reports its resident memory, and the plan
# it prints is the engine's accounting (the figures themselves are
# measurements: docs/benchmarks.md, never asserted here); then a Hugging
# Face folder built on the meta device (--load=meta) at stages 0-3.
set -euo pipefail
script="$1" zbin="$2" launch="$3" make_hf_model="$4"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
python3 "$script" --zerostep-bin="$zbin" --launch-bin="$launch" --worlds=2 \
  --vocab=256 --d-model=64 --n-layer=2 --n-head=2 --block-size=16 --windows=1 \
  --bucket-elements=4096 \
  --out="$dir/rss.json"
python3 - "$dir/rss.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
rows = r["rows"]
assert [(x["world"], x["stage"]) for x in rows] == [(2, s) for s in range(4)], rows
for x in rows:
    assert len(x["rss_kib"]) == 2, x
    for rank in x["rss_kib"]:
        assert rank["baseline"] > 0 and rank["training_peak"] >= rank["at_rest"] > 0, rank
    e = x["engine_bytes"]
    assert x["plan_peak_mb"] == e["peak"] / 1e6 >= x["plan_rest_mb"] > 0, x
print("memory_rss_quick_test: gpt ok")
PY
# A Hugging Face folder built on the meta device at every stage: each rank
# reads its own elements from the folder and trains.
"$make_hf_model" --out="$dir/llama" --preset=tiny --arch=llama --seed=5
python3 "$script" --zerostep-bin="$zbin" --launch-bin="$launch" --worlds=2 \
  --hf="$dir/llama" --load=meta --block-size=16 --windows=1 --bucket-elements=4096 \
  --out="$dir/meta.json"
python3 - "$dir/meta.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
assert [x["stage"] for x in rows] == [0, 1, 2, 3], rows
assert all(len(x["rss_kib"]) == 2 and x["plan_peak_mb"] > 0 for x in rows), rows
print("memory_rss_quick_test: meta ok")
PY
