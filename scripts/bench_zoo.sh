#!/usr/bin/env bash
# The model-zoo step benchmark: every net in configs/ at batch 128, our training step
# (./bench --step: one step per CUDA-graph replay, synthetic data on the device) and PyTorch's
# (scripts/torch_baseline.py: the same net and SGD step, CUDA graph and eager) in the same call,
# one Markdown table: net, precision, ours us/step, PyTorch graph, PyTorch eager, graph/ours.
#
# Usage: scripts/bench_zoo.sh OUTDIR [PRECISIONS] [NET...]
#   PRECISIONS  comma-separated, default fp32,tf32,bf16; each is passed to ./bench --precision
#               and torch_baseline.py --precision as it is (torch_baseline runs bf16 as autocast
#               with FP32 master weights)
#   NET         config names under configs/ (default: mnist fashion_mnist resnet_fashion
#               mobilenet_fashion vgg_cifar); synthetic data, so no dataset is needed
#   BATCH (128), STEP_REPEATS (200, ./bench), TORCH_STEPS (50 steps x 5 windows): environment
# Writes under OUTDIR: zoo.md (the table and the commands), ours_<net>_<prec>.{csv,log},
# torch_<net>.{csv,log}. Without an importable torch with CUDA it says so in one line and the
# PyTorch columns read "-". Exits non-zero when one of our measurements failed.
# Expected on an H200: ~10 s per net and precision of ours (start-up, autotune, 410 steps), ~15 s
# per net of PyTorch (import, cudnn.benchmark, 2 x 250 steps per precision): ~3 minutes in all.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: scripts/bench_zoo.sh OUTDIR [PRECISIONS] [NET...]}"
precs="${2:-fp32,tf32,bf16}"
shift $(($# >= 2 ? 2 : $#))
nets=("$@")
[ ${#nets[@]} -gt 0 ] || nets=(mnist fashion_mnist resnet_fashion mobilenet_fashion vgg_cifar)
batch="${BATCH:-128}"
mkdir -p "$out"

bench=""
for b in .device_bin/bench build/bin/bench ./bench; do
  [ -x "$b" ] && { bench="$b"; break; }
done
[ -n "$bench" ] || { echo "bench_zoo: no bench binary (.device_bin/bench, build/bin/bench or ./bench)" >&2; exit 2; }

have_torch=1
why=$(python3 -c 'import torch; assert torch.cuda.is_available(), "no CUDA device for torch"' 2>&1) \
  || { have_torch=0; echo "bench_zoo: PyTorch not usable ($(echo "$why" | tail -1)); the PyTorch columns are skipped"; }

status=0
start=$SECONDS
for net in "${nets[@]}"; do
  cfg="configs/$net.yaml"
  [ -f "$cfg" ] || { echo "bench_zoo: $cfg not found" >&2; status=1; continue; }
  for p in ${precs//,/ }; do
    echo "bench_zoo: ours $net $p"
    timeout -k 10 "${OURS_TIMEOUT:-120}" "$bench" --config "$cfg" --step --no-lib --no-peaks \
      --precision "$p" --step-batches "$batch" --step-repeats "${STEP_REPEATS:-200}" \
      --csv "$out/ours_${net}_$p.csv" > "$out/ours_${net}_$p.log" 2>&1 \
      || { echo "bench_zoo: ours $net $p failed (exit $?): $(tail -1 "$out/ours_${net}_$p.log")"; status=1; }
  done
  if [ $have_torch -eq 1 ]; then
    echo "bench_zoo: torch $net $precs"
    timeout -k 10 "${TORCH_TIMEOUT:-150}" python3 scripts/torch_baseline.py --config "$cfg" --no-ops \
      --batches "$batch" --precision "$precs" --steps "${TORCH_STEPS:-50}" --windows 5 \
      --step-csv "$out/torch_$net.csv" > "$out/torch_$net.log" 2>&1 \
      || echo "bench_zoo: torch $net failed (exit $?; not ours): $(tail -1 "$out/torch_$net.log")"
  fi
done

python3 - "$out" "$batch" "$precs" "$have_torch" "$bench" "${nets[@]}" <<'PY'
import csv, glob, os, re, subprocess, sys
out, batch, precs, have_torch, bench, nets = (sys.argv[1], sys.argv[2], sys.argv[3].split(","),
                                              sys.argv[4] == "1", sys.argv[5], sys.argv[6:])

def rows(path):
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

# The commit the bench binary was built from (its log's first line, "bench V (git C)"): a tree
# copied to a GPU machine may carry an older git history than the binaries it runs.
commit = None
for log in sorted(glob.glob(os.path.join(out, "ours_*.log"))):
    with open(log, errors="replace") as f:
        m = re.search(r"\(git ([^)]+)\)", f.readline())
    if m:
        commit = m.group(1)
        break
if commit is None:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip() or "unknown"
    except OSError:
        commit = "unknown"
gpu = "unknown GPU"
try:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip().splitlines()[0]
except (OSError, IndexError):
    pass
table = ["| net | precision | ours us/step | PyTorch graph us/step | PyTorch eager us/step | "
         "graph/ours |", "|---|---|---:|---:|---:|---:|"]
for net in nets:
    torch_rows = {r["precision"]: r for r in rows(os.path.join(out, f"torch_{net}.csv"))
                  if r.get("batch") == batch}
    for p in precs:
        ours = None
        note = "" if os.path.exists(os.path.join(out, f"ours_{net}_{p}.csv")) else "failed"
        for r in rows(os.path.join(out, f"ours_{net}_{p}.csv")):
            if r["section"] == "step" and r["variant"] == "graph" and r["status"] == "ok":
                ours = num(r["median_us"])
            elif r["section"] == "step" and r["status"] != "ok":
                note = r["status"]
        t = torch_rows.get(p, {})
        graph, eager = num(t.get("graph_us")), num(t.get("eager_us"))
        ratio = f"{graph / ours:.2f}x" if graph and ours else "-"
        table.append(f"| {net} | {p} | {us(ours) if ours or not note else note} | {us(graph)} | "
                     f"{us(eager)} | {ratio} |")
text = [f"# Model zoo: training step at batch {batch}", "",
        f"{gpu}, commit {commit}; ours: `{bench} --config configs/NET.yaml --step --no-lib "
        f"--precision P --step-batches {batch}` (graph replay median); PyTorch: "
        f"`scripts/torch_baseline.py --config configs/NET.yaml --no-ops --batches {batch}` "
        "(CUDA graph and eager, cudnn.benchmark on). graph/ours > 1: ours is faster.", ""]
if not have_torch:
    text += ["PyTorch was not importable with CUDA here: its columns are empty.", ""]
text += table
tmp = os.path.join(out, "zoo.md.tmp")
with open(tmp, "w") as f:
    f.write("\n".join(text) + "\n")
os.replace(tmp, os.path.join(out, "zoo.md"))
print("\n".join(text))
PY
echo "bench_zoo: $((SECONDS - start)) s; table in $out/zoo.md"
exit $status
