#!/usr/bin/env python3
"""Checks that the docs' relative links and citations resolve.

  python3 docs/check_links.py            README.md and docs/**/*.md
  python3 docs/check_links.py --code     also every tracked source file's
                                         citations (git ls-files; by hand)

Run from the repository root (//:doc_links_test runs the first form). It
checks, in each file:
  - a Markdown link or image `[text](target)` or `[text](target#anchor)`
    whose target is not a URL: the file exists relative to the linking
    file, and the anchor is one of its headings (GitHub's slugs);
  - a citation of a doc, `docs/NAME.md` (or `../NAME.md`-free paths such as
    `docs/design/engine.md`): the file exists; followed by a quoted section,
    `docs/NAME.md, "Section"` or `docs/NAME.md ("Section")`: that file has
    a heading or a bold bullet label that starts with it. Comment markers
    (`//`, `#`) are removed first, so a citation may wrap across comment
    lines.
Prints one line per broken link (file:line: what, and the fix) and exits 1
if there is any, else prints how many it checked and exits 0.
"""

import os
import re
import subprocess
import sys

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CITE = re.compile(r"\b(docs/[\w/.-]+?\.md)\b(?:(?:,\s*|\s*\(\s*|\s+)\"([A-Za-z`][^\"]*)\")?")
CODE_SUFFIXES = (".h", ".cc", ".py", ".sh", ".bzl", "BUILD", ".md", "run")


def slug(heading):
    """GitHub's anchor for a heading's text."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def headings(path, cache={}):
    """Anchors and section labels of a Markdown file."""
    if path not in cache:
        anchors, labels = set(), []
        in_code = False
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.startswith("```"):
                    in_code = not in_code
                    continue
                if in_code:
                    continue
                m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
                if m:
                    text = re.sub(r"`", "", m.group(1))
                    labels.append(text)
                    base, n = slug(text), 0
                    while (base if n == 0 else "%s-%d" % (base, n)) in anchors:
                        n += 1
                    anchors.add(base if n == 0 else "%s-%d" % (base, n))
                b = re.match(r"\s*[-*]\s+\*\*(.+?)\*\*", line)
                if b:
                    labels.append(re.sub(r"`", "", b.group(1)))
        cache[path] = (anchors, labels)
    return cache[path]


def strip_comments(text):
    """The text with each line's leading comment marker removed."""
    out = []
    for line in text.split("\n"):
        out.append(re.sub(r"^\s*(//+|#+(?=\s)|\*)\s?", "", line))
    return "\n".join(out)


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def check_file(path, problems):
    with open(path, encoding="utf-8", errors="replace") as f:
        raw = f.read()
    checked = 0
    if path.endswith(".md"):
        body = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"),
                      raw, flags=re.S)
        for m in LINK.finditer(body):
            target = m.group(1)
            if re.match(r"[a-z]+:", target):
                continue  # a URL
            checked += 1
            where = "%s:%d" % (path, line_of(body, m.start()))
            file_part, _, anchor = target.partition("#")
            dest = (os.path.normpath(os.path.join(os.path.dirname(path),
                                                  file_part))
                    if file_part else path)
            if not os.path.exists(dest):
                problems.append("%s: link to %s: no such file %s; fix the "
                                "path or restore the file" % (where, target,
                                                              dest))
                continue
            if anchor and dest.endswith(".md"):
                anchors, _ = headings(dest)
                if anchor not in anchors:
                    problems.append("%s: link to %s: %s has no heading with "
                                    "anchor #%s; link to an existing heading"
                                    % (where, target, dest, anchor))
    text = strip_comments(raw) if not path.endswith(".md") else raw
    text = re.sub(r"\s*\n\s*", " ", text)  # citations may wrap
    seen = {}  # the n-th citation of a doc is its n-th occurrence in raw
    for m in CITE.finditer(text):
        doc, section = m.group(1), m.group(2)
        idx = -1
        for _ in range(seen.get(doc, 0) + 1):
            idx = raw.find(doc, idx + 1)
        seen[doc] = seen.get(doc, 0) + 1
        if doc.startswith("docs/plots/") or "*" in doc:
            continue
        checked += 1
        where = "%s:%d" % (path, line_of(raw, max(idx, 0)))
        if not os.path.exists(doc):
            problems.append("%s: cites %s, which does not exist; cite the "
                            "file the section moved to (docs/architecture.md "
                            "lists the design pages)" % (where, doc))
            continue
        if section:
            _, labels = headings(doc)
            norm = lambda t: re.sub(r"[\"`]", "", t).strip().lower()
            want = norm(section).rstrip(".,;: ")
            if not any(norm(l).startswith(want) or want.startswith(norm(l))
                       for l in labels if norm(l)):
                problems.append("%s: cites %s, \"%s\": no heading or bold "
                                "label there starts with it; cite the section "
                                "by its current name" % (where, doc, section))
    return checked


def main(argv):
    files = ["README.md"]
    for root, _, names in os.walk("docs"):
        files += [os.path.join(root, n) for n in sorted(names)
                  if n.endswith(".md")]
    if "--code" in argv:
        tracked = subprocess.run(["git", "ls-files"], capture_output=True,
                                 text=True, check=True).stdout.split()
        files += [f for f in tracked if f.endswith(CODE_SUFFIXES)
                  and not f.startswith("docs/") and f != "README.md"
                  and os.path.isfile(f)]
    problems, checked = [], 0
    for f in files:
        checked += check_file(f, problems)
    for p in problems:
        print(p)
    if problems:
        print("%d broken of %d links and citations in %d files"
              % (len(problems), checked, len(files)))
        return 1
    print("%d links and citations in %d files resolve" % (checked, len(files)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
