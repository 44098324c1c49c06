#!/usr/bin/env python3
"""An independent reader of spindle-export's safetensors (run_checks.sh export).

    check_export.py MODEL.safetensors PARAMS.json

Parses the file by the safetensors format alone (the standard library's
struct and json: python3 is a test dependency, NumPy is not) and checks
it against spindle-run --dump-params of the same step: the same tensor
names, shapes, and bit-identical float32 values; dtype F32; contiguous
data offsets in name order, nothing after the last tensor; string
metadata. Exit 0 when all agree, 1 otherwise.
"""
import json
import math
import struct
import sys


def f32_bytes(values):
    """The little-endian float32 bytes of `values` (each rounded to float32)."""
    return struct.pack(f"<{len(values)}f", *values)


def main():
    path, params_path = sys.argv[1], sys.argv[2]
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    meta = header.pop("__metadata__", {})
    ref = json.load(open(params_path))["params"]
    errors = []
    if n % 8:
        errors.append(f"header length {n} is not a multiple of 8")
    if not all(isinstance(v, str) for v in meta.values()):
        errors.append("metadata values must be strings")
    if sorted(header) != sorted(ref):
        errors.append(f"names differ: {sorted(set(header) ^ set(ref))[:5]}")
    end = 0
    for name in sorted(header, key=lambda k: k.encode("utf-8")):
        t = header[name]
        begin, stop = t["data_offsets"]
        if t["dtype"] != "F32" or begin != end:
            errors.append(f"{name}: dtype {t['dtype']}, offsets {begin}..{stop} after {end}")
        end = stop
        if stop - begin != 4 * math.prod(t["shape"]):
            errors.append(f"{name}: {stop - begin} bytes for shape {t['shape']}")
        if name in ref:
            want = ref[name]
            if list(t["shape"]) != list(want["shape"]):
                errors.append(f"{name}: shape {t['shape']} differs from {want['shape']}")
            elif data[begin:stop] != f32_bytes(want["values"]):
                errors.append(f"{name}: the values differ from --dump-params'")
    if end != len(data):
        errors.append(f"{len(data) - end} bytes after the last tensor")
    for e in errors:
        print("FAIL:", e)
    print(f"independent reader: {len(header)} tensors, {end // 4} values, metadata {sorted(meta)}:",
          "AGREE" if not errors else "DIFFER")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
