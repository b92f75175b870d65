#!/usr/bin/env python3
"""Lists the test cases a `bazel test` run skipped, by name and reason.

Bazel 4 has no status between PASSED and FAILED for a test target that ran:
a target whose cases skip themselves (GTEST_SKIP: a case that needs a CUDA
device on a machine without one) shows as PASSED. This reads the run's
test.xml files and prints every skipped case with its reason, and the count,
so that a skip is never mistaken for a pass:

  touch /tmp/stamp; ./bazelw test --config=cuda //...
  python3 tools/test_skips.py --since /tmp/stamp [bazel-testlogs-dir]

Only test.xml files written after --since are read (earlier runs leave
theirs behind). Targets that Bazel itself skipped (incompatible with the
configuration) are listed by Bazel's own summary as SKIPPED.
"""
import argparse
import os
import re
import sys
import xml.etree.ElementTree as ET


def skipped_cases(path):
    """(case name, reason) for each skipped case in one gtest test.xml."""
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        sys.exit(f"test_skips: {path} is not XML ({e})")
    out = []
    for case in root.iter("testcase"):
        skip = case.find("skipped")
        if skip is None and case.get("result") != "skipped":
            continue
        reason = ""
        if skip is not None:
            reason = (skip.get("message") or skip.text or "").strip()
        name = f"{case.get('classname', '')}.{case.get('name', '')}"
        out.append((name, " ".join(reason.split())))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("testlogs", nargs="?", default="bazel-testlogs")
    ap.add_argument("--since", help="read only test.xml newer than this file")
    args = ap.parse_args()
    since = os.path.getmtime(args.since) if args.since else 0.0
    if not os.path.isdir(args.testlogs):
        sys.exit(f"test_skips: {args.testlogs} is not a folder (run bazel test first)")
    total = 0
    for d, _, files in sorted(os.walk(args.testlogs, followlinks=True)):
        if "test.xml" not in files:
            continue
        path = os.path.join(d, "test.xml")
        if os.path.getmtime(path) < since:
            continue
        parts = os.path.relpath(d, args.testlogs).split(os.sep)
        if re.fullmatch(r"shard_\d+_of_\d+", parts[-1]):
            parts = parts[:-1]  # a sharded test: one test.xml per shard
        target = "//" + "/".join(parts[:-1]) + ":" + parts[-1]
        for name, reason in skipped_cases(path):
            print(f"SKIPPED {target} {name}: {reason}")
            total += 1
    print(f"test_skips: {total} test case(s) skipped")


if __name__ == "__main__":
    main()
