#!/usr/bin/env bash
# End-to-end test of the trainer server with the official tinker SDK.
#
#   e2e_test.sh SERVER_BINARY E2E_TEST_PY REQUIREMENTS_TXT PINNED_VENV_SH
#               [args for the .py]
#
# Creates (once) a virtual environment with exactly the pinned packages of
# REQUIREMENTS_TXT from PyPI, cached by common/pinned_venv.sh
# (tinker-venv-<sdk version>-<hash of the pins>), then runs E2E_TEST_PY
# with it. The first run needs network access to PyPI;
# a failure to build the environment fails the test (it never skips).
set -euo pipefail

server="$(realpath "$1")"
script="$(realpath "$2")"
requirements="$(realpath "$3")"
pinned_venv="$(realpath "$4")"
shift 4

version="$(sed -n 's/^tinker==//p' "$requirements")"
if [ -z "$version" ]; then
  echo "e2e_test: $requirements pins no tinker version" >&2
  exit 1
fi
venv="$("$pinned_venv" "tinker-venv-$version" "$requirements" "import tinker, numpy")"

installed="$("$venv/bin/python" -c 'import tinker; print(tinker.__version__)')"
if [ "$installed" != "$version" ]; then
  echo "e2e_test: $venv has tinker $installed, expected $version" >&2
  exit 1
fi
exec "$venv/bin/python" -u "$script" --server="$server" "$@"
