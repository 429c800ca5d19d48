#!/usr/bin/env python3
"""nrmse of each little-endian f32 file after the first against the first
(the reference), over the reference's spread, as the model tests measure it.

    python3 scripts/nrmse.py REF.f32 A.f32 [B.f32 ...]   # one line per file
"""
import math
import struct
import sys


def load(path):
    b = open(path, "rb").read()
    return struct.unpack(f"<{len(b) // 4}f", b)


ref = load(sys.argv[1])
mean = sum(ref) / len(ref)
var = sum((r - mean) ** 2 for r in ref)
for path in sys.argv[2:]:
    x = load(path)
    print(f"{math.sqrt(sum((a - r) ** 2 for a, r in zip(x, ref)) / var):.3e}")
