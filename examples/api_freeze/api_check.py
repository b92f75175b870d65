#!/usr/bin/env python3
"""Checks zerostep's stated public API (docs/api.md) against the build.

    api_check.py ROOT [FROZEN]

ROOT is a zerostep source tree; FROZEN (default
ROOT/examples/api_freeze/frozen_api.txt) lists the public targets and
headers as they were frozen. Exits 1, printing one line per problem (what,
the rule, the fix), when:

  - a target of docs/api.md's "Public targets" table is not public in its
    BUILD file, or a public target is not in the table (packages under
    third_party/ and examples/ aside: toolchain stand-ins and consumers);
  - a row's headers, testonly or stability disagree with the BUILD file
    (a deprecated row needs a `deprecation` attribute, and back);
  - a public header reaches, through its #include "..." lines (not past
    another public header), an internal header that the table
    "Headers that come with a public target" does not list for it, or one
    whose target is not among that public target's dependencies, so that a
    consumer would have to name an internal target;
  - a BUILD file under examples/ (the consumer workspaces, this package)
    names an @zerostep// target that the table does not list, or a source
    there includes a header that no public target has;
  - a frozen target or header is no longer public and docs/api.md's
    "Moved and removed" table does not name it; or a row of that table is
    not named in CHANGELOG.md, or names a forwarding header that is not
    public or does not include its new place.

The BUILD files are read as the Python subset of Starlark they are written
in; every rule call is recorded with its attributes (select() as the union
of its branches).
"""

import builtins
import os
import re
import sys

PUBLIC = "//visibility:public"
# Packages the check leaves out: the offline stand-ins for Bazel's rule
# sets and toolchain bindings, and the consumers themselves.
SKIPPED_PREFIXES = ("third_party/", "examples/")


class _Rule:
    def __init__(self, kind, package, attrs):
        self.kind = kind
        self.package = package
        self.attrs = attrs
        self.name = attrs.get("name", "")

    @property
    def label(self):
        return "//%s:%s" % (self.package, self.name)


def _flatten_select(value):
    if isinstance(value, _Select):
        out = []
        for branch in value.branches.values():
            out.extend(_flatten_select(branch))
        return out
    return value


class _Select:
    def __init__(self, branches):
        self.branches = branches

    def __add__(self, other):
        return _Select({"a": _flatten_select(self) + _flatten_select(other)})

    def __radd__(self, other):
        return _Select({"a": _flatten_select(other) + _flatten_select(self)})


class _Scope(dict):
    """Names a BUILD file uses: every unknown one is a rule or macro."""

    def __init__(self, package, rules, defaults):
        super().__init__()
        self.package = package
        self.rules = rules
        self.defaults = defaults

    def __missing__(self, name):
        if hasattr(builtins, name):
            return getattr(builtins, name)

        def record(*args, **kwargs):
            if name == "package":
                self.defaults.update(kwargs)
            elif name == "select":
                return _Select(args[0])
            elif name == "glob":
                return []
            elif name in ("load", "licenses", "exports_files"):
                return None
            elif "name" in kwargs:
                attrs = {k: _flatten_select(v) for k, v in kwargs.items()}
                self.rules.append(_Rule(name, self.package, attrs))
            return []

        return record


def read_build_files(root):
    """All rules of ROOT's packages: {label: _Rule}."""
    rules = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        rel = "" if rel == "." else rel
        # A directory with a WORKSPACE file is another repository; bazel-*
        # are output symlinks.
        if rel and "WORKSPACE" in filenames:
            dirnames[:] = []
            continue
        dirnames[:] = [d for d in dirnames
                       if not d.startswith(("bazel-", "."))]
        if "BUILD" not in filenames:
            continue
        found, defaults = [], {}
        scope = _Scope(rel, found, defaults)
        with open(os.path.join(dirpath, "BUILD")) as f:
            exec(compile(f.read(), os.path.join(rel, "BUILD"), "exec"), {},
                 scope)
        for rule in found:
            if "visibility" not in rule.attrs:
                rule.attrs["visibility"] = defaults.get(
                    "default_visibility", ["//visibility:private"])
            rules[rule.label] = rule
    return rules


def normalize(label, package=""):
    """@zerostep//a/b, //a/b, :x, x -> //a/b:b, //package:x."""
    if label.startswith("@zerostep//"):
        label = label[len("@zerostep"):]
    if label.startswith(":"):
        return "//%s%s" % (package, label)
    if not label.startswith("//") and not label.startswith("@"):
        return "//%s:%s" % (package, label)
    if label.startswith("//") and ":" not in label:
        return "%s:%s" % (label, label.rsplit("/", 1)[-1])
    return label


def headers_of(rule):
    return ["%s/%s" % (rule.package, h) if rule.package else h
            for h in rule.attrs.get("hdrs", [])]


def dep_closure(label, rules):
    seen, stack = set(), [label]
    while stack:
        cur = stack.pop()
        if cur in seen or cur not in rules:
            continue
        seen.add(cur)
        rule = rules[cur]
        deps = list(rule.attrs.get("deps", []))
        if rule.kind == "alias":
            deps.append(rule.attrs["actual"])
        stack.extend(normalize(d, rule.package) for d in deps)
    return seen


def consumer_builds(root):
    """The BUILD files of examples/: the consumer workspaces and packages."""
    out = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, "examples")):
        dirnames[:] = [d for d in dirnames if not d.startswith("bazel-")]
        if "BUILD" in filenames:
            out.append(os.path.join(dirpath, "BUILD"))
    return sorted(out)


def consumer_sources(root):
    out = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, "examples")):
        dirnames[:] = [d for d in dirnames if not d.startswith("bazel-")]
        out.extend(os.path.join(dirpath, f) for f in filenames
                   if f.endswith((".cc", ".h")))
    return sorted(out)


def zerostep_deps(build):
    with open(build) as f:
        return re.findall(r'"(@zerostep//[^"]+)"', f.read())


_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def includes(root, header):
    path = os.path.join(root, header)
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [h for h in _INCLUDE.findall(f.read())
                if os.path.isfile(os.path.join(root, h))]


def md_table(text, heading):
    """The rows (lists of cells) of the first table under `## heading`."""
    m = re.search(r"^## %s\s*$(.*?)(?=^## |\Z)" % re.escape(heading), text,
                  re.M | re.S)
    if not m:
        return None
    rows = []
    for line in m.group(1).splitlines():
        line = line.strip()
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if all(set(c) <= set("-: ") for c in cells):
            continue
        rows.append(cells)
    return rows[1:]  # the header row


def code_spans(cell):
    return re.findall(r"`([^`]+)`", cell)


def check(root, frozen_path):
    problems = []
    rules = read_build_files(root)
    with open(os.path.join(root, "docs/api.md")) as f:
        api = f.read()
    with open(os.path.join(root, "CHANGELOG.md")) as f:
        changelog = f.read()

    public = {label: r for label, r in rules.items()
              if PUBLIC in r.attrs["visibility"]
              and not r.package.startswith(SKIPPED_PREFIXES)}
    # third_party/BUILD itself: its public bindings are API (LibTorch).
    public.update({label: r for label, r in rules.items()
                   if r.package == "third_party"
                   and PUBLIC in r.attrs["visibility"]})

    # --- the table of public targets --------------------------------------
    table = md_table(api, "Public targets")
    if table is None:
        return ['docs/api.md: no "## Public targets" table; it lists every '
                "public target (target | headers | stability | for)"]
    listed = {}
    for row in table:
        if len(row) < 4 or not code_spans(row[0]):
            problems.append("docs/api.md: the row %r of \"Public targets\" "
                            "needs 4 cells: `target` | `headers` | "
                            "stability | what it is for" % "|".join(row))
            continue
        label = normalize(code_spans(row[0])[0])
        listed[label] = row
        rule = rules.get(label)
        if rule is None:
            problems.append(
                "docs/api.md lists %s, which no BUILD file defines: remove "
                "the row, or name it in \"Moved and removed\" and "
                "CHANGELOG.md" % label)
            continue
        if label not in public:
            problems.append(
                "docs/api.md lists %s as public, but its visibility is %s: "
                'make it ["%s"] or remove the row' %
                (label, rule.attrs["visibility"], PUBLIC))
        if rule.kind != "alias":
            want = sorted(headers_of(rule))
            have = sorted(h for h in code_spans(row[1]) if "/" in h)
            if want != have:
                problems.append(
                    "docs/api.md: %s's headers are %s in the table but %s in "
                    "its BUILD file: make the row say %s" %
                    (label, have, want, want))
        words = row[2].replace(",", " ").split()
        stability = [w for w in words
                     if w in ("stable", "experimental", "deprecated")]
        if len(stability) != 1:
            problems.append(
                "docs/api.md: %s's stability is %r: it must name exactly one "
                "of stable, experimental, deprecated (and testonly when the "
                "target is)" % (label, row[2]))
        testonly = bool(rule.attrs.get("testonly", False))
        if rule.kind == "alias" and rule.attrs["actual"].startswith(":"):
            actual = rules.get(normalize(rule.attrs["actual"], rule.package))
            testonly = bool(actual and actual.attrs.get("testonly", False))
        if testonly != ("testonly" in words):
            problems.append(
                "docs/api.md: %s is %stestonly in its BUILD file: the "
                "stability cell must %ssay testonly" %
                (label, "" if testonly else "not ",
                 "" if testonly else "not "))
        deprecated = "deprecation" in rule.attrs
        if deprecated != ("deprecated" in words):
            problems.append(
                "docs/api.md: %s %s a deprecation attribute: its stability "
                "must %sbe deprecated" % (label, "has" if deprecated else
                                           "has no", "" if deprecated else
                                           "not "))
    for label in sorted(set(public) - set(listed)):
        problems.append(
            "%s is public (visibility %s) but docs/api.md's \"Public "
            "targets\" does not list it: add a row (target, headers, "
            "stability, what it is for), or make it visible only to the "
            "layers that use it (the package groups of //:BUILD)" %
            (label, PUBLIC))

    # --- consumers name only listed targets --------------------------------
    for build in consumer_builds(root):
        for label in sorted(set(zerostep_deps(build))):
            if normalize(label) not in listed:
                problems.append(
                    "%s depends on %s, which docs/api.md does not list as "
                    "public: the examples use only the public API" %
                    (os.path.relpath(build, root), label))

    # --- what public headers bring with them ------------------------------
    public_headers = {}
    for label, rule in public.items():
        for h in headers_of(rule):
            public_headers.setdefault(h, label)
    owner = {}
    for label, rule in rules.items():
        for h in headers_of(rule):
            owner.setdefault(h, []).append(label)
    details = md_table(api, "Headers that come with a public target") or []
    allowed = {}
    for row in details:
        if len(row) < 2 or not code_spans(row[0]):
            continue
        allowed[normalize(code_spans(row[0])[0])] = set(code_spans(row[1]))
    for label in sorted(public):
        rule = public[label]
        closure = dep_closure(label, rules)
        reached = set()
        stack = list(headers_of(rule))
        while stack:
            for inc in includes(root, stack.pop()):
                if inc in public_headers or inc in reached:
                    continue
                reached.add(inc)
                stack.append(inc)
        for h in sorted(reached):
            if h not in allowed.get(label, set()):
                problems.append(
                    "%s (public, %s) includes the internal header %s: list "
                    "it for %s under docs/api.md's \"Headers that come with "
                    "a public target\" (consumers reach it, never name it), "
                    "or make its target public, or stop including it" %
                    (label, ", ".join(headers_of(rule)), h, label))
            if not set(owner.get(h, [])) & closure:
                problems.append(
                    "%s reaches %s, but no target among %s's dependencies "
                    "has it in hdrs (it is in %s): a consumer would have to "
                    "name an internal target; add its target to %s's deps" %
                    (label, h, label, owner.get(h, ["no target"]), label))
        for h in sorted(allowed.get(label, set()) - reached):
            problems.append(
                "docs/api.md lists %s as coming with %s, but no header of "
                "%s reaches it any more: remove it from the row" %
                (h, label, label))
    for label in sorted(set(allowed) - set(public)):
        problems.append(
            "docs/api.md's \"Headers that come with a public target\" has a "
            "row for %s, which is not public: remove the row" % label)

    # --- consumers include only public headers ----------------------------
    for src in consumer_sources(root):
        for inc in includes(root, os.path.relpath(src, root)):
            if inc not in public_headers:
                problems.append(
                    "%s includes %s, which no public target of docs/api.md "
                    "has in hdrs: the examples use only the public API" %
                    (os.path.relpath(src, root), inc))

    # --- frozen names: still public, or moved/removed with a note ---------
    moved = {}
    for row in md_table(api, "Moved and removed") or []:
        spans = code_spans(row[0]) if row else []
        if not spans:
            continue
        old = spans[0]
        moved[old] = code_spans(row[1])
        if old not in changelog:
            problems.append(
                "docs/api.md's \"Moved and removed\" names %s, but "
                "CHANGELOG.md does not: add an entry with its migration" %
                old)
        if old.endswith(".h") and os.path.isfile(os.path.join(root, old)):
            if old not in public_headers:
                problems.append(
                    "the forwarding header %s is in no public target's hdrs: "
                    "consumers cannot include it" % old)
            new = [h for h in moved[old] if h.endswith(".h")]
            if new and not set(new) & set(includes(root, old)):
                problems.append(
                    "the forwarding header %s does not include its new "
                    "place %s" % (old, new[0]))
    with open(frozen_path) as f:
        frozen = [line.split("#")[0].strip() for line in f]
    for name in (n for n in frozen if n):
        if name.endswith(".h"):
            still = name in public_headers
        else:
            still = normalize(name) in public
        if not still and name not in moved:
            problems.append(
                "%s was frozen as public API (%s) and is no longer public: "
                "restore it (a forwarding header or target for one release), "
                "or name it in docs/api.md's \"Moved and removed\" and in "
                "CHANGELOG.md with its migration" %
                (name, os.path.relpath(frozen_path, root)))
    return problems


def main(argv):
    if len(argv) not in (2, 3):
        sys.stderr.write(__doc__)
        return 2
    root = argv[1]
    frozen = argv[2] if len(argv) == 3 else os.path.join(
        root, "examples/api_freeze/frozen_api.txt")
    problems = check(root, frozen)
    for p in problems:
        print("api_check: " + p)
    if problems:
        print("api_check: %d problem(s); docs/api.md says what is public and "
              "why" % len(problems))
        return 1
    print("api_check: docs/api.md agrees with the build")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
