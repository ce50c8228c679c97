#!/usr/bin/env python3
"""Draws median completion time against straggler tail from coding_matmul_bench --tail_csv.

    python3 bench/coding/plot_tail.py tail.csv bench/coding/tail.svg

Writes a plain SVG (no plotting library needed on the build machines).
"""
import csv
import sys


def main(src, dst):
    rows = list(csv.DictReader(open(src)))
    xs = [float(r["tail_ms"]) for r in rows]
    series = [("coded (8,6)", "coded_p50_ms", "#1f77b4"),
              ("uncoded, 8 workers", "uncoded_p50_ms", "#d62728"),
              ("2x replication", "replication_p50_ms", "#2ca02c")]
    ymax = max(float(r[k]) for r in rows for _, k, _ in series) * 1.1
    xmax = max(xs) or 1.0
    w, h, left, bottom, top, right = 640, 400, 60, 50, 30, 170
    px = lambda x: left + (w - left - right) * x / xmax
    py = lambda y: h - bottom - (h - bottom - top) * y / ymax
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2 - 120}" y="18">Coded matmul: median completion vs straggler tail</text>',
           f'<line x1="{left}" y1="{h - bottom}" x2="{w - right}" y2="{h - bottom}" stroke="black"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}" stroke="black"/>',
           f'<text x="{(w - right + left) / 2 - 90}" y="{h - 12}">'
           f'exponential tail mean (ms, load 1; shift 5 ms)</text>',
           f'<text x="12" y="{top - 8}">p50 ms</text>']
    for i in range(6):
        y = ymax * i / 5
        out.append(f'<text x="{left - 45}" y="{py(y) + 4}">{y:.1f}</text>')
        out.append(f'<line x1="{left}" y1="{py(y)}" x2="{w - right}" y2="{py(y)}" stroke="#ddd"/>')
    for x in xs:
        out.append(f'<text x="{px(x) - 8}" y="{h - bottom + 16}">{x:g}</text>')
    for idx, (label, key, color) in enumerate(series):
        pts = " ".join(f"{px(x):.1f},{py(float(r[key])):.1f}" for x, r in zip(xs, rows))
        out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, r in zip(xs, rows):
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(float(r[key])):.1f}" r="3" fill="{color}"/>')
        ly = top + 20 + 20 * idx
        out.append(f'<line x1="{w - right + 10}" y1="{ly}" x2="{w - right + 30}" y2="{ly}" '
                   f'stroke="{color}" stroke-width="2"/>')
        out.append(f'<text x="{w - right + 35}" y="{ly + 4}">{label}</text>')
    out.append("</svg>")
    open(dst, "w").write("\n".join(out) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
