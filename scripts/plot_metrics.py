#!/usr/bin/env python3
"""Draws one or more training runs' metrics.csv (written by ./train into its log dir) as a PNG:
loss and accuracy against the epoch (training points and evaluations), and the learning rate.

    python3 scripts/plot_metrics.py logs/mnist/metrics.csv [logs/other/metrics.csv ...] [-o run.png]

Several files are drawn on the same axes, labelled by their folder name. Without matplotlib it
prints a per-epoch summary instead and exits 0.
"""

import argparse
import csv
import math
import os
import sys

COLUMNS = {"time_s", "epoch", "step", "phase", "loss", "accuracy", "lr"}


def number(s):
    try:
        v = float(s)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def read_run(path):
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        sys.exit(f"plot_metrics: error: cannot read {path}: {e.strerror}")
    if not rows:
        sys.exit(f"plot_metrics: error: {path} has no rows")
    missing = COLUMNS - set(rows[0])
    if missing:
        sys.exit(f"plot_metrics: error: {path} lacks the columns {sorted(missing)}; "
                 "expected the metrics.csv of ./train")
    steps_per_epoch = {}
    for r in rows:  # the last step of each epoch, to place points at fractional epochs
        e, s = number(r["epoch"]), number(r["step"])
        if e is not None and s is not None:
            steps_per_epoch[int(e)] = max(steps_per_epoch.get(int(e), 0), s)
    first_epoch_steps = steps_per_epoch.get(min(steps_per_epoch), 1) if steps_per_epoch else 1
    run = {"train": [], "eval": []}
    for r in rows:
        step, loss, acc, lr = (number(r[k]) for k in ("step", "loss", "accuracy", "lr"))
        if step is None:
            continue
        x = step / first_epoch_steps if first_epoch_steps else step
        phase = "eval" if r["phase"].startswith("eval") or r["phase"] == "test" else "train"
        run[phase].append((x, loss, acc, lr, r))
    return run


def accuracy_limits(percents):
    """The accuracy axis zoomed to the data (in %): a run that climbs from 97% to 99% is drawn
    across the plot instead of as a flat line under 100. A margin of a tenth of the range (at
    least 0.5 points), clamped to [0, 100]; None when there is nothing to draw."""
    vals = [v for v in percents if v is not None and math.isfinite(v)]
    if not vals:
        return None
    lo, hi = min(vals), max(vals)
    margin = max(0.1 * (hi - lo), 0.5)
    return max(0.0, lo - margin), min(100.0, hi + margin)


def label_of(path):
    folder = os.path.basename(os.path.dirname(os.path.abspath(path)))
    return folder or path


def print_summary(runs):
    for label, run in runs:
        print(f"{label}:")
        for x, loss, acc, lr, r in run["eval"]:
            print(f"  epoch {r['epoch']:>3}  eval loss {loss:.4f}  accuracy {100 * acc:.2f}%"
                  f"  lr {lr:.3g}  at {r['time_s']} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", nargs="+", help="metrics.csv of a run (several to compare)")
    ap.add_argument("-o", "--output", default="metrics.png", help="PNG to write (default %(default)s)")
    args = ap.parse_args()
    runs = [(label_of(p), read_run(p)) for p in args.csv]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_metrics: matplotlib is not installed (apt-get install python3-matplotlib); "
              "summary only")
        print_summary(runs)
        return 0

    fig, (ax_loss, ax_acc, ax_lr) = plt.subplots(1, 3, figsize=(15, 4.2))
    all_acc = []
    for i, (label, run) in enumerate(runs):
        color = f"C{i}"
        for phase, style in (("train", "-"), ("eval", "o-")):
            pts = run[phase]
            if not pts:
                continue
            xs = [p[0] for p in pts]
            ax_loss.plot(xs, [p[1] for p in pts], style, color=color, alpha=0.5 if phase == "train" else 1,
                         markersize=3, label=f"{label} {phase}")
            acc = [100 * p[2] if p[2] is not None else None for p in pts]
            all_acc += acc
            ax_acc.plot(xs, acc, style,
                        color=color, alpha=0.5 if phase == "train" else 1, markersize=3,
                        label=f"{label} {phase}")
        if run["train"]:
            ax_lr.plot([p[0] for p in run["train"]], [p[3] for p in run["train"]], color=color, label=label)
    ax_loss.set(title="loss", xlabel="epoch", yscale="log")
    ax_acc.set(title="accuracy (%)", xlabel="epoch")
    limits = accuracy_limits(all_acc)
    if limits:
        ax_acc.set_ylim(*limits)
    ax_lr.set(title="learning rate", xlabel="epoch")
    for ax in (ax_loss, ax_acc, ax_lr):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = args.output + ".tmp"
    fig.savefig(tmp, dpi=110, format="png")
    os.replace(tmp, args.output)  # never a half-written PNG under the final name
    print(f"plot_metrics: wrote {args.output}")
    print_summary(runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
