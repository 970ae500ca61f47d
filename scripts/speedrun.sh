#!/usr/bin/env bash
# Time to accuracy over several seeds, the way speed-run records are reported: for each seed, the
# wall time from program start to the first evaluation that reaches training.stop_at_accuracy
# (run.json's time_to_target_s), then the median over the seeds and the accuracy spread.
#   scripts/speedrun.sh CONFIG [SEEDS] [--set key=value ...]
#     CONFIG  a speed-run config (configs/*_speedrun.yaml): it must set stop_at_accuracy
#     SEEDS   how many seeds, 1..SEEDS (default 5)
#     --set   passed on to every run (e.g. --set optimizer.lr=0.08 to compare a variant)
# Environment: TRAIN (the binary; default .device_bin/train if present, else ./train),
#   OUT (the runs' folder; default logs/speedrun/<config name>), WARMUP=0 (skip the unmeasured
#   warm-up run that fills the autotune cache and the decoded-dataset copy, so every measured run
#   is a "second run").
# Prints one line per seed, then the summary, and writes it to OUT/summary.txt.
set -euo pipefail
cd "$(dirname "$0")/.."

[ $# -ge 1 ] || { echo "usage: $0 CONFIG [SEEDS] [--set key=value ...]" >&2; exit 2; }
config=$1
shift
seeds=5
if [ $# -ge 1 ] && [[ $1 =~ ^[0-9]+$ ]]; then
  seeds=$1
  shift
fi
[ "$seeds" -ge 1 ] || { echo "speedrun: SEEDS must be >= 1" >&2; exit 2; }
[ -f "$config" ] || { echo "speedrun: no config file '$config'" >&2; exit 2; }
extra=("$@")
if [ -z "${TRAIN:-}" ]; then
  if [ -x .device_bin/train ]; then TRAIN=.device_bin/train; else TRAIN=./train; fi
fi
[ -x "$TRAIN" ] || { echo "speedrun: no train binary at '$TRAIN' (set TRAIN=...)" >&2; exit 2; }
name=$(basename "$config" .yaml)
out=${OUT:-logs/speedrun/$name}
rm -rf "$out"
mkdir -p "$out"

if [ "${WARMUP:-1}" != 0 ]; then
  echo "speedrun: warm-up run (fills the autotune cache and the decoded dataset; not measured)"
  "$TRAIN" --config "$config" --log-dir "$out/warmup" --set training.max_steps=2 \
    --set logging.progress=off "${extra[@]}" > "$out/warmup.log" 2>&1 ||
    { echo "speedrun: the warm-up run failed; see $out/warmup.log" >&2; tail -3 "$out/warmup.log" >&2; exit 1; }
fi

for s in $(seq 1 "$seeds"); do
  t0=$(date +%s.%N)
  if ! "$TRAIN" --config "$config" --log-dir "$out/seed$s" --set training.seed="$s" \
      --set logging.progress=off "${extra[@]}" > "$out/seed$s.log" 2>&1; then
    echo "speedrun: seed $s failed; see $out/seed$s.log" >&2
    tail -3 "$out/seed$s.log" >&2
    exit 1
  fi
  t1=$(date +%s.%N)
  echo "$t0 $t1" > "$out/seed$s/wall.txt"
done

python3 - "$out" "$seeds" "$config" "${extra[*]:-}" <<'PY' | tee "$out/summary.txt"
import json, os, statistics, sys
out, seeds, config, extra = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rows = []
for s in range(1, seeds + 1):
    d = os.path.join(out, f"seed{s}")
    with open(os.path.join(d, "run.json")) as f:
        r = json.load(f)
    t0, t1 = map(float, open(os.path.join(d, "wall.txt")).read().split())
    r["process_wall_s"] = t1 - t0
    rows.append(r)
    hit = (f"reached {r['reached_accuracy']:.2f}% at epoch {r['reached_epoch']}, "
           f"{r['time_to_target_s']:.2f} s after start" if r["reached"] else
           f"target not reached (best {r['best_accuracy']:.2f}%)")
    print(f"seed {s}: {hit}; start-up {r['startup_s']:.3f} s; final {r['final_accuracy']:.2f}% "
          f"after {r['epochs']} epochs; process {r['process_wall_s']:.2f} s")
target = rows[0]["target_accuracy"]
if target is None:
    sys.exit(f"speedrun: {config} sets no training.stop_at_accuracy")
hit = [r for r in rows if r["reached"]]
times = [r["time_to_target_s"] for r in hit]
acc = [r["reached_accuracy"] for r in hit]
print(f"config {config}{' with ' + extra if extra else ''}: target {target:.1f}%, "
      f"{len(hit)} of {seeds} seeds reached it")
if hit:
    print(f"time to target: median {statistics.median(times):.2f} s "
          f"(min {min(times):.2f}, max {max(times):.2f}) over the seeds that reached it")
    print(f"accuracy at the target: median {statistics.median(acc):.2f}% "
          f"(min {min(acc):.2f}, max {max(acc):.2f}); epochs: "
          f"{sorted(r['reached_epoch'] for r in hit)}")
startup = [r["startup_s"] for r in rows]
print(f"start-up before the first step: median {statistics.median(startup):.3f} s "
      f"(min {min(startup):.3f}, max {max(startup):.3f})")
if len(hit) < seeds:
    best = [r["best_accuracy"] for r in rows if not r["reached"]]
    print(f"missed: best accuracy of those runs {', '.join(f'{b:.2f}%' for b in best)}")
PY
