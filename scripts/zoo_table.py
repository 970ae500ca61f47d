#!/usr/bin/env python3
"""The model-zoo tables from what scripts/bench_zoo.sh left in OUTDIR.

    python3 scripts/zoo_table.py OUTDIR BATCH PRECISIONS HAVE_TORCH BENCH NET...

Reads ours_<net>_<prec>.{csv,log} (./bench --step), torch_<net>.csv (scripts/torch_baseline.py)
and, where bench_zoo.sh ran them (PASSES=1), passes_<net>_<prec>.csv (./bench --no-step with
cuDNN/cuBLAS); writes OUTDIR/zoo.md (replaced whole, never half-written) and prints it:
- the training step per net and precision: ours, PyTorch's CUDA graph and eager, graph/ours;
- per pass, where passes ran: our fastest correct variant beside the library's fastest correct
  algorithm, for every pass the library also runs (convolutions, linear layers, BatchNorm,
  pooling, ...), as ./bench's own summary picks them.
"""

import csv
import glob
import os
import re
import subprocess
import sys

LIBRARIES = ("cudnn", "cublas")  # ./bench's variant names for the library's rows


def read_rows(path):
    """The rows of a CSV file as dicts; none when it is missing or unreadable."""
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except OSError:
        return []


def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def us(v):
    return "-" if v is None else f"{v:.1f}"


def step_table(out, batch, precs, nets):
    """Markdown lines: net, precision, ours us/step, PyTorch graph, eager, graph/ours."""
    table = ["| net | precision | ours us/step | PyTorch graph us/step | PyTorch eager us/step | "
             "graph/ours |", "|---|---|---:|---:|---:|---:|"]
    for net in nets:
        torch_rows = {r["precision"]: r for r in read_rows(os.path.join(out, f"torch_{net}.csv"))
                      if r.get("batch") == batch}
        for p in precs:
            path = os.path.join(out, f"ours_{net}_{p}.csv")
            ours = None
            note = "" if os.path.exists(path) else "failed"
            for r in read_rows(path):
                if r["section"] == "step" and r["variant"] == "graph" and r["status"] == "ok":
                    ours = num(r["median_us"])
                elif r["section"] == "step" and r["status"] != "ok":
                    note = r["status"]
            t = torch_rows.get(p, {})
            graph, eager = num(t.get("graph_us")), num(t.get("eager_us"))
            ratio = f"{graph / ours:.2f}x" if graph and ours else "-"
            table.append(f"| {net} | {p} | {us(ours) if ours or not note else note} | "
                         f"{us(graph)} | {us(eager)} | {ratio} |")
    return table


def best_per_op(rows):
    """[(op, ours row or None, library row or None)] in the order the ops first appear: the
    fastest correct ("ok") row of our variants and of the library's, per op."""
    order, ours, lib = [], {}, {}
    for r in rows:
        if r.get("section") != "op":
            continue
        op = r["op"]
        if op not in order:
            order.append(op)
        t = num(r.get("median_us"))
        if r.get("status") != "ok" or t is None:
            continue
        slot = lib if r["variant"] in LIBRARIES else ours
        if op not in slot or t < num(slot[op]["median_us"]):
            slot[op] = r
    return [(op, ours.get(op), lib.get(op)) for op in order]


def pass_table(out, precs, nets):
    """Markdown lines, one per pass that the library runs too; None when no passes ran."""
    table = ["| net | precision | pass | ours | ours us | library | library us | lib/ours | "
             "% of peak |", "|---|---|---|---|---:|---|---:|---:|---:|"]
    ran = False
    for net in nets:
        for p in precs:
            path = os.path.join(out, f"passes_{net}_{p}.csv")
            if not os.path.exists(path):
                continue
            ran = True
            for op, o, l in best_per_op(read_rows(path)):
                if l is None:
                    continue  # a pass of ours alone (pre-passes, fused kernels)
                to, tl = (num(o["median_us"]) if o else None), num(l["median_us"])
                ratio = f"{tl / to:.2f}x" if to and tl else "-"
                peak = num(o.get("peak_frac")) if o else None
                table.append(f"| {net} | {p} | {op} | {o['variant'] if o else '(none correct)'} | "
                             f"{us(to)} | {l['variant']} | {us(tl)} | {ratio} | "
                             f"{'-' if peak is None else f'{100 * peak:.1f}'} |")
    return table if ran else None


def bench_commit(out):
    """The commit the bench binary was built from (its log's first line, "bench V (git C)"): a
    tree copied to a GPU machine may carry an older git history than the binaries it runs."""
    for log in sorted(glob.glob(os.path.join(out, "ours_*.log"))):
        with open(log, errors="replace") as f:
            m = re.search(r"\(git ([^)]+)\)", f.readline())
        if m:
            return m.group(1)
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def gpu_name():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True).stdout.strip().splitlines()[0]
    except (OSError, IndexError):
        return "unknown GPU"


def zoo_markdown(out, batch, precs, have_torch, bench, nets, commit, gpu):
    text = [f"# Model zoo: training step at batch {batch}", "",
            f"{gpu}, commit {commit}; ours: `{bench} --config configs/NET.yaml --step --no-lib "
            f"--precision P --step-batches {batch}` (graph replay median); PyTorch: "
            f"`scripts/torch_baseline.py --config configs/NET.yaml --no-ops --batches {batch}` "
            "(CUDA graph and eager, cudnn.benchmark on). graph/ours > 1: ours is faster.", ""]
    if not have_torch:
        text += ["PyTorch was not importable with CUDA here: its columns are empty.", ""]
    text += step_table(out, batch, precs, nets)
    passes = pass_table(out, precs, nets)
    if passes is not None:
        text += ["", f"## Each pass against cuDNN / cuBLAS, batch {batch}", "",
                 f"`{bench} --config configs/NET.yaml --no-step --no-peaks --batch {batch} "
                 "--precision P`: our "
                 "fastest correct variant and the library's fastest correct algorithm, each "
                 "checked against the CPU reference first; lib/ours > 1: ours is faster; % of "
                 "peak: ours, of the precision's dense peak (of HBM bandwidth for the passes "
                 "that memory bounds).", ""]
        text += passes
    return text


def main(argv):
    if len(argv) < 6:
        sys.exit("usage: zoo_table.py OUTDIR BATCH PRECISIONS HAVE_TORCH BENCH NET...")
    out, batch, precs, have_torch, bench, nets = (argv[0], argv[1], argv[2].split(","),
                                                  argv[3] == "1", argv[4], argv[5:])
    text = zoo_markdown(out, batch, precs, have_torch, bench, nets, bench_commit(out), gpu_name())
    tmp = os.path.join(out, "zoo.md.tmp")
    with open(tmp, "w") as f:
        f.write("\n".join(text) + "\n")
    os.replace(tmp, os.path.join(out, "zoo.md"))
    print("\n".join(text))


if __name__ == "__main__":
    main(sys.argv[1:])
