#!/usr/bin/env bash
# Int8 accuracy against FP32 on each zoo config's test set, in one go: train the float net,
# quantize it (`./quantize --calibrate N --evaluate`: BatchNorm folded, per-channel weights,
# activation scales calibrated on N training images), and report both test accuracies.
#
# Usage: scripts/quant_accuracy.sh OUTDIR [NET[:EPOCHS]...]
#   NET      a config name under configs/ (default: mnist fashion_mnist mobilenet_fashion:2
#            resnet_fashion:3 vgg_fashion_rgb:3); EPOCHS overrides training.epochs (fewer epochs
#            than the config's to fit a device call: the comparison is float vs int8 of the same
#            trained weights, so a shorter training measures the same thing)
#   CALIBRATE (1000 training images), METHOD (mse), DEVICE (cuda), BIN (the folder of train and
#   quantize; default .device_bin/, build/bin/ or ./, the first that has both): environment
# Needs the datasets the configs read (scripts/get_data.sh; vgg_fashion_rgb's folders are made
# from Fashion-MNIST with scripts/make_rgb_folders.py when they are missing).
# Writes OUTDIR/accuracy.md (one row per net) and OUTDIR/<net>/ (the run, its .int8 file and
# the logs). Exits non-zero when a run failed; the rows of the others are still written.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: scripts/quant_accuracy.sh OUTDIR [NET[:EPOCHS]...]}"
shift
nets=("$@")
[ ${#nets[@]} -gt 0 ] || nets=(mnist fashion_mnist mobilenet_fashion:2 resnet_fashion:3 vgg_fashion_rgb:3)
calibrate="${CALIBRATE:-1000}"
method="${METHOD:-mse}"
device="${DEVICE:-cuda}"
mkdir -p "$out"

bin="${BIN:-}"
for d in ${bin:-.device_bin build/bin .}; do
  [ -x "$d/train" ] && [ -x "$d/quantize" ] && { bin="$d"; break; }
done
[ -x "$bin/train" ] && [ -x "$bin/quantize" ] \
  || { echo "quant_accuracy: no train/quantize binaries in ${bin:-.device_bin/, build/bin/ or ./}" >&2; exit 2; }

status=0
table="$out/accuracy.md"
{
  echo "| config | epochs | FP32 | int8 ($method, $calibrate images) | int8 - FP32 |"
  echo "|---|---:|---:|---:|---:|"
} > "$table"
for spec in "${nets[@]}"; do
  net="${spec%%:*}"
  epochs=""
  [ "$spec" != "$net" ] && epochs="${spec#*:}"
  config="configs/$net.yaml"
  [ -f "$config" ] || { echo "quant_accuracy: no $config" >&2; status=1; continue; }
  if [ "$net" = vgg_fashion_rgb ] && [ ! -d datasets/fashion-rgb32/test ]; then
    python3 scripts/make_rgb_folders.py > "$out/make_rgb_folders.log" 2>&1 \
      || { echo "quant_accuracy: make_rgb_folders.py failed (see $out/make_rgb_folders.log)" >&2; status=1; continue; }
  fi
  run="$out/$net"
  sets=(--set logging.progress=off)
  [ -n "$epochs" ] && sets+=(--set "training.epochs=$epochs")
  t0=$(date +%s)
  if ! "$bin/train" --config "$config" --device "$device" --log-dir "$run" --overwrite "${sets[@]}" \
      > "$out/train_$net.log" 2>&1; then
    echo "quant_accuracy: training $net failed (see $out/train_$net.log)" >&2
    status=1
    continue
  fi
  t1=$(date +%s)
  if ! "$bin/quantize" --checkpoint "$run" --calibrate "$calibrate" --method "$method" --evaluate \
      --device "$device" > "$out/quantize_$net.log" 2>&1; then
    echo "quant_accuracy: quantizing $net failed (see $out/quantize_$net.log)" >&2
    status=1
    continue
  fi
  # "test accuracy: fp32 X%, int8 Y% (+Z points) on N images (cuda)"
  line=$(grep -E '^test accuracy: fp32' "$out/quantize_$net.log" | tail -1)
  fp32=$(sed -E 's/.*fp32 ([0-9.]+)%.*/\1/' <<< "$line")
  int8=$(sed -E 's/.*int8 ([0-9.]+)%.*/\1/' <<< "$line")
  delta=$(sed -E 's/.*\(([-+][0-9.]+) points\).*/\1/' <<< "$line")
  shown_epochs="${epochs:-$(grep -E '^\s*epochs:' "$config" | head -1 | sed -E 's/[^0-9]*([0-9]+).*/\1/')}"
  echo "| \`$config\` | ${shown_epochs:-?} | $fp32% | $int8% | $delta |" >> "$table"
  echo "$net: $line (training $((t1 - t0)) s)"
done
cat "$table"
exit $status
