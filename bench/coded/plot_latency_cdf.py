#!/usr/bin/env python3
"""Draws the request latency CDFs from dist_coded_matmul_bench --csv.

    python3 bench/coded/plot_latency_cdf.py latencies.csv bench/coded/latency_cdf.svg

Writes a plain SVG (no plotting library needed on the build machines).
"""
import csv
import sys

COLORS = {"coded": "#1f77b4", "uncoded": "#d62728", "replication": "#2ca02c",
          "coded_paused": "#17becf", "uncoded_paused": "#ff7f0e"}
LABELS = {"coded": "coded (8,6)", "uncoded": "uncoded (8)", "replication": "2x replication",
          "coded_paused": "coded, worker stopped 20%", "uncoded_paused": "uncoded, worker stopped 20%"}


def main(src, dst):
    series = {}
    for r in csv.DictReader(open(src)):
        series.setdefault(r["mode"], []).append(float(r["latency_ms"]))
    xmax = max(max(v) for v in series.values()) * 1.05
    w, h, left, bottom, top, right = 680, 400, 60, 50, 30, 230
    px = lambda x: left + (w - left - right) * x / xmax
    py = lambda y: h - bottom - (h - bottom - top) * y
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{left}" y="18">Distributed matmul latency CDF, 8 worker processes '
           f'(injected shifted-exp delays)</text>',
           f'<line x1="{left}" y1="{h - bottom}" x2="{w - right}" y2="{h - bottom}" stroke="black"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}" stroke="black"/>',
           f'<text x="{(w - right + left) / 2 - 50}" y="{h - 12}">request latency (ms)</text>',
           f'<text x="10" y="{top + 10}">CDF</text>']
    step = 50 if xmax > 200 else 20
    x = 0
    while x <= xmax:
        out.append(f'<text x="{px(x) - 8}" y="{h - bottom + 16}">{x:g}</text>')
        x += step
    for q in (0, 0.5, 0.9, 0.99, 1.0):
        out.append(f'<text x="{left - 36}" y="{py(q) + 4}">{q:g}</text>')
        out.append(f'<line x1="{left}" y1="{py(q)}" x2="{w - right}" y2="{py(q)}" '
                   f'stroke="#ddd"/>')
    for i, (mode, vals) in enumerate(series.items()):
        vals = sorted(vals)
        pts = " ".join(f"{px(v):.1f},{py((j + 1) / len(vals)):.1f}" for j, v in enumerate(vals))
        c = COLORS.get(mode, "black")
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="{pts}"/>')
        out.append(f'<line x1="{w - right + 10}" y1="{top + 20 * i + 6}" x2="{w - right + 30}" '
                   f'y2="{top + 20 * i + 6}" stroke="{c}" stroke-width="2"/>')
        out.append(f'<text x="{w - right + 36}" y="{top + 20 * i + 10}">'
                   f'{LABELS.get(mode, mode)}</text>')
    out.append("</svg>")
    open(dst, "w").write("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
