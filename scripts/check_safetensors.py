#!/usr/bin/env python3
"""Open a safetensors file with the reference implementation and summarize it.

Proves that a checkpoint written by our C++ writer is readable by the Hugging Face `safetensors`
package (and therefore by PyTorch/NumPy). Per tensor it prints the name, dtype, shape, the float64
sum of the values and the CRC-32 of the raw little-endian bytes, so a caller can compare them with
what it wrote, bit for bit.

Usage:
  python3 scripts/check_safetensors.py FILE          # one line per tensor, then the metadata
  python3 scripts/check_safetensors.py --json FILE   # the same as one JSON object (for tests)

Exit status: 0 when the file loads, 1 when it does not, 2 when numpy/safetensors are missing.
"""
import argparse
import json
import sys
import zlib


def summarize(path):
    import numpy as np
    from safetensors import safe_open
    from safetensors.numpy import load_file

    tensors = load_file(path)
    with safe_open(path, framework="numpy") as f:
        metadata = f.metadata() or {}
    summary = {"tensors": {}, "metadata": dict(metadata)}
    for name in sorted(tensors):
        a = tensors[name]
        # Little-endian bytes whatever the host, as the file stores them.
        raw = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        summary["tensors"][name] = {
            "dtype": str(a.dtype),
            "shape": list(a.shape),
            "sum": float(a.astype(np.float64).sum()) if a.dtype.kind in "fiub" else None,
            "crc32": zlib.crc32(raw) & 0xFFFFFFFF,
            "nbytes": len(raw),
        }
    return summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", help="the .safetensors file to open")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    try:
        import numpy  # noqa: F401
        import safetensors.numpy  # noqa: F401
    except ImportError as e:
        print(f"check_safetensors: {e} (pip install numpy safetensors)", file=sys.stderr)
        return 2
    try:
        summary = summarize(args.file)
    except Exception as e:  # the reference reader's own message is the useful part
        print(f"check_safetensors: cannot load {args.file}: {type(e).__name__}: {e}",
              file=sys.stderr)
        return 1

    if args.json:
        print(json.dumps(summary, sort_keys=True))
        return 0
    for name, t in summary["tensors"].items():
        shape = "x".join(str(d) for d in t["shape"]) or "scalar"
        print(f"{name}\t{t['dtype']}\t{shape}\tsum={t['sum']!r}\tcrc32={t['crc32']:08x}")
    for key, value in sorted(summary["metadata"].items()):
        print(f"metadata\t{key}\t{value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
