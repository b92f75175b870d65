#!/usr/bin/env bash
# //conformance:conformance_test: zerostep against DeepSpeed 0.19.8 on the
# same weights and data (conform.py; issue 47). Arguments: conform.py,
# zerostep_run, benchmarks/peers/run.py (finds the pinned torch venv),
# benchmarks/peers/deepspeed_site.sh, and "cuda" or "default" (the build
# configuration).
#
# Only under --config=cuda does zerostep_run link the LibTorch that
# DeepSpeed's torch runs (PyPI torch 2.11.0): in the default configuration
# (Debian's LibTorch 1.13) the test is reported SKIPPED in its test.xml
# (tools/test_skips.py lists it), never passed.
#
# DeepSpeed's folder: $ZEROSTEP_DEEPSPEED_SITE (--test_env) if set, else
# <cache>/deepspeed-0.19.8-site (the cache common/pinned_venv.sh uses),
# made under a lock by deepspeed_site.sh on first use (PyPI), with
# DeepSpeed's JIT-built CPU FusedAdam kept in its torch_extensions/ (built by
# the first run). Measured on a busy 2-core AMD EPYC: the first run 7
# minutes in all, later ones 3. A failure there fails the test.
#
# ZEROSTEP_CONFORMANCE_LONG=1 (--test_env): every dtype with both variants
# at worlds 1, 2 and 3 (the quick run: worlds 1 and 2, conformance/
# prepare.py's quick_cases).
set -euo pipefail
config="$5"

skip() {  # CASE REASON: a skip recorded in test.xml, then exit 0
  echo "SKIPPED: $2"
  if [ -n "${XML_OUTPUT_FILE:-}" ]; then
    python3 - "$XML_OUTPUT_FILE" "${TEST_TARGET:-conformance_test}" "$1" "$2" <<'PY'
import sys
from xml.sax.saxutils import quoteattr
path, suite, case, reason = sys.argv[1:]
with open(path, "w") as f:
    f.write('<?xml version="1.0" encoding="UTF-8"?>\n'
            '<testsuites tests="1" failures="0" errors="0" skipped="1">\n'
            ' <testsuite name=%s tests="1" failures="0" errors="0" skipped="1">\n'
            '  <testcase name=%s classname=%s status="run" result="skipped">\n'
            '   <skipped message=%s/>\n  </testcase>\n </testsuite>\n</testsuites>\n'
            % (quoteattr(suite), quoteattr(case), quoteattr(suite), quoteattr(reason)))
PY
  fi
  exit 0
}

if [ "$config" != cuda ]; then
  skip NeedsCudaConfig "zerostep_run links Debian's LibTorch 1.13 here, not DeepSpeed's torch \
2.11, so the two sides would not run the same ops. Fix: ./bazelw test --config=cuda \
//conformance:conformance_test"
fi

conform="$(realpath "$1")" zbin="$(realpath "$2")" peers_run="$(realpath "$3")"
site_sh="$(realpath "$4")"
python="$(python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import run; print(run.torch_python(False) or "")' "$(dirname "$peers_run")")"
if [ -z "$python" ]; then
  echo "conformance_test: the pinned torch venv is absent although this is the --config=cuda" \
    "build, which ./bazelw sets it up for. Fix: third_party/libtorch/setup.sh 2.11.0" >&2
  exit 1
fi

site="${ZEROSTEP_DEEPSPEED_SITE:-}"
if [ -z "$site" ]; then
  cache=/var/cache/zerostep
  if ! mkdir -p "$cache" 2>/dev/null || [ ! -w "$cache" ]; then
    cache="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/zerostep"
    mkdir -p "$cache"
  fi
  site="$cache/deepspeed-0.19.8-site"
  (
    flock 9
    if ! DS_ACCELERATOR=cpu PYTHONPATH="$site" "$python" -c 'import deepspeed' 2>/dev/null; then
      echo "conformance_test: making $site (PyPI)" >&2
      rm -rf "$site" "$site.tmp"
      "$site_sh" "$site.tmp" >&2
      mv "$site.tmp" "$site"
    fi
  ) 9>"$cache/deepspeed-0.19.8-site.lock"
fi

worlds=1,2 long=()
if [ "${ZEROSTEP_CONFORMANCE_LONG:-0}" = 1 ]; then worlds=1,2,3 long=(--long); fi
dir="${TEST_TMPDIR:-$(mktemp -d)}/run"
out="${TEST_UNDECLARED_OUTPUTS_DIR:-$dir}"
mkdir -p "$out"
(
  # The JIT-built ops: one build at a time.
  flock 9
  python3 "$conform" --python="$python" --zerostep-bin="$zbin" --deepspeed-site="$site" \
    --worlds="$worlds" "${long[@]}" --dir="$dir" --json="$out/conformance.json"
) 9>"$site.ops.lock"
