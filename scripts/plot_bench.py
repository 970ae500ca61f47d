#!/usr/bin/env python3
"""Draws ./bench's CSV (--csv FILE) as a PNG: per op and precision, our fastest correct variant
beside cuDNN/cuBLAS (microseconds, log scale), and the whole-step images/s when present.

    python3 scripts/plot_bench.py bench.csv [-o bench.png]

Exits 0 with a message when matplotlib is not installed.
"""

import argparse
import csv
import math
import sys

LIBRARIES = {"cudnn", "cublas"}


def number(s):
    try:
        v = float(s)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def read_rows(path):
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        print(f"plot_bench: error: cannot read {path}: {e.strerror}", file=sys.stderr)
        sys.exit(1)
    need = {"section", "op", "variant", "precision", "status", "median_us"}
    if rows and not need <= set(rows[0]):
        print(f"plot_bench: error: {path} lacks the columns {sorted(need - set(rows[0]))}; "
              "expected ./bench --csv output", file=sys.stderr)
        sys.exit(1)
    return rows


def op_pairs(rows):
    """[(label, ours_us, ours_variant, lib_us, lib_name)] in the CSV's order."""
    order, ours, lib = [], {}, {}
    for r in rows:
        if r["section"] != "op":
            continue
        key = (r["op"], r["precision"])
        if key not in order:
            order.append(key)
        t = number(r["median_us"])
        if r["status"] != "ok" or t is None:
            continue
        slot = lib if r["variant"] in LIBRARIES else ours
        if key not in slot or t < slot[key][0]:
            slot[key] = (t, r["variant"])
    out = []
    for key in order:
        o, l = ours.get(key), lib.get(key)
        out.append((f"{key[0]} {key[1]}", o[0] if o else None, o[1] if o else "",
                    l[0] if l else None, l[1] if l else ""))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="CSV written by ./bench --csv")
    ap.add_argument("-o", "--out", default="bench.png", help="PNG to write (default bench.png)")
    args = ap.parse_args()

    rows = read_rows(args.csv)
    pairs = op_pairs(rows)
    steps = [r for r in rows if r["section"] == "step" and r["status"] == "ok"
             and number(r.get("images_per_s")) is not None]
    if not pairs and not steps:
        print(f"plot_bench: {args.csv} has no measured rows; nothing to draw")
        return 0
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_bench: matplotlib is not installed (pip install matplotlib); no plot drawn")
        return 0

    panels = (1 if pairs else 0) + (1 if steps else 0)
    heights = ([max(3.0, 0.32 * len(pairs))] if pairs else []) + ([3.5] if steps else [])
    fig, axes = plt.subplots(panels, 1, figsize=(11, sum(heights) + 1.0),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    axes = [a[0] for a in axes]
    ax_i = 0
    if pairs:
        ax = axes[ax_i]
        ax_i += 1
        ys = list(range(len(pairs)))
        h = 0.38
        ours = [p[1] or 0 for p in pairs]
        libs = [p[3] or 0 for p in pairs]
        ax.barh([y - h / 2 for y in ys], ours, h, label="ours (fastest correct variant)",
                color="#2b7bba")
        ax.barh([y + h / 2 for y in ys], libs, h, label="cuDNN / cuBLAS", color="#d95f02")
        for y, p in zip(ys, pairs):
            if p[1] and p[3]:
                ax.text(max(p[1], p[3]) * 1.08, y, f"{p[3] / p[1]:.2f}x  {p[2]}", va="center",
                        fontsize=7)
            elif p[1]:
                ax.text(p[1] * 1.08, y, p[2], va="center", fontsize=7)
        ax.set_yticks(ys)
        ax.set_yticklabels([p[0] for p in pairs], fontsize=7)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("median microseconds per launch (log scale; label: library/ours)")
        ax.legend(loc="lower right", fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    if steps:
        ax = axes[ax_i]
        labels = [f"b{r['batch']} {r['precision']} {r['variant']}" for r in steps]
        vals = [number(r["images_per_s"]) for r in steps]
        ax.bar(range(len(vals)), vals, color="#1b9e77")
        ax.set_xticks(range(len(vals)))
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("images / s")
        ax.set_title("whole training step", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=130)
    print(f"plot_bench: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
