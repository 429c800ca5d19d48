#!/usr/bin/env python3
"""The side-by-side table of scripts/cuda-bench.sh `against`.

    python3 scripts/cuda-report.py TYPE DIR

reads DIR/bench.txt (hearth bench rows), DIR/llamacpp.txt (llama-bench
rows), DIR/batched.txt (llama-batched-bench rows) and DIR/bandwidth.txt
(the card's read bandwidth), and prints a markdown table of both engines'
rounds, their ratio (mean over mean), Hearth's effective GB/s against the
card's, then one JSON line {"bench": "cuda", ...}.
"""
import json
import re
import sys
from pathlib import Path


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def rate(cell):
    return float(cell.split("±")[0])


def main():
    ty, out = sys.argv[1], Path(sys.argv[2])
    read = lambda name: (out / name).read_text() if (out / name).exists() else ""
    hearth, gbs, llama = {}, {}, {}
    for line in read("bench.txt").splitlines():
        c = cells(line)
        if len(c) >= 8 and re.fullmatch(r"(pp|tg)\d+(x\d+)?", c[5]):
            hearth.setdefault(c[5], []).append(rate(c[6]))
            if c[7]:
                gbs.setdefault(c[5], []).append(float(c[7]))
    for line in read("llamacpp.txt").splitlines():
        c = cells(line)
        if len(c) >= 3 and re.fullmatch(r"(pp|tg)\d+", c[-2]):
            llama.setdefault(c[-2], []).append(rate(c[-1]))
    for line in read("batched.txt").splitlines():
        c = cells(line)
        if len(c) >= 8 and c[0].isdigit():
            llama.setdefault(f"tg{c[1]}x{c[2]}", []).append(float(c[7]))
    m = re.search(r"read bandwidth: (\d+)", read("bandwidth.txt"))
    bw = float(m.group(1)) if m else None
    mean = lambda v: sum(v) / len(v) if v else None
    rows = []
    print(f"| test ({ty}) | Hearth CUDA | llama.cpp CUDA | ratio | Hearth GB/s | of read bandwidth |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for test in sorted(hearth, key=lambda t: (t[:2], len(t), t)):
        h, l = hearth[test], llama.get(test, [])
        ratio = mean(h) / mean(l) if l else None
        g = mean(gbs.get(test, []))
        share = g / bw if g and bw else None
        fmt = lambda v: " / ".join(f"{x:,.1f}" for x in v) if v else "not measured"
        print(
            f"| {test} | {fmt(h)} | {fmt(l)} | {f'{ratio:.2f}' if ratio else ''} "
            f"| {f'{g:,.0f}' if g else ''} | {f'{share:.0%}' if share else ''} |"
        )
        rows.append({"test": test, "hearth": h, "llamacpp": l, "ratio": ratio, "hearth_gbs": g})
    print(json.dumps({"bench": "cuda", "type": ty, "read_gbs": bw, "rows": rows}))


if __name__ == "__main__":
    main()
