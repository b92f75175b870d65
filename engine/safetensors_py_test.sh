#!/usr/bin/env bash
# zerostep's safetensors exports read by the reference reader from PyPI.
#
#   safetensors_py_test.sh WRITER TEST_PY REQUIREMENTS_TXT
#
# WRITER (engine/safetensors_py_test_writer.cc) writes two exports and the
# values expected in them; TEST_PY reads them with the pinned `safetensors`
# and `numpy` of REQUIREMENTS_TXT, installed once into a virtual
# environment in a cache outside the repository
# (/var/cache/zerostep/safetensors-venv-<hash of the pins>), as
# tools/tinker/e2e_test.sh does. The first run needs network access to
# PyPI; a failure to build the environment fails the test (it never skips).
set -euo pipefail

writer="$(realpath "$1")"
script="$(realpath "$2")"
requirements="$(realpath "$3")"

pins="$(sha256sum "$requirements" | cut -c1-12)"
cache=/var/cache/zerostep
if ! mkdir -p "$cache" 2>/dev/null || [ ! -w "$cache" ]; then
  cache="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/zerostep"
  mkdir -p "$cache"
fi
venv="$cache/safetensors-venv-$pins"

python=/usr/bin/python3
[ -x "$python" ] || python="$(command -v python3)"

(
  flock 9
  if ! "$venv/bin/python" -c "import safetensors, numpy" 2>/dev/null; then
    echo "safetensors_py_test: creating $venv from PyPI" >&2
    rm -rf "$venv" "$venv.tmp"
    "$python" -m venv "$venv.tmp"
    "$venv.tmp/bin/python" -m pip install --quiet --disable-pip-version-check \
      -r "$requirements"
    mv "$venv.tmp" "$venv"
  fi
) 9>"$cache/safetensors-venv.lock"

out="${TEST_TMPDIR:-$(mktemp -d)}/exports"
mkdir -p "$out"
"$writer" "$out"
exec "$venv/bin/python" -u "$script" "$out"
