#!/usr/bin/env bash
# //benchmarks/peers:hf_quick_test: run.py --quick --hf=tiny at one rank:
# zerostep's Llama folder model against transformers' (PyTorch eager, DDP
# and FSDP2) on the same folder, the parameter counts equal and the eager
# ratio row out. No timing is checked. The torch side runs in the pinned
# environment of models/hf_py_requirements.txt (made on first use: PyPI).
set -euo pipefail
run="$1" zbin="$2" launch="$3" make="$4"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
python3 "$run" --quick --hf=tiny --hf-dir="$dir/hf" --world=1 \
  --zerostep-modes=stage0,stage3 --zerostep-bin="$zbin" --launch-bin="$launch" \
  --make-hf-model-bin="$make" --out="$dir/peers.json"
python3 - "$dir/peers.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
got = {(x["framework"], x["mode"]) for x in r["runs"]}
assert {("torch", "eager"), ("torch", "ddp"), ("torch", "fsdp2"),
        ("zerostep", "stage0"), ("zerostep", "stage3")} <= got, got
assert len({x["params"] for x in r["runs"]}) == 1, "parameter counts differ"
assert all(row["ratio_eager"]["median"] > 0 for row in r["summary"]), r["summary"]
print("hf_quick_test: params %d, eager / zerostep %.2f: ok"
      % (r["runs"][0]["params"], r["summary"][0]["ratio_eager"]["median"]))
PY
