#!/usr/bin/env bash
# The Hugging Face decoders against transformers, and their exports read by
# peft and transformers (models/hf_parity_check.cc says what is compared and
# Note [Parity tolerances] how closely).
#
#   hf_parity_test.sh CHECK HF_PARITY_PY REQUIREMENTS_TXT PINNED_VENV_SH SETUP_SH
#
# The Python side runs in a cached virtual environment with the pinned
# packages of REQUIREMENTS_TXT (common/pinned_venv.sh) that sees the pinned
# torch 2.11.0 (SETUP_SH = third_party/libtorch/setup.sh, which installs it
# on first use: 4.5 GB from PyPI). The first run needs network access to
# PyPI; a failure to build either environment fails the test (it never
# skips).
set -euo pipefail

check="$(realpath "$1")"
script="$(realpath "$2")"
requirements="$(realpath "$3")"
pinned_venv="$(realpath "$4")"
setup="$5"

torch_dir="$(readlink -f "$("$setup" 2.11.0)")"
site="$(dirname "$torch_dir")"
venv="$("$pinned_venv" hf-venv "$requirements" "import transformers, peft, torch" "$site")"
python="$venv/bin/python"

out="${TEST_TMPDIR:-$(mktemp -d)}/hf_parity"
rm -rf "$out"
mkdir -p "$out"
# One thread each side: the numbers do not depend on the machine's cores.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 HF_HUB_OFFLINE=1 \
  TRANSFORMERS_VERBOSITY=error TQDM_DISABLE=1
start=$SECONDS
"$python" -u "$script" make "$out"
echo "hf_parity: folders made in $((SECONDS - start)) s"
start=$SECONDS
"$check" "$out"
echo "hf_parity: compared and exported in $((SECONDS - start)) s"
start=$SECONDS
"$python" -u "$script" check_exports "$out"
echo "hf_parity: exports checked in $((SECONDS - start)) s"
