#!/usr/bin/env bash
# End-to-end test of the trainer server with the official tinker SDK.
#
#   e2e_test.sh SERVER_BINARY E2E_TEST_PY REQUIREMENTS_TXT [args for the .py]
#
# Creates (once) a virtual environment with exactly the pinned packages of
# REQUIREMENTS_TXT from PyPI, in a cache outside the repository
# (/var/cache/zerostep/tinker-venv-<sdk version>-<hash of the pins>), then
# runs E2E_TEST_PY with it. The first run needs network access to PyPI;
# a failure to build the environment fails the test (it never skips).
set -euo pipefail

server="$(realpath "$1")"
script="$(realpath "$2")"
requirements="$(realpath "$3")"
shift 3

version="$(sed -n 's/^tinker==//p' "$requirements")"
if [ -z "$version" ]; then
  echo "e2e_test: $requirements pins no tinker version" >&2
  exit 1
fi
pins="$(sha256sum "$requirements" | cut -c1-12)"
cache=/var/cache/zerostep
if ! mkdir -p "$cache" 2>/dev/null || [ ! -w "$cache" ]; then
  cache="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/zerostep"
  mkdir -p "$cache"
fi
venv="$cache/tinker-venv-$version-$pins"

python=/usr/bin/python3
[ -x "$python" ] || python="$(command -v python3)"

(
  flock 9
  if ! "$venv/bin/python" -c "import tinker, numpy" 2>/dev/null; then
    echo "e2e_test: creating $venv (tinker $version from PyPI)" >&2
    rm -rf "$venv" "$venv.tmp"
    "$python" -m venv "$venv.tmp"
    "$venv.tmp/bin/python" -m pip install --quiet --disable-pip-version-check \
      -r "$requirements"
    mv "$venv.tmp" "$venv"
  fi
) 9>"$cache/tinker-venv.lock"

installed="$("$venv/bin/python" -c 'import tinker; print(tinker.__version__)')"
if [ "$installed" != "$version" ]; then
  echo "e2e_test: $venv has tinker $installed, expected $version" >&2
  exit 1
fi
exec "$venv/bin/python" -u "$script" --server="$server" "$@"
