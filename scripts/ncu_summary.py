#!/usr/bin/env python3
"""One Markdown row per profiled launch, in launch order, from an `ncu --csv --page details` file: time, grid, registers, occupancy, issue rate, pipe use, the top
stall reasons. Used by scripts/profile_kernels.sh."""
import csv
import re
import sys

WANTED = {
    "Duration": "us",
    "Registers Per Thread": "regs",
    "Achieved Occupancy": "occ %",
    "Theoretical Occupancy": "theo %",
    "Issue Slots Busy": "issue %",
    "Compute (SM) Throughput": "SM %",
    "Memory Throughput": "mem %",
    "Warp Cycles Per Issued Instruction": "cyc/inst",
}
STALL = re.compile(r"smsp__average_warps_issue_stalled_(.*)_per_issue_active\.ratio")


def short_name(full):
    """'void cnn::(anonymous namespace)::igemm_kernel<cnn::Wide, 1>(P)' -> 'igemm_kernel<Wide, 1>'."""
    name = full.replace("(anonymous namespace)::", "").replace("cnn::", "")
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\([^()]*\)\s*$", "", name)  # the parameter list
    return name[:90]


def main(path):
    kernels = {}  # (name, grid, block, launch id) -> {column: value}, in launch order
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own log lines are not CSV rows
    for row in csv.DictReader(lines):
        name = short_name(row.get("Kernel Name", ""))
        key = (name, row.get("Grid Size", ""), row.get("Block Size", ""), row.get("ID", ""))
        d = kernels.setdefault(key, {"stalls": {}})
        metric, value, unit = row.get("Metric Name", ""), row.get("Metric Value", ""), row.get("Metric Unit", "")
        try:
            v = float(value.replace(",", ""))
        except ValueError:
            continue
        if metric == "Duration":
            v = v / 1000.0 if unit in ("ns", "nsecond") else (v * 1000.0 if unit in ("ms", "msecond") else v)
        m = STALL.match(metric)
        if m:
            d["stalls"][m.group(1)] = v
        elif metric in WANTED:
            d[WANTED[metric]] = v
    cols = list(WANTED.values())
    print("| kernel | grid | block | " + " | ".join(cols) + " | top stalls (cycles per issue) |")
    print("|---|---|---|" + "---:|" * len(cols) + "---|")
    for (name, grid, block, _id), d in kernels.items():
        stalls = sorted(d["stalls"].items(), key=lambda kv: -kv[1])[:3]
        s = ", ".join(f"{k} {v:.1f}" for k, v in stalls)
        vals = " | ".join(f"{d[c]:.1f}" if c in d else "-" for c in cols)
        print(f"| {name} | {grid} | {block} | {vals} | {s} |")


if __name__ == "__main__":
    main(sys.argv[1])
