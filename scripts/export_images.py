#!/usr/bin/env python3
"""Exports an IDX image set (idx3 uint8 images + idx1 labels, raw or gzip) as image files
OUT/<class>/<index>.png|bmp, for the folder and list data formats. Standard library only.

  scripts/export_images.py IMAGES LABELS OUT [--limit N] [--format png|bmp]
                           [--class-names a,b,...] [--csv OUT/list.csv]

PNG: 8-bit grayscale (zlib + struct). BMP: 8-bit with a gray palette, bottom-up rows padded to
4 bytes. Both decode back to the exact pixel values.
"""
import argparse
import gzip
import os
import struct
import sys
import zlib


def read_idx(path, ndims):
    with open(path, "rb") as f:
        raw = f.read()
    data = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    if len(data) < 4 + 4 * ndims:
        sys.exit(f"{path}: short file ({len(data)} bytes)")
    magic, = struct.unpack(">I", data[:4])
    if magic != 0x800 | ndims:
        sys.exit(f"{path}: wrong magic 0x{magic:08x}, expected 0x{0x800 | ndims:08x}")
    dims = struct.unpack(">" + "I" * ndims, data[4:4 + 4 * ndims])
    size = 1
    for d in dims:
        size *= d
    payload = data[4 + 4 * ndims:]
    if len(payload) != size:
        sys.exit(f"{path}: header says {'x'.join(map(str, dims))} ({size} bytes), "
                 f"file holds {len(payload)}")
    return dims, payload


def png_gray(w, h, pixels):
    def chunk(kind, body):
        c = kind + body
        return struct.pack(">I", len(body)) + c + struct.pack(">I", zlib.crc32(c) & 0xFFFFFFFF)
    rows = b"".join(b"\x00" + pixels[y * w:(y + 1) * w] for y in range(h))  # filter 0 per row
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows, 9)) + chunk(b"IEND", b""))


def bmp_gray(w, h, pixels):
    row = (w + 3) // 4 * 4
    palette = b"".join(bytes((i, i, i, 0)) for i in range(256))
    offset = 14 + 40 + len(palette)
    body = b"".join(pixels[y * w:(y + 1) * w] + b"\x00" * (row - w) for y in range(h - 1, -1, -1))
    header = struct.pack("<2sIHHI", b"BM", offset + len(body), 0, 0, offset)
    info = struct.pack("<IiiHHIIiiII", 40, w, h, 1, 8, 0, len(body), 2835, 2835, 256, 0)
    return header + info + palette + body


def main():
    ap = argparse.ArgumentParser(description="Export IDX images to OUT/<class>/<index>.png|bmp")
    ap.add_argument("images")
    ap.add_argument("labels")
    ap.add_argument("out")
    ap.add_argument("--limit", type=int, default=0, help="export only the first N images")
    ap.add_argument("--format", choices=("png", "bmp"), default="png")
    ap.add_argument("--class-names", default="", help="comma-separated folder names by label")
    ap.add_argument("--csv", default="", help="also write a 'path,label' list file here")
    args = ap.parse_args()

    (n, h, w), pixels = read_idx(args.images, 3)
    (nl,), labels = read_idx(args.labels, 1)
    if nl != n:
        sys.exit(f"{args.labels}: {nl} labels but {args.images} has {n} images")
    names = args.class_names.split(",") if args.class_names else []
    if names and max(labels) >= len(names):
        sys.exit(f"label {max(labels)} has no name in --class-names ({len(names)} given)")
    count = min(n, args.limit) if args.limit > 0 else n
    encode = png_gray if args.format == "png" else bmp_gray
    digits = len(str(n - 1))
    lines = []
    for i in range(count):
        cls = names[labels[i]] if names else str(labels[i])
        folder = os.path.join(args.out, cls)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{i:0{digits}d}.{args.format}")
        with open(path, "wb") as f:
            f.write(encode(w, h, pixels[i * h * w:(i + 1) * h * w]))
        lines.append(f"{path},{labels[i]}")
    if args.csv:
        base = os.path.dirname(os.path.abspath(args.csv))
        with open(args.csv, "w") as f:
            f.write("path,label\n")
            for line in lines:
                p, label = line.rsplit(",", 1)
                f.write(f"{os.path.relpath(os.path.abspath(p), base)},{label}\n")
    print(f"export_images: {count} of {n} {w}x{h} images -> {args.out} ({args.format})")


if __name__ == "__main__":
    main()
