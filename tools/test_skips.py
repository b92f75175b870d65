#!/usr/bin/env python3
"""Lists the tests a `bazel test` run skipped, and fails on unexpected ones.

Bazel 4 has no status between PASSED and FAILED for a test target that ran:
a target whose cases skip themselves (GTEST_SKIP: a case that needs a CUDA
device on a machine without one, or an ISA this CPU lacks; a shell test
that cannot run, through common/test_skip.sh) shows as PASSED. This reads
the run's test.xml files and prints every skipped case with its reason, so
that a skip is never mistaken for a pass:

  touch /tmp/stamp; ./bazelw test --config=cuda //... | tee /tmp/log
  python3 tools/test_skips.py --since /tmp/stamp --bazel-log /tmp/log \\
      [--expected .ci/expected_skips --config cuda] [bazel-testlogs-dir]

Three kinds of skip are listed:
  - a case a test.xml marks skipped (gtest's result="skipped");
  - with --bazel-log, a target Bazel's summary shows as SKIPPED (a target
    incompatible with the configuration), as the case "(target)";
  - a test whose log has a line starting "SKIPPED" while its test.xml
    records no skip: a skip that reads as a pass. This is always an error.

With --expected, each skip must match a line of that file for --config
(its format is described at its top); any other fails the run (exit 1).
An expected skip that does not happen is fine: expected skips depend on
the machine (its CPU, its GPUs).

Only test.xml files written after --since are read (earlier runs leave
theirs behind).
"""
import argparse
import fnmatch
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


def unreported_skip(log_path):
    """The first line of a test.log that says SKIPPED, or None. gtest's own
    "[  SKIPPED ]" lines start with a bracket and are not matched."""
    if not os.path.isfile(log_path):
        return None
    with open(log_path, errors="replace") as f:
        for line in f:
            if line.startswith("SKIPPED"):
                return line.strip()
    return None


def target_skips(bazel_log):
    """Targets Bazel's summary lists as SKIPPED."""
    out = []
    with open(bazel_log, errors="replace") as f:
        for line in f:
            m = re.match(r"^(//\S+)\s+SKIPPED\s*$", line.replace("\0", ""))
            if m:
                out.append(m.group(1))
    return sorted(set(out))


def read_expected(path):
    """[(configs, target, case pattern, reason)] from an expected-skips file:
    one skip a line, `CONFIGS TARGET CASE -- REASON`, CONFIGS a comma list
    of configuration names or `*`, CASE an fnmatch pattern ("(target)" for
    a target Bazel skipped); `#` starts a comment line."""
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            head, sep, reason = line.partition(" -- ")
            fields = head.split()
            if not sep or not reason.strip() or len(fields) != 3:
                sys.exit(f"test_skips: {path}:{n}: expected 'CONFIGS TARGET CASE -- "
                         f"REASON', got {line!r}")
            configs, target, case = fields
            out.append((configs.split(","), target, case, reason.strip()))
    return out


def match(expected, config, target, case):
    """The reason of the first expected line matching, or None."""
    for configs, t, pattern, reason in expected:
        if ("*" in configs or config in configs) and t == target and \
                fnmatch.fnmatchcase(case, pattern):
            return reason
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("testlogs", nargs="?", default="bazel-testlogs")
    ap.add_argument("--since", help="read only test.xml newer than this file")
    ap.add_argument("--bazel-log", help="the run's output, for targets Bazel skipped")
    ap.add_argument("--expected", help="the skips this configuration may have")
    ap.add_argument("--config", default="default",
                    help="the configuration's name in --expected (default: default)")
    args = ap.parse_args()
    since = os.path.getmtime(args.since) if args.since else 0.0
    if not os.path.isdir(args.testlogs):
        sys.exit(f"test_skips: {args.testlogs} is not a folder (run bazel test first)")
    expected = read_expected(args.expected) if args.expected else None

    skips = []  # (target, case, reason, unreported)
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
        cases = skipped_cases(path)
        for name, reason in cases:
            skips.append((target, name, reason, False))
        if not cases:
            line = unreported_skip(os.path.join(d, "test.log"))
            if line:
                skips.append((target, "(log)", line, True))
    if args.bazel_log:
        for target in target_skips(args.bazel_log):
            skips.append((target, "(target)", "Bazel skipped the target", False))

    bad = 0
    for target, case, reason, unreported in skips:
        print(f"SKIPPED {target} {case}: {reason}")
        if unreported:
            print("  ERROR: its log says SKIPPED but its test.xml records no skip, so "
                  "Bazel reports it PASSED. Fix: report it with common/test_skip.sh "
                  "(shell) or GTEST_SKIP (C++)")
            bad += 1
        elif expected is not None:
            why = match(expected, args.config, target, case)
            if why is None:
                print(f"  ERROR: not an expected skip of configuration '{args.config}' "
                      f"in {args.expected}. Fix: make the test run, or add a line "
                      f"naming it and why it is expected")
                bad += 1
            else:
                print(f"  expected: {why}")
    print(f"test_skips: {len(skips)} skip(s), {bad} unexpected")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
