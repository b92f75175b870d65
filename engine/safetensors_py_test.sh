#!/usr/bin/env bash
# zerostep's safetensors exports read by the reference reader from PyPI.
#
#   safetensors_py_test.sh WRITER TEST_PY REQUIREMENTS_TXT PINNED_VENV_SH
#
# WRITER (engine/safetensors_py_test_writer.cc) writes two exports and the
# values expected in them; TEST_PY reads them with the pinned `safetensors`
# and `numpy` of REQUIREMENTS_TXT, installed once into a cached virtual
# environment by common/pinned_venv.sh. The first run needs network access
# to PyPI; a failure to build the environment fails the test (it never
# skips).
set -euo pipefail

writer="$(realpath "$1")"
script="$(realpath "$2")"
requirements="$(realpath "$3")"
pinned_venv="$(realpath "$4")"

venv="$("$pinned_venv" safetensors-venv "$requirements" "import safetensors, numpy")"

out="${TEST_TMPDIR:-$(mktemp -d)}/exports"
mkdir -p "$out"
"$writer" "$out"
exec "$venv/bin/python" -u "$script" "$out"
