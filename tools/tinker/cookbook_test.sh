#!/usr/bin/env bash
# The tinker-cookbook's loops against the trainer server (cookbook_test.py).
#
#   cookbook_test.sh SERVER_BINARY COOKBOOK_TEST_PY REQUIREMENTS_TXT
#                    PINNED_VENV_SH SETUP_SH [args for the .py]
#
# The environment: REQUIREMENTS_TXT's pinned packages (the tinker SDK and
# the cookbook's dependencies) in a cached virtual environment
# (common/pinned_venv.sh) that sees the pinned torch 2.11.0 of SETUP_SH
# (third_party/libtorch/setup.sh, which installs it on first use), and then
# tinker-cookbook itself, installed with --no-deps: it requires
# tml-renderers>=0.4.1, which PyPI does not have (its newest is 0.2.1), and
# which only the Inkling and Kimi K3 renderers use. The first run needs
# network access to PyPI; a failure to build the environment fails the
# test (it never skips).
set -euo pipefail

server="$(realpath "$1")"
script="$(realpath "$2")"
requirements="$(realpath "$3")"
pinned_venv="$(realpath "$4")"
setup="$5"
shift 5

cookbook="$(sed -n 's/^# cookbook: //p' "$requirements")"
if [ -z "$cookbook" ]; then
  echo "cookbook_test: $requirements names no '# cookbook: tinker-cookbook==V' line" >&2
  exit 1
fi
torch_dir="$(readlink -f "$("$setup" 2.11.0)")"
site="$(dirname "$torch_dir")"
venv="$("$pinned_venv" cookbook-venv "$requirements" "import tinker, chz, datasets, torch" "$site")"
version="${cookbook#*==}"
(
  flock 9
  if ! "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('tinker-cookbook') != '$version')" 2>/dev/null; then
    echo "cookbook_test: installing $cookbook --no-deps into $venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps "$cookbook" >&2
  fi
) 9>"$venv.cookbook.lock"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 HF_HUB_OFFLINE=1 \
  HF_DATASETS_OFFLINE=1 TRANSFORMERS_VERBOSITY=error TQDM_DISABLE=1 \
  WANDB_MODE=disabled
exec "$venv/bin/python" -u "$script" --server="$server" "$@"
