# Sourced by shell tests (sh_test) that cannot run here, so that the skip
# is counted, never passed (issue 48):
#
#   source "$(rootpath //common:test_skip.sh)"   # passed as an argument
#   if [ -z "$python" ]; then
#     test_skip "PinnedTorch" "the pinned torch venv is absent; Fix: ..."
#   fi
#
# test_skip CASE REASON prints "SKIPPED: REASON", writes the test's XML
# result ($XML_OUTPUT_FILE, which Bazel keeps when the test writes it) as
# one Google Test case <target>.CASE with result "skipped" and the reason,
# and exits 0. tools/test_skips.py lists it beside the C++ tests' skips,
# and .ci/run fails on any skip its list of expected skips does not name.
# Outside Bazel (no XML_OUTPUT_FILE) it only prints and exits.

# XML text: & < > " escaped.
# (sed, not ${s//&/...}: bash 5.2 reads & in a replacement as the match.)
_test_skip_xml_escape() {
  printf '%s' "$1" | sed -e 's/&/\&amp;/g' -e 's/</\&lt;/g' -e 's/>/\&gt;/g' \
    -e 's/"/\&quot;/g'
}

test_skip() {
  local case_name="$1" reason="$2"
  echo "SKIPPED: $reason"
  if [ -n "${XML_OUTPUT_FILE:-}" ]; then
    local suite reason_xml
    suite="$(_test_skip_xml_escape "${TEST_TARGET:-sh_test}")"
    reason_xml="$(_test_skip_xml_escape "$reason")"
    cat >"$XML_OUTPUT_FILE" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="1" failures="0" disabled="0" errors="0" skipped="1">
  <testsuite name="$suite" tests="1" failures="0" disabled="0" errors="0" skipped="1">
    <testcase name="$(_test_skip_xml_escape "$case_name")" status="run" result="skipped" classname="$suite">
      <skipped message="$reason_xml"/>
    </testcase>
  </testsuite>
</testsuites>
EOF
  fi
  exit 0
}
