#!/usr/bin/env python3
"""scripts/zoo_table.py: the zoo's step and per-pass tables from bench and torch CSV files.

The files are written here in ./bench's own CSV layout (its header is read from
app/bench/bench_report.cpp's format_csv, so a changed layout fails this test) and
scripts/torch_baseline.py's --step-csv layout.
"""
import csv
import importlib.util
import os
import re
import shutil
import sys
import tempfile

root = os.environ.get("CNN_SOURCE_DIR", os.path.join(os.path.dirname(__file__), ".."))
spec = importlib.util.spec_from_file_location("zoo_table",
                                              os.path.join(root, "scripts", "zoo_table.py"))
zt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(zt)

with open(os.path.join(root, "app", "bench", "bench_report.cpp")) as f:
    src = f.read()
body = src[src.index("std::string format_csv"):]
literal = re.search(r'std::string out =\s*((?:"[^"]*"\s*)+);', body).group(1)
header = "".join(re.findall(r'"([^"]*)"', literal)).replace("\\n", "").split(",")
assert header[:8] == ["section", "op", "shape", "variant", "precision", "status", "max_rel_err",
                      "median_us"], header


def write_bench_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in header})


def op(name, variant, status, us, peak=""):
    return {"section": "op", "op": name, "variant": variant, "precision": "tf32",
            "status": status, "median_us": us, "peak_frac": peak}


out = tempfile.mkdtemp(prefix="zoo_table_")
step = {"section": "step", "op": "step", "variant": "graph", "status": "ok", "batch": "128"}
write_bench_csv(os.path.join(out, "ours_vgg_tf32.csv"),
                [dict(step, variant="launches", median_us="130.0"), dict(step, median_us="100.0")])
write_bench_csv(os.path.join(out, "ours_vgg_bf16.csv"),
                [dict(step, status="out of memory", median_us="")])
with open(os.path.join(out, "ours_vgg_tf32.log"), "w") as f:
    f.write("bench 0.1.0 (git 1234abc), CUDA on, architectures 90\n")
with open(os.path.join(out, "torch_vgg.csv"), "w") as f:
    f.write("batch,precision,eager_us,graph_us,note\n128,tf32,400.0,150.0,\n"
            "64,tf32,300.0,90.0,\n128,bf16,380.0,120.0,\n")
write_bench_csv(os.path.join(out, "passes_vgg_tf32.csv"), [
    op("conv2.fwd", "igemm", "ok", "50.0", "0.1"),
    op("conv2.fwd", "wgmma-nhwc", "ok", "40.0", "0.25"),
    op("conv2.fwd", "naive", "WRONG", "1.0"),  # faster but wrong: never the pick
    op("conv2.fwd", "cudnn", "ok", "44.0"),
    op("conv2.fwd.to_nhwc", "wgmma-nhwc", "ok", "9.0"),  # ours alone: no row
    op("fc1.wgrad", "igemm", "WRONG", "5.0"),
    op("fc1.wgrad", "cublas", "ok", "16.0"),
    op("bn1.fwd", "fast", "ok", "35.0", "0.6"),
    op("bn1.fwd", "cudnn", "error", "20.0"),  # the library failed: no row
    {"section": "step", "op": "step", "variant": "graph", "status": "ok", "median_us": "1.0"},
])

text = zt.zoo_markdown(out, "128", ["tf32", "bf16"], True, "./bench", ["vgg"],
                       zt.bench_commit(out), "Test GPU")
md = "\n".join(text)
assert "Test GPU, commit 1234abc;" in md, md
# The graph row, not the launches row; PyTorch's batch-128 row, not batch 64's.
assert "| vgg | tf32 | 100.0 | 150.0 | 400.0 | 1.50x |" in text, md
assert "| vgg | bf16 | out of memory | 120.0 | 380.0 | - |" in text, md
assert "## Each pass against cuDNN / cuBLAS, batch 128" in md, md
passes = [line for line in text if line.startswith("| vgg | tf32 | ") and line.count("|") == 10]
assert passes == [
    "| vgg | tf32 | conv2.fwd | wgmma-nhwc | 40.0 | cudnn | 44.0 | 1.10x | 25.0 |",
    "| vgg | tf32 | fc1.wgrad | (none correct) | - | cublas | 16.0 | - | - |",
], passes

# Without pass files there is no second table; with PyTorch missing its columns read "-".
os.remove(os.path.join(out, "passes_vgg_tf32.csv"))
text = zt.zoo_markdown(out, "128", ["tf32"], False, "./bench", ["vgg", "lenet"], "c", "g")
md = "\n".join(text)
assert "Each pass" not in md, md
assert "PyTorch was not importable" in md, md
assert "| lenet | tf32 | failed | - | - | - |" in text, md

# main() replaces zoo.md whole and leaves no temporary file.
zt.main([out, "128", "tf32", "1", "./bench", "vgg"])
assert os.path.exists(os.path.join(out, "zoo.md"))
assert not os.path.exists(os.path.join(out, "zoo.md.tmp"))
shutil.rmtree(out)
print("test_zoo_table: ok")
sys.exit(0)
