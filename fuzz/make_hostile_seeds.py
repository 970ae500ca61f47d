#!/usr/bin/env python3
"""Writes the hostile-input seeds of issue 19 into fuzz/corpus/<target>/hostile-*: one file per
input class that once crashed, hung, ran away or passed silently, so that every fuzz run
(scripts/fuzz.sh) replays it first. Each is small; the large cases are described by their
headers (the loaders must refuse them from the header). Run from the repository root:
    python3 fuzz/make_hostile_seeds.py
"""
import gzip
import os
import struct
import zlib

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def save(target, name, data):
    os.makedirs(os.path.join(ROOT, target), exist_ok=True)
    with open(os.path.join(ROOT, target, "hostile-" + name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(w, h, idat=None):
    raw = b"".join(b"\0" + bytes((x * 7 + y * 13) & 255 for x in range(w)) for y in range(h))
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) +
            chunk(b"IDAT", idat if idat is not None else zlib.compress(raw)) + chunk(b"IEND", b""))


def safetensors(header):
    header = header + b" " * ((8 - len(header) % 8) % 8)
    return struct.pack("<Q", len(header)) + header


# 1. safetensors: 1,000 nested arrays (the 70,000 of the issue crashed; depth is refused alike),
# and a wrong shape whose value would echo 120 brackets.
save("safetensors", "deep-nesting.safetensors", safetensors(b"[" * 1000 + b"]" * 1000))
save("safetensors", "deep-shape.safetensors",
     safetensors(b'{"w": {"dtype": "F32", "shape": ' + b"[" * 60 + b"]" * 60 +
                 b', "data_offsets": [0, 0]}}'))
# 3 and 4. IDX: a wrong magic before (what would be) gigabytes; a gzip whose header announces
# 1 x 65535 x 65535; a raw header announcing 784 bytes followed by more.
save("idx", "wrong-magic", struct.pack(">I", 0x12345678) + bytes(60))
save("idx", "bomb-header.gz",
     gzip.compress(struct.pack(">IIII", 0x803, 1, 65535, 65535) + bytes(4096), mtime=0))
save("idx", "tail-after-data", struct.pack(">IIII", 0x803, 1, 28, 28) + bytes(784 + 100))
# 7. PNG: a chunk CRC flipped; an Adler-32 flipped with the chunk CRC re-sealed.
good = png(4, 4)
bad_crc = bytearray(good)
bad_crc[8 + 8 + 13] ^= 1
save("image", "bad-crc.png", bytes(bad_crc))
z = bytearray(zlib.compress(b"".join(b"\0" + bytes((x * 7 + y * 13) & 255 for x in range(4))
                                     for y in range(4))))
z[-1] ^= 0x55
save("image", "bad-adler.png", png(4, 4, bytes(z)))
# 5 and 2. list files: a label of 99999999 (10^8 class names), a class name that is not UTF-8,
# a row naming a FIFO-like missing file and a quoted path.
save("list", "huge-label.csv", "a.png,99999999\n")
save("list", "names.csv", b"path,label\na.png,cat\nb.png,dog\n\"a.png\",cat\n")
save("list", "not-utf8.csv", b"a.png,cat\nb.png,d\xff\xfeg\n")
save("list", "indices.csv", "# comment\na.png,0\nb.png,2\n")
# 6. config: a long unknown key (the 48 MB one took 33 s) and a repeated class name.
save("config", "long-key.yaml", "name: k\n" + "k" * 3000 + ": 1\n")
save("config", "dup-classes.yaml",
     "name: d\nmodel:\n  input: {channels: 1, height: 4, width: 4}\n  layers:\n"
     "    - flatten\n    - linear: {out_features: 3}\n    - softmax_cross_entropy\n"
     "data: {format: synthetic, classes: [a, b, a], synthetic: {classes: 3}}\n")
save("config", "not-utf8-class.yaml",
     b"name: u\nmodel:\n  input: {channels: 1, height: 4, width: 4}\n  layers:\n"
     b"    - flatten\n    - linear: {out_features: 2}\n    - softmax_cross_entropy\n"
     b"data: {format: synthetic, classes: [\"a\", \"b\xff\xfe\"], synthetic: {classes: 2}}\n")
# 2 and 3. folder trees (see fuzz_folder.cpp for the language): a class folder named with
# 0xFF 0xFE, a FIFO named .png, /dev/zero linked in, a link loop, a link to a sibling.
save("folder", "plain", "da\ndb\nfa/1.png\nfb/2.png\n")
save("folder", "not-utf8", b"fgood/1.png\nfbad\xff\xfe/2.png\n")
save("folder", "fifo", "fa/ok.png\nfb/ok.png\npa/fifo.png\n")
save("folder", "dev-zero", "fa/ok.png\nfb/ok.png\nzb/zero.png\nga/junk.png\n")
save("folder", "links", "fa/ok.png\nLloop\nlb/x.png|../a/ok.png\nlb/y.png|y.png\nfb/ok.png\n")


# 8. checkpoints from the seed checkpoint: a NaN weight, global_step INT64_MAX, epoch -1.
def seed_checkpoint():
    with open(os.path.join(ROOT, "safetensors", "seed.safetensors"), "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    import json
    return json.loads(data[8:8 + n]), data[8 + n:]


def rewrite(header, body):
    import json
    return safetensors(json.dumps(header, separators=(",", ":")).encode()) + body


header, body = seed_checkpoint()
save("safetensors", "nan-weight.safetensors",
     rewrite(header, struct.pack("<f", float("nan")) + body[4:]))
for key, value in (("global_step", "9223372036854775807"), ("epoch", "-1")):
    h = dict(header)
    h["__metadata__"] = dict(header["__metadata__"], **{key: value})
    save("safetensors", key + "-out-of-range.safetensors", rewrite(h, body))
