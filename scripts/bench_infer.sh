#!/usr/bin/env bash
# Inference throughput: our forward (./bench --infer: FP32, TF32, BF16 and int8 on the
# tensor-core and the direct kernel, one forward per CUDA-graph replay, random images on the
# device, int8 quantized inside the bench) against PyTorch's (scripts/torch_baseline.py --infer:
# torch.inference_mode, eval, eager and CUDA graph, FP32/TF32/BF16 autocast) on the same net, at
# batch 1, 32 and 256, in one call; one Markdown table per net, images/s.
#
# Usage: scripts/bench_infer.sh OUTDIR [NET...]
#   NET   config names under configs/ (default: mnist fashion_mnist); synthetic data, no dataset
#   BATCHES (1,32,256), REPEATS (200 graph replays, ours), TORCH_STEPS (50 forwards x 5
#   windows): environment
# Writes under OUTDIR: infer.md (the tables, int8 stage timings, commands), ours_<net>.{csv,md,log},
# torch_<net>.{csv,log}. Without an importable torch with CUDA it says so and the PyTorch rows
# read "-". Exits non-zero when one of our measurements failed.
# Expected on an H200: ~15 s per net of ours, ~20 s per net of PyTorch: under a minute for two.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: scripts/bench_infer.sh OUTDIR [NET...]}"
shift
nets=("$@")
[ ${#nets[@]} -gt 0 ] || nets=(mnist fashion_mnist)
batches="${BATCHES:-1,32,256}"
mkdir -p "$out"

bench=""
for b in .device_bin/bench build/bin/bench ./bench; do
  [ -x "$b" ] && { bench="$b"; break; }
done
[ -n "$bench" ] || { echo "bench_infer: no bench binary (.device_bin/bench, build/bin/bench or ./bench)" >&2; exit 2; }

have_torch=1
why=$(python3 -c 'import torch; assert torch.cuda.is_available(), "no CUDA device for torch"' 2>&1) \
  || { have_torch=0; echo "bench_infer: PyTorch not usable ($(echo "$why" | tail -1)); the PyTorch rows are skipped"; }

status=0
for net in "${nets[@]}"; do
  cfg="configs/$net.yaml"
  [ -f "$cfg" ] || { echo "bench_infer: $cfg not found" >&2; status=1; continue; }
  echo "bench_infer: ours $net"
  timeout -k 10 "${OURS_TIMEOUT:-120}" "$bench" --config "$cfg" --infer --no-lib \
    --infer-batches "$batches" --step-repeats "${REPEATS:-200}" \
    --csv "$out/ours_$net.csv" --markdown "$out/ours_$net.md" > "$out/ours_$net.log" 2>&1 \
    || { echo "bench_infer: ours $net failed (exit $?): $(tail -1 "$out/ours_$net.log")"; status=1; }
  if [ $have_torch = 1 ]; then
    echo "bench_infer: torch $net"
    timeout -k 10 "${TORCH_TIMEOUT:-150}" python3 scripts/torch_baseline.py --config "$cfg" --infer \
      --precision fp32,tf32,bf16 --batches "$batches" --steps "${TORCH_STEPS:-50}" --windows 5 \
      --infer-csv "$out/torch_$net.csv" > "$out/torch_$net.log" 2>&1 \
      || echo "bench_infer: torch $net failed (exit $?): $(tail -1 "$out/torch_$net.log")"
  fi
done

python3 - "$out" "$batches" "$bench" "${nets[@]}" <<'PY'
import csv, os, sys
out, batches, bench, nets = sys.argv[1], [int(b) for b in sys.argv[2].split(",")], sys.argv[3], sys.argv[4:]

def rows_of(path):
    try:
        with open(path, newline="") as f:
            return list(csv.DictReader(f))
    except OSError:
        return []

def ips(batch, us):
    try:
        return batch / (float(us) * 1e-6)
    except (TypeError, ValueError, ZeroDivisionError):
        return None

md = ["# Inference forward, images/s (higher is better)", "",
      f"Ours: `{bench} --config configs/NET.yaml --infer --no-lib` (one forward per CUDA-graph "
      "replay, median). PyTorch: `scripts/torch_baseline.py --config configs/NET.yaml --infer "
      "--precision fp32,tf32,bf16` (torch.inference_mode, eval; CUDA graph and eager, median of "
      "5 windows). Random images already on the GPU; int8 quantized inside the bench.", ""]
for net in nets:
    table = {}  # forward -> {batch: images/s}
    order = []
    def put(what, b, v):
        if what not in table:
            table[what] = {}
            order.append(what)
        table[what][b] = v
    stage_rows, missing = [], []
    for r in rows_of(os.path.join(out, f"ours_{net}.csv")):
        b = int(r["batch"])
        if not r["images_per_s"] and r["note"] and r["note"] not in missing:
            missing.append(r["note"])  # why a row has no number (e.g. a layer int8 cannot run)
        if " stage " in r["what"]:
            stage_rows.append(r)
            continue
        put("ours " + r["what"], b, float(r["images_per_s"]) if r["images_per_s"] else None)
    for mode in ("graph", "eager"):
        for r in rows_of(os.path.join(out, f"torch_{net}.csv")):
            b = int(r["batch"])
            put(f"PyTorch {mode} {r['precision']}", b, ips(b, r[f"{mode}_us"]))
    md += [f"## {net} (configs/{net}.yaml)", "",
           "| forward | " + " | ".join(f"batch {b}" for b in batches) + " |",
           "|---|" + "---:|" * len(batches)]
    for what in order:
        cells = [table[what].get(b) for b in batches]
        md.append(f"| {what} | " + " | ".join("-" if v is None else f"{v:,.0f}" for v in cells) + " |")
    # int8 (tensor cores) against the fastest PyTorch CUDA-graph forward at each batch.
    best = []
    for b in batches:
        ours = table.get("ours int8 (tensor cores)", {}).get(b)
        theirs = [v.get(b) for k, v in table.items() if k.startswith("PyTorch graph") and v.get(b)]
        best.append("-" if not ours or not theirs else f"{ours / max(theirs):.2f}x")
    md.append("| int8 / fastest PyTorch graph | " + " | ".join(best) + " |")
    md += [f"\n- no number: {m}" for m in missing]
    if stage_rows:
        md += ["", f"int8 stages alone at batch {stage_rows[0]['batch']} (ours):", "",
               "| stage | median us | notes |", "|---|---:|---|"]
        for r in stage_rows:
            md.append(f"| {r['what']} | {float(r['median_us']):.2f} | {r['note']} |")
    md.append("")
tmp = os.path.join(out, "infer.md.tmp")
with open(tmp, "w") as f:
    f.write("\n".join(md) + "\n")
os.replace(tmp, os.path.join(out, "infer.md"))
print("\n".join(md))
PY
exit $status
