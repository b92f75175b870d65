#!/usr/bin/env bash
# Sets up a pinned LibTorch from PyPI's torch wheel (which carries a complete
# LibTorch: include/, lib/) and prints its folder:
#
#   third_party/libtorch/setup.sh 2.11.0    # -> /var/cache/zerostep/libtorch-2.11.0
#
# The wheel is installed once, with its CUDA runtime wheels, into a cached
# virtual environment (common/pinned_venv.sh: outside the repository, under a
# lock, rebuilt if broken), and the stable link libtorch-<version> in the same
# cache names its torch/ folder. --config=cuda builds against that link
# (third_party/libtorch/libtorch.bzl); ./bazelw runs this script whenever it
# is given --config=cuda, so nothing is done by hand. The first run downloads
# about 4.5 GB from PyPI (about 5 minutes here) and prints pip's progress.
set -euo pipefail

version="${1:?usage: setup.sh VERSION (a torch release with a requirements file here: torch-VERSION.txt)}"
here="$(cd "$(dirname "$0")" && pwd)"
requirements="$here/torch-$version.txt"
if [ ! -f "$requirements" ]; then
  echo "setup.sh: no pinned requirements for torch $version ($requirements is missing)." \
    "Pinned: $(cd "$here" && ls torch-*.txt | sed 's/torch-//; s/\.txt//' | tr '\n' ' ')" >&2
  exit 2
fi

# Fast path (every ./bazelw --config=cuda call): the link is in place.
for cache in /var/cache/zerostep "${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/zerostep"; do
  if grep -qs "^__version__ = '$version[+']" "$cache/libtorch-$version/version.py" &&
    [ -f "$cache/libtorch-$version/include/torch/csrc/api/include/torch/torch.h" ]; then
    echo "$cache/libtorch-$version"
    exit 0
  fi
done

# The check reads the installed version without importing torch (seconds).
venv="$(PINNED_VENV_PROGRESS=1 "$here/../../common/pinned_venv.sh" "torch-$version" "$requirements" \
  "import importlib.metadata as m, sys; sys.exit(m.version('torch').split('+')[0] != '$version')")"
torch_dir="$(echo "$venv"/lib/python3*/site-packages/torch)"
if [ ! -f "$torch_dir/include/torch/csrc/api/include/torch/torch.h" ] || [ ! -f "$torch_dir/lib/libtorch.so" ]; then
  echo "setup.sh: $torch_dir holds no LibTorch (include/torch/csrc/api/include/torch/torch.h or" \
    "lib/libtorch.so is missing). Fix: remove $venv and run this script again." >&2
  exit 1
fi

# The link sits beside the environment, in the cache pinned_venv.sh chose.
link="$(dirname "$venv")/libtorch-$version"
if [ "$(readlink "$link" 2>/dev/null)" != "$torch_dir" ]; then
  ln -sfn "$torch_dir" "$link.tmp"
  mv -T "$link.tmp" "$link"
fi
echo "$link"
