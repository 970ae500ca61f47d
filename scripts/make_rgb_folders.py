#!/usr/bin/env python3
"""Renders Fashion-MNIST (IDX files, raw or gzip) as 32x32 RGB PNG class folders, so that the
VGG net of configs/vgg_cifar.yaml can be trained and measured on RGB image folders where CIFAR-10
cannot be downloaded (configs/vgg_fashion_rgb.yaml). Standard library only.

  scripts/make_rgb_folders.py [--src datasets/fashion-mnist] [--out datasets/fashion-rgb32]
                              [--limit-train N] [--limit-test N] [--tint R,G,B]

Writes OUT/train/<class>/<index>.png (the 60000 training images) and OUT/test/<class>/... (the
10000 test images); <class> is a folder-safe name in label order (t-shirt_top, trouser, ...).
Each 28x28 image is padded by 2 black pixels on every side to 32x32 (the clothes lie on a
black background, so the border adds nothing that could be learned), and its gray value is
copied to R, G and B. --tint multiplies the three channels by fixed factors, the same for every
image and class, so the channels differ without color telling anything about the label. The
result is Fashion-MNIST rendered in RGB, not CIFAR: its accuracy is no CIFAR-10 number.

Prints the per-channel mean and std of the written training images (0..1 scale, padding
included), which is what data.normalize of the config holds.
"""
import argparse
import math
import os
import struct
import sys
import zlib

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_images import read_idx  # noqa: E402

CLASSES = ["t-shirt_top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker",
           "bag", "ankle_boot"]
SIDE, PAD = 32, 2


def png_rgb(w, h, rgb):
    def chunk(kind, body):
        c = kind + body
        return struct.pack(">I", len(body)) + c + struct.pack(">I", zlib.crc32(c) & 0xFFFFFFFF)
    rows = b"".join(b"\x00" + rgb[y * w * 3:(y + 1) * w * 3] for y in range(h))  # filter 0
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows, 6)) + chunk(b"IEND", b""))


def render(gray, h, w, tint):
    """(h, w) gray bytes -> (SIDE, SIDE, 3) RGB bytes, centred on black, channels scaled."""
    luts = [bytes(min(255, int(v * t + 0.5)) for v in range(256)) for t in tint]
    out = bytearray(SIDE * SIDE * 3)
    for y in range(h):
        row = gray[y * w:(y + 1) * w]
        start = ((y + PAD) * SIDE + PAD) * 3
        for ch in range(3):
            out[start + ch:start + w * 3:3] = row.translate(luts[ch])
    return bytes(out)


def write_atomic(path, data):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def export(images, labels, out, limit, tint, stats):
    (n, h, w), pixels = read_idx(images, 3)
    (nl,), labs = read_idx(labels, 1)
    if nl != n:
        sys.exit(f"{labels}: {nl} labels but {images} has {n} images")
    if h + 2 * PAD != SIDE or w + 2 * PAD != SIDE:
        sys.exit(f"{images}: images are {w}x{h}, expected 28x28 (padded to {SIDE}x{SIDE})")
    if max(labs) >= len(CLASSES):
        sys.exit(f"{labels}: label {max(labs)}, expected 0..{len(CLASSES) - 1}")
    for name in CLASSES:
        os.makedirs(os.path.join(out, name), exist_ok=True)
    count = min(n, limit) if limit > 0 else n
    digits = len(str(n - 1))
    for i in range(count):
        rgb = render(pixels[i * h * w:(i + 1) * h * w], h, w, tint)
        if stats is not None:
            for ch in range(3):
                plane = rgb[ch::3]
                stats[ch][0] += sum(plane)
                stats[ch][1] += sum(v * v for v in plane)
            stats[3] += SIDE * SIDE
        write_atomic(os.path.join(out, CLASSES[labs[i]], f"{i:0{digits}d}.png"),
                     png_rgb(SIDE, SIDE, rgb))
    print(f"make_rgb_folders: {count} of {n} images -> {out}/<class>/*.png ({SIDE}x{SIDE} RGB)")


def main():
    ap = argparse.ArgumentParser(description="Fashion-MNIST as 32x32 RGB PNG class folders")
    ap.add_argument("--src", default="datasets/fashion-mnist", help="folder of the IDX files")
    ap.add_argument("--out", default="datasets/fashion-rgb32", help="writes OUT/train, OUT/test")
    ap.add_argument("--limit-train", type=int, default=0, help="only the first N training images")
    ap.add_argument("--limit-test", type=int, default=0, help="only the first N test images")
    ap.add_argument("--tint", default="1,1,1",
                    help="fixed R,G,B factors in 0..1 for every image (default: plain gray)")
    args = ap.parse_args()
    try:
        tint = [float(t) for t in args.tint.split(",")]
    except ValueError:
        tint = []
    if len(tint) != 3 or not all(0 <= t <= 1 for t in tint):
        sys.exit(f"--tint {args.tint!r}: expected three factors in 0..1, e.g. 1,0.8,0.6")

    def idx(stem):
        for name in (stem, stem + ".gz"):
            path = os.path.join(args.src, name)
            if os.path.exists(path):
                return path
        sys.exit(f"{args.src}: no {stem}[.gz] (scripts/get_data.sh fetches Fashion-MNIST)")

    stats = [[0, 0], [0, 0], [0, 0], 0]  # per channel: sum, sum of squares; then pixel count
    export(idx("train-images-idx3-ubyte"), idx("train-labels-idx1-ubyte"),
           os.path.join(args.out, "train"), args.limit_train, tint, stats)
    export(idx("t10k-images-idx3-ubyte"), idx("t10k-labels-idx1-ubyte"),
           os.path.join(args.out, "test"), args.limit_test, tint, None)
    count = stats[3]
    mean = [s / count / 255 for s, _ in stats[:3]]
    std = [math.sqrt(max(0.0, q / count / 255 ** 2 - m * m)) for (_, q), m in zip(stats[:3], mean)]
    print("make_rgb_folders: training images' normalize: {mean: [%s], std: [%s]}"
          % (", ".join(f"{m:.4f}" for m in mean), ", ".join(f"{s:.4f}" for s in std)))


if __name__ == "__main__":
    main()
