#!/usr/bin/env bash
# Makes a folder holding DeepSpeed 0.19.8 and its needs for the pinned torch
# venv's python, for `run.py --deepspeed-site=DIR` (and the peers' quick
# tests with --test_env=ZEROSTEP_DEEPSPEED_SITE=DIR):
#
#   benchmarks/peers/deepspeed_site.sh /tmp/deepspeed-site
#
# PyPI has DeepSpeed 0.19.8 as an sdist only: it is built into a pure-Python
# wheel with DS_BUILD_OPS=0 (no op compiled now; on its CPU accelerator
# DeepSpeed JIT-builds its shared-memory collective op at first use, with
# ninja and g++), then installed with pinned needs by `pip install --target`,
# so the venv itself is not changed. Needs PyPI and the pinned venv
# (third_party/libtorch/setup.sh 2.11.0).
set -euo pipefail
if [ $# -ne 1 ]; then
  echo "usage: $0 DIR (the folder to make; run.py --deepspeed-site=DIR)" >&2
  exit 2
fi
out="$1"
here="$(cd "$(dirname "$0")" && pwd)"
python="$(python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import run; print(run.torch_python(False) or "")' "$here")"
if [ -z "$python" ]; then
  echo "the pinned torch venv is absent. Fix: third_party/libtorch/setup.sh 2.11.0" >&2
  exit 1
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --no-binary=:all: -d "$tmp" deepspeed==0.19.8
DS_BUILD_OPS=0 python3 -m pip wheel -q --no-deps -w "$tmp" "$tmp/deepspeed-0.19.8.tar.gz"
"$python" -m pip install -q --no-deps --target "$out" "$tmp"/deepspeed-0.19.8-py3-none-any.whl \
  einops==0.8.2 hjson==3.1.0 msgpack==1.2.4 ninja==1.13.2 numpy==2.4.6 packaging==26.4 \
  psutil==7.2.2 py-cpuinfo==9.0.0 pydantic==2.14.4 pydantic-core==2.50.5 \
  annotated-types==0.8.0 typing-inspection==0.4.5 tqdm==4.70.1
DS_ACCELERATOR=cpu PYTHONPATH="$out" "$python" -c 'import deepspeed; print("deepspeed", deepspeed.__version__, "in", deepspeed.__path__[0])'
