#!/usr/bin/env bash
# Prints the path of a Python virtual environment holding exactly the pinned
# packages of a requirements file, creating it first if needed: the tests
# that check zerostep against Python tools from PyPI share it.
#
#   venv="$(pinned_venv.sh PREFIX REQUIREMENTS_TXT 'import tinker, numpy')"
#   venv="$(pinned_venv.sh PREFIX REQUIREMENTS_TXT 'import peft' SITE_PACKAGES)"
#
# With SITE_PACKAGES (a folder of another environment, e.g. the pinned
# torch's that third_party/libtorch/setup.sh installs), the environment sees
# its packages through a .pth file written before pip runs, so pip counts
# them as installed and downloads nothing they already satisfy (torch's 4.5
# GB): the requirements then pin only what the folder lacks. The folder is
# part of the environment's identity (its hash).
#
# The environment lives in a cache outside the repository,
# /var/cache/zerostep/PREFIX-<hash of the pins> (or under
# $XDG_CACHE_HOME / ~/.cache when that is not writable), is built under a
# lock (tests may run at once) into a temporary folder renamed into place,
# and is rebuilt when the import check fails. The first run needs network
# access to PyPI; a failure exits non-zero (the calling test fails, never
# skips). PINNED_VENV_PROGRESS=1 lets pip name each download on stderr (for
# large installs) instead of installing quietly.
set -euo pipefail

prefix="$1"
requirements="$(realpath "$2")"
check="$3"
site="${4:-}"
if [ -n "$site" ] && [ ! -d "$site" ]; then
  echo "pinned_venv: $site is not a folder (SITE_PACKAGES)" >&2
  exit 2
fi

if [ -n "$site" ]; then
  pins="$( (cat "$requirements"; echo "site=$site") | sha256sum | cut -c1-12)"
else
  pins="$(sha256sum "$requirements" | cut -c1-12)"
fi
cache=/var/cache/zerostep
if ! mkdir -p "$cache" 2>/dev/null || [ ! -w "$cache" ]; then
  cache="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/zerostep"
  mkdir -p "$cache"
fi
venv="$cache/$prefix-$pins"

python=/usr/bin/python3
[ -x "$python" ] || python="$(command -v python3)"

(
  flock 9
  if ! "$venv/bin/python" -c "$check" 2>/dev/null; then
    echo "pinned_venv: creating $venv from PyPI ($requirements)" >&2
    rm -rf "$venv" "$venv.tmp"
    "$python" -m venv "$venv.tmp"
    if [ -n "$site" ]; then
      purelib="$("$venv.tmp/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
      echo "$site" > "$purelib/zerostep_site.pth"
    fi
    quiet=(--quiet)
    [ "${PINNED_VENV_PROGRESS:-0}" = 1 ] && quiet=(--progress-bar off)
    "$venv.tmp/bin/python" -m pip install "${quiet[@]}" --disable-pip-version-check \
      -r "$requirements" >&2
    mv "$venv.tmp" "$venv"
  fi
) 9>"$cache/$prefix.lock"
echo "$venv"
