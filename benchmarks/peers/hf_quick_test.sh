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
# The GPU pack's benchmark driver on the same Llama folder, on the CPU
# (--device=cpu --quick, 2 Gloo ranks, no DeepSpeed): what gpu_pack/run.sh
# runs on the node with make_hf_model's 125m and 350m folders.
gpu_run="$(dirname "$run")/gpu_run.py"
python="$(python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import run; print(run.hf_python())' "$(dirname "$run")")"
"$python" "$gpu_run" --device=cpu --backend=gloo --quick --no-deepspeed --zerostep-bin="$zbin" \
  --python="$python" --hf="$dir/hf/llama-tiny" --out="$dir/gpu.json" --table="$dir/gpu.md"
python3 - "$dir/gpu.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert not r["failures"], r["failures"]
assert {x["size"] for x in r["runs"]} == {"llama-tiny"}, {x["size"] for x in r["runs"]}
assert len({x["params"] for x in r["runs"]}) == 1, "parameter counts differ"
rows = {x["mode"]: x for x in r["summary"]}
assert rows["stage3"]["ratio_fsdp2"]["median"] > 0, rows["stage3"]
print("hf_quick_test: gpu_run.py on the Llama folder: %d rows: ok" % len(rows))
PY
