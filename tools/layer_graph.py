#!/usr/bin/env python3
"""The package layering, drawn from the Bazel graph (standard library only).

  python3 tools/layer_graph.py [OUT.svg]     (default docs/plots/layers.svg)

Asks `./bazelw query` for every shipped target (cc_library and cc_binary,
not testonly) and its direct dependencies, folds them into packages and
draws one box per package, in rows: a package sits one row above the
highest package it depends on, so every arrow points down. Test targets,
testonly helpers and third_party/ are left out: the picture is what a
binary links; an arrow is drawn only where no longer path implies it. It
prints every package edge and exits non-zero if the
packages form a cycle, or if an edge points into //sim from a package
outside the ones allowed to use the simulator (the rule the BUILD files'
visibility enforces).
"""
import os
import subprocess
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Packages that may depend on //sim (the simulator is a product feature of
# the parity harness, scale mode, the tools and the benchmarks).
SIM_USERS = {"sim", "parity", "scale", "tools", "benchmarks", "propertytests"}


def query(expr, output):
    cmd = [os.path.join(ROOT, "bazelw"), "query", "--noimplicit_deps",
           "--output=" + output, expr]
    return subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout


def package_of(label):
    label = label.strip().strip('"')
    if not label.startswith("//"):
        return None
    pkg = label[2:].split(":")[0]
    return pkg.split("/")[0] if pkg else None


def package_edges():
    shipped = ('kind("cc_library|cc_binary", //...) '
               "except attr(testonly, 1, //...) except //third_party/...")
    edges = set()
    for line in query("deps(%s, 1) intersect (%s)" % (shipped, shipped),
                      "graph").splitlines():
        if "->" not in line:
            continue
        a, b = line.split("->")
        pa, pb = package_of(a), package_of(b)
        if pa and pb and pa != pb:
            edges.add((pa, pb))
    nodes = {p for e in edges for p in e}
    for line in query(shipped, "label").splitlines():
        if package_of(line):
            nodes.add(package_of(line))
    return nodes, edges


def layers(nodes, edges):
    deps = defaultdict(set)
    for a, b in edges:
        deps[a].add(b)
    level, visiting = {}, set()

    def depth(p):
        if p in level:
            return level[p]
        if p in visiting:
            raise SystemExit("layer_graph: dependency cycle through //" + p)
        visiting.add(p)
        level[p] = 1 + max((depth(d) for d in deps[p]), default=-1)
        visiting.discard(p)
        return level[p]

    for p in nodes:
        depth(p)
    # Then raise every package to just below its lowest user, so that an
    # arrow spans as few rows as possible.
    users = defaultdict(set)
    for a, b in edges:
        users[b].add(a)
    for p in sorted(nodes, key=lambda q: -level[q]):
        if users[p]:
            level[p] = min(level[u] for u in users[p]) - 1
    return level


def reduce_transitively(edges):
    """The edges not implied by a longer path (the picture draws these)."""
    deps = defaultdict(set)
    for a, b in edges:
        deps[a].add(b)

    def reachable(src, skip):
        seen, todo = set(), [d for d in deps[src] if d != skip]
        while todo:
            p = todo.pop()
            if p not in seen:
                seen.add(p)
                todo.extend(deps[p])
        return seen

    return {(a, b) for a, b in edges if b not in reachable(a, b)}


def svg(nodes, edges, level):
    rows = defaultdict(list)
    for p in sorted(nodes):
        rows[level[p]].append(p)
    # Order each row by the mean position of its neighbours (a few sweeps
    # down and up), which keeps most arrows from crossing boxes.
    near = defaultdict(set)
    for a, b in edges:
        near[a].add(b)
        near[b].add(a)
    for _ in range(4):
        for lv in sorted(rows, reverse=True) + sorted(rows):
            index = {p: i for r in rows.values() for i, p in enumerate(r)}
            rows[lv].sort(key=lambda p: sum(index[q] for q in near[p]) /
                          max(1, len(near[p])))
    bw, bh, gx, gy = 120, 34, 28, 70
    width = max(len(r) for r in rows.values()) * (bw + gx) + gx
    top = max(rows)
    height = (top + 1) * (bh + gy)
    pos = {}
    for lv, ps in rows.items():
        span = len(ps) * (bw + gx) - gx
        x0 = (width - span) / 2
        y = gy / 2 + (top - lv) * (bh + gy)
        for i, p in enumerate(ps):
            pos[p] = (x0 + i * (bw + gx), y)
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
           'font-family="sans-serif" font-size="13">' % (width, height),
           '<defs><marker id="a" viewBox="0 0 10 10" refX="10" refY="5" '
           'markerWidth="7" markerHeight="7" orient="auto">'
           '<path d="M0,0 L10,5 L0,10 z" fill="#777"/></marker></defs>',
           '<rect width="100%" height="100%" fill="white"/>']
    for a, b in sorted(reduce_transitively(edges)):
        (xa, ya), (xb, yb) = pos[a], pos[b]
        x1, y1, x2, y2 = xa + bw / 2, ya + bh, xb + bw / 2, yb
        # An arrow that skips rows is dashed: it passes behind the boxes
        # between.
        dash = ' stroke-dasharray="5,4"' if level[a] - level[b] > 1 else ""
        out.append('<path d="M%.0f,%.0f C%.0f,%.0f %.0f,%.0f %.0f,%.0f" '
                   'fill="none" stroke="#888"%s marker-end="url(#a)"/>' %
                   (x1, y1, x1, y1 + gy * 0.8, x2, y2 - gy * 0.8, x2, y2,
                    dash))
    for p, (x, y) in sorted(pos.items()):
        fill = "#fde8c8" if p == "sim" else "#dce9f7"
        out.append('<rect x="%.0f" y="%.0f" width="%d" height="%d" rx="5" '
                   'fill="%s" stroke="#456"/>' % (x, y, bw, bh, fill))
        out.append('<text x="%.0f" y="%.0f" text-anchor="middle">//%s</text>'
                   % (x + bw / 2, y + bh / 2 + 5, p))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        ROOT, "docs", "plots", "layers.svg")
    nodes, edges = package_edges()
    bad = sorted(a for a, b in edges if b == "sim" and a not in SIM_USERS)
    level = layers(nodes, edges)
    for a, b in sorted(edges, key=lambda e: (-level[e[0]], e)):
        print("//%s -> //%s" % (a, b))
    with open(out_path, "w") as f:
        f.write(svg(nodes, edges, level))
    print("wrote " + out_path)
    if bad:
        raise SystemExit("layer_graph: //sim used by " +
                         ", ".join("//" + p for p in bad))


if __name__ == "__main__":
    main()
