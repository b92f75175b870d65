#!/usr/bin/env bash
# api_check.py on this checkout (docs/api.md must agree with the build),
# then on copies with one planted break each, which it must report.
#
# It reads the checkout the runfiles point into (every BUILD file and
# header, as a lint does), so it is tagged "external": never cached.
set -uo pipefail
check="$1" api_md="$2"
root="$(cd "$(dirname "$(readlink -f "$api_md")")/.." && pwd)"
tmp="${TEST_TMPDIR:-$(mktemp -d)}/api_check"
fail() { echo "FAIL: $*"; exit 1; }

echo "== the checkout: $root"
python3 "$check" "$root" || fail "docs/api.md disagrees with the build (above)"

# A copy of what the check reads: BUILD files, headers, the two docs and
# the frozen list (no bazel-* output trees).
fresh() {
  rm -rf "$tmp" && mkdir -p "$tmp"
  (cd "$root" && find . \( -name 'bazel-*' -o -name .git \) -prune -o \
      -type f \( -name BUILD -o -name WORKSPACE -o -name '*.h' \) \
      -not -path './examples/*' -print0 |
      tar -c --null -T - -f - | tar -x -C "$tmp" -f -) || fail "copying the tree"
  mkdir -p "$tmp/docs" "$tmp/examples/api_freeze"
  cp "$root/docs/api.md" "$tmp/docs/"
  cp "$root/CHANGELOG.md" "$tmp/"
  cp "$root/examples/api_freeze/frozen_api.txt" "$tmp/examples/api_freeze/"
}
# expect NAME WANT: the check fails on the copy and prints WANT.
expect() {
  local out
  out="$(python3 "$check" "$tmp" 2>&1)" && fail "$1: the check passed"
  grep -qF -- "$2" <<<"$out" || { echo "$out"; fail "$1: no '$2' above"; }
  echo "ok: $1"
}

fresh
python3 "$check" "$tmp" >/dev/null || fail "the copy of the tree fails"

# A public header includes an internal one that docs/api.md does not list.
fresh
sed -i 's|#include "zero/stage.h"|&\n#include "sim/faults.h"|' "$tmp/engine/engine.h"
expect "engine.h includes sim/faults.h" \
  "includes the internal header sim/faults.h: list it for //engine:engine"

# ... and the header's target is not among the public target's deps.
expect "sim/faults.h: its target is not among //engine's deps" \
  "reaches sim/faults.h, but no target among //engine:engine's dependencies"

# An internal target made public without a row.
fresh
python3 - "$tmp/zero/BUILD" <<'PY'
import re, sys
p = sys.argv[1]; s = open(p).read()
s = s.replace('name = "grouping",\n    visibility = ["//:above_zero"]',
              'name = "grouping",\n    visibility = ["//visibility:public"]')
open(p, "w").write(s)
PY
expect "//zero:grouping public, not listed" \
  "//zero:grouping is public (visibility //visibility:public) but docs/api.md"

# A frozen public target made internal, with no note anywhere.
fresh
python3 - "$tmp/common/BUILD" "$tmp/docs/api.md" <<'PY'
import sys
b, d = sys.argv[1:]
s = open(b).read()
s = s.replace('name = "log",\n    visibility = ["//visibility:public"],\n',
              'name = "log",\n')
open(b, "w").write(s)
s = open(d).read()
s = "\n".join(l for l in s.split("\n") if "`@zerostep//common:log`" not in l)
open(d, "w").write(s)
PY
expect "//common:log private, unnoted" \
  "@zerostep//common:log was frozen as public API"

# A moved header's row that CHANGELOG.md does not name.
fresh
sed -i 's|engine/zero3_block\.h|engine/zero3-block.h|g' "$tmp/CHANGELOG.md"
expect "a move missing from CHANGELOG.md" \
  "names engine/zero3_block.h, but CHANGELOG.md does not"

# A forwarding header that no longer includes its new place.
fresh
sed -i 's|#include "config/config.h"|#include "common/errors.h"|' "$tmp/engine/config.h"
expect "engine/config.h forwards nowhere" \
  "the forwarding header engine/config.h does not include its new place"

# A row whose headers are not the target's.
fresh
sed -i 's#`@zerostep//comm:ledger` | `comm/ledger.h`#`@zerostep//comm:ledger` | `comm/ledger2.h`#' "$tmp/docs/api.md"
expect "a row with the wrong header" \
  "//comm:ledger's headers are ['comm/ledger2.h'] in the table"

# testonly dropped from a row of a testonly target.
fresh
sed -i 's/| stable, testonly | `SimWorld`/| stable | `SimWorld`/' "$tmp/docs/api.md"
expect "sim_world's row without testonly" \
  "//sim:sim_world is testonly in its BUILD file"

# A consumer example that names an internal target.
fresh
mkdir -p "$tmp/examples/consumer"
cp "$root/examples/consumer/BUILD" "$tmp/examples/consumer/BUILD"
sed -i 's|"@zerostep//engine",|&\n        "@zerostep//zero:stage",|' "$tmp/examples/consumer/BUILD"
expect "examples/consumer names //zero:stage" \
  "examples/consumer/BUILD depends on @zerostep//zero:stage, which docs/api.md does not list"

# A consumer example that includes an internal header.
fresh
mkdir -p "$tmp/examples/own_model"
cp "$root/examples/own_model/own_model.cc" "$tmp/examples/own_model/"
sed -i 's|#include "engine/engine.h"|&\n#include "zero/stage.h"|' "$tmp/examples/own_model/own_model.cc"
expect "examples/own_model includes zero/stage.h" \
  "examples/own_model/own_model.cc includes zero/stage.h, which no public target"

echo PASSED
