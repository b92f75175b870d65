#!/usr/bin/env python3
"""Line plots as SVG, with the standard library only (no matplotlib here).

  tools/plot_svg.py scale RUNS.jsonl step_s|bytes_per_rank OUT.svg
      one line per ZeRO stage, x = world size (log), from
      `harness --simulate-scale --json`
  tools/plot_svg.py loss RUNS.jsonl OUT.svg
      managed and unmanaged loss per step, one pair per scenario, from
      `harness --json`
"""
import json
import math
import sys

W, H, L, R, T, B = 760, 440, 90, 200, 40, 60
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]


def ticks(lo, hi, log):
    if log:
        a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        return [10.0 ** k for k in range(a, b + 1)]
    step = (hi - lo) / 5 or 1.0
    mag = 10 ** math.floor(math.log10(step))
    step = min((m * mag for m in (1, 2, 5, 10) if m * mag >= step))
    first = math.floor(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 2)]


def fmt(v):
    if v == 0:
        return "0"
    if abs(v) >= 1e4 or abs(v) < 1e-2:
        return "%.0e" % v
    return ("%.3f" % v).rstrip("0").rstrip(".")


def plot(series, title, xlabel, ylabel, logx, logy, out):
    xs = [x for s in series for x, _ in s["points"]]
    ys = [y for s in series for _, y in s["points"]]
    xlo, xhi, ylo, yhi = min(xs), max(xs), min(ys), max(ys)
    if not logy:
        pad = (yhi - ylo) * 0.05 or abs(yhi) * 0.05 or 1.0
        ylo, yhi = ylo - pad, yhi + pad
    xt, yt = ticks(xlo, xhi, logx), ticks(ylo, yhi, logy)
    xlo, xhi = min(xlo, xt[0]), max(xhi, xt[-1])
    ylo, yhi = min(ylo, yt[0]), max(yhi, yt[-1])

    def px(x):
        f = (math.log10(x) - math.log10(xlo)) / (math.log10(xhi) - math.log10(xlo)) if logx else (x - xlo) / (xhi - xlo)
        return L + f * (W - L - R)

    def py(y):
        f = (math.log10(y) - math.log10(ylo)) / (math.log10(yhi) - math.log10(ylo)) if logy else (y - ylo) / (yhi - ylo)
        return H - B - f * (H - T - B)

    o = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">' % (W, H),
         '<rect width="100%" height="100%" fill="white"/>',
         '<text x="%d" y="24" font-size="15">%s</text>' % (L, title)]
    for x in xt:
        if xlo <= x <= xhi:
            o.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>' % (px(x), T, px(x), H - B))
            o.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>' % (px(x), H - B + 16, fmt(x)))
    for y in yt:
        if ylo <= y <= yhi:
            o.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>' % (L, py(y), W - R, py(y)))
            o.append('<text x="%d" y="%.1f" text-anchor="end">%s</text>' % (L - 6, py(y) + 4, fmt(y)))
    o.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="black"/>' % (L, T, W - L - R, H - T - B))
    o.append('<text x="%d" y="%d" text-anchor="middle">%s</text>' % ((L + W - R) / 2, H - 18, xlabel))
    o.append('<text transform="translate(18,%d) rotate(-90)" text-anchor="middle">%s</text>' % ((T + H - B) / 2, ylabel))
    for i, s in enumerate(series):
        c = s.get("color", COLORS[i % len(COLORS)])
        dash = ' stroke-dasharray="6,4"' if s.get("dash") else ""
        pts = " ".join("%.1f,%.1f" % (px(x), py(y)) for x, y in s["points"])
        o.append('<polyline points="%s" fill="none" stroke="%s" stroke-width="%s"%s/>' % (pts, c, s.get("width", 2), dash))
        for x, y in s["points"]:
            o.append('<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s"/>' % (px(x), py(y), c))
        ly = T + 14 + 18 * i
        o.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"%s/>' % (W - R + 10, ly, W - R + 34, ly, c, dash))
        o.append('<text x="%d" y="%d">%s</text>' % (W - R + 40, ly + 4, s["name"]))
    o.append("</svg>")
    with open(out, "w") as f:
        f.write("\n".join(o) + "\n")


def main(argv):
    if len(argv) >= 5 and argv[1] == "scale":
        rows = [json.loads(l) for l in open(argv[2]) if l.strip()]
        metric, out = argv[3], argv[4]
        stages = sorted({r["stage"] for r in rows})
        series = [{"name": "stage %d" % s,
                   "points": sorted((r["world"], r[metric]) for r in rows if r["stage"] == s)}
                  for s in stages]
        model = rows[0]["model"]
        label = {"step_s": "virtual step time (s)", "bytes_per_rank": "bytes per rank per step"}[metric]
        plot(series, "%s: %s vs world size" % (model, label), "world size (ranks)", label, True, True, out)
    elif len(argv) >= 4 and argv[1] == "loss":
        rows = [json.loads(l) for l in open(argv[2]) if l.strip()]
        series = []
        for i, r in enumerate(rows):
            tag = "stage %d, W=%d," % (r["stage"], r["world"])
            c = COLORS[i % len(COLORS)]
            series.append({"name": tag + " unmanaged", "color": c, "width": 4,
                           "points": [(k + 1, v) for k, v in enumerate(r["losses_unmanaged"])]})
            series.append({"name": tag + " managed", "color": "black", "dash": True, "width": 1.5,
                           "points": [(k + 1, v) for k, v in enumerate(r["losses_managed"])]})
        plot(series, "%s: loss per step, managed vs unmanaged" % rows[0]["model"], "optimizer step", "mean loss of the window", False, False, argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
