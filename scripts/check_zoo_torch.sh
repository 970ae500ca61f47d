#!/usr/bin/env bash
# Does a checkpoint of each zoo net load into PyTorch and score the same test accuracy? For each
# zoo config whose data is here: a short training run (one epoch) into RUNS_DIR/<net>, then
# scripts/torch_baseline.py --checkpoint RUNS_DIR/<net>/best.safetensors builds the torch module
# from the checkpoint's own config, loads every tensor (BatchNorm buffers with the int64
# num_batches_tracked, grouped convs, residual blocks' names), evaluates in eval mode (dropout
# off, BatchNorm on running statistics) and must match our accuracy from RUNS_DIR/<net>/run.json
# (our evaluation without test-time flipping, validation split 0: the test set, as torch scores it).
#
# Usage: scripts/check_zoo_torch.sh RUNS_DIR [NET...]
#   NET: default resnet_fashion mobilenet_fashion vgg_cifar; a net whose dataset folder is missing
#   (vgg_cifar needs datasets/cifar10/{train,test} class folders) is skipped with a line.
#   EPOCHS (1), TOLERANCE (0.05 points: 5 of 10,000 images) and DEVICE (auto): environment.
# Prints PASS/FAIL/SKIP per net; exits 1 on any FAIL, 2 when torch is not importable.
# Expected on an H200: ~10-20 s per Fashion-MNIST net (start-up, one epoch, evaluation, torch).
set -uo pipefail
cd "$(dirname "$0")/.."
runs="${1:?usage: scripts/check_zoo_torch.sh RUNS_DIR [NET...]}"
shift
nets=("$@")
[ ${#nets[@]} -gt 0 ] || nets=(resnet_fashion mobilenet_fashion vgg_cifar)
mkdir -p "$runs"

train=""
for b in .device_bin/train build/bin/train ./train; do
  [ -x "$b" ] && { train="$b"; break; }
done
[ -n "$train" ] || { echo "check_zoo_torch: no train binary (.device_bin/train, build/bin/train or ./train)" >&2; exit 2; }
why=$(python3 -c 'import torch' 2>&1) \
  || { echo "check_zoo_torch: PyTorch is not importable ($(echo "$why" | tail -1)); nothing checked"; exit 2; }

# The folder a config's test set is read from: data.dir (idx) or data.test (image folders).
data_path() {
  python3 - "$1" <<'PY'
import sys, yaml
d = (yaml.safe_load(open(sys.argv[1])) or {}).get("data") or {}
print(d.get("test") if d.get("format") == "folder" else d.get("dir", ""))
PY
}

failed=0
for net in "${nets[@]}"; do
  cfg="configs/$net.yaml"
  [ -f "$cfg" ] || { echo "$net: FAIL ($cfg not found)"; failed=1; continue; }
  data=$(data_path "$cfg") || { echo "$net: FAIL (cannot read $cfg)"; failed=1; continue; }
  if [ -z "$data" ] || [ ! -d "$data" ]; then
    echo "$net: SKIP (no dataset at '${data}'; the config's data section names it)"
    continue
  fi
  dir="$runs/$net"
  if ! "$train" --config "$cfg" --device "${DEVICE:-auto}" --set "training.epochs=${EPOCHS:-1}" \
      --set data.validation_split=0 --set training.eval_flip=false \
      --set logging.progress=off --log-dir "$dir" --overwrite > "$runs/$net.train.log" 2>&1; then
    echo "$net: FAIL (training exited non-zero: $(tail -1 "$runs/$net.train.log"))"
    failed=1
    continue
  fi
  ours=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["best_accuracy"])' \
    "$dir/run.json" 2>/dev/null)
  if [ -z "$ours" ] || [ ! -f "$dir/best.safetensors" ]; then
    echo "$net: FAIL (no run.json best_accuracy or best.safetensors in $dir)"
    failed=1
    continue
  fi
  if python3 scripts/torch_baseline.py --checkpoint "$dir/best.safetensors" \
      --expect-accuracy "$ours" --tolerance "${TOLERANCE:-0.05}" > "$runs/$net.torch.log" 2>&1; then
    echo "$net: PASS (ours $(printf '%.2f' "$ours")%; $(grep -o 'torch test accuracy [0-9.]*%' "$runs/$net.torch.log"))"
  else
    echo "$net: FAIL (ours $(printf '%.2f' "$ours")%; $(tail -2 "$runs/$net.torch.log" | tr '\n' ' '))"
    failed=1
  fi
done
exit $failed
