#!/usr/bin/env python3
"""Side-by-side speed of Hearth and an anchor on the same GGUF files.

    python3 scripts/bench.py cpu      # `make bench`: hearth vs llama.cpp's llama-bench
    python3 scripts/bench.py webgpu   # `make bench-webgpu`: hearth --backend webgpu vs hearth's CPU path
    python3 scripts/bench.py wasm     # `make bench-wasm`: hearth's wasm SIMD128 build in Node vs native

Models: the Llama-3.2-1B-shaped synthetic models (written once with `hearth synth`
into .cache/bench/) and the two real test models (.cache/models, `make setup`).
For each model, each test (pp512, tg128) and each thread count (1, 2), the
subject and the anchor run one after the other, alternating which goes first,
so the noise of this shared machine falls on both alike. Prints a table with
the ratios, then ONE JSON line:

    {"bench": "cpu", "rows": [{"model", "test", "threads", "hearth_tps",
                               "anchor", "anchor_tps", "ratio"}, ...]}

`wasm` runs examples/decode_speed (the model read into memory, greedy decode
from a short prompt, one thread) as wasm32-wasip1 in Node and natively, decode
only (tgN), and takes the mean of the repeats after the first (the first
warms up: V8 may still be compiling, pages are still faulting in).

Environment:
    BENCH_QUICK=1     smoke test: -p 64 -n 16, 1 repetition, two models
    BENCH_REPS=N      repetitions per test (default 3; quick: 1)
    BENCH_P, BENCH_N  prompt and decode lengths (default 512 and 128; 0 skips that test)
    BENCH_THREADS     thread counts, comma separated (default 1,2)
    BENCH_MODELS      only the models whose names contain one of these, comma separated
    BENCH_SYNTH_TYPES the synthetic models' types, comma separated (default
                      Q4_0,Q8_0,Q4_K_M,Q6_K,IQ4_XS; any `hearth synth --type`, e.g. Q3_K_M)

Each row is also appended to .cache/bench/rows-BENCH-TIME.jsonl as it is measured.
    LLAMA_BENCH       path of llama-bench (default: built by scripts/build-llamacpp.sh)
    --against HEARTH  (cpu) another hearth build as the anchor, e.g. the build before a change
    BENCH_LLAMA_FLAGS more llama-bench flags, e.g. "--poll 0" (its threads then sleep
                      instead of spinning while they wait, which a busy machine punishes)

Python 3 standard library only. The parsing and table code is unit-tested by
scripts/test_bench.py on canned output.
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SYNTH_SHAPE = "llama-3.2-1b"
SYNTH_TYPES = ["Q4_0", "Q8_0", "Q4_K_M", "Q6_K", "IQ4_XS"]
REAL_MODELS = ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"]
# llama.cpp's CPU repack path (weights of some types, Q4_0, Q4_K and IQ4_NL
# among them, re-laid at load for its AVX2/AVX-512 GEMM; 1.5x its Q4_0
# prefill on an Ice Lake Xeon) is its default and is kept. It died of SIGILL
# on an earlier host, on the types it repacks: a llama-bench run that fails
# is run again with `--repack 0`, which the rest of the bench then keeps.
REPACK_OFF = ["--repack", "0"]


class BenchError(Exception):
    """A failure the user can act on; the message says how."""


# ---------------------------------------------------------------- parsing


def test_name(n_prompt, n_gen):
    """llama-bench's test name of one result: pp512, tg128 (pp512+tg128 for both)."""
    if n_prompt and n_gen:
        return f"pp{n_prompt}+tg{n_gen}"
    return f"pp{n_prompt}" if n_prompt else f"tg{n_gen}"


def parse_llama_bench(text):
    """llama-bench `-o json` output -> [{test, threads, tps, tps_stddev}]."""
    try:
        results = json.loads(text)
    except json.JSONDecodeError as e:
        raise BenchError(f"llama-bench printed no JSON ({e}); run it by hand to see why") from e
    if not isinstance(results, list):
        raise BenchError("llama-bench's JSON is not a list of results")
    rows = []
    for r in results:
        try:
            rows.append({
                "test": test_name(int(r["n_prompt"]), int(r["n_gen"])),
                "threads": int(r["n_threads"]),
                "tps": float(r["avg_ts"]),
                "tps_stddev": float(r["stddev_ts"]),
            })
        except (KeyError, TypeError, ValueError) as e:
            raise BenchError(f"llama-bench result without {e}: {r!r:.200}") from e
    return rows


def parse_hearth(text):
    """`hearth bench --json` output (one object per line) -> its test rows (no membw)."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            raise BenchError(f"hearth bench printed a line that is not JSON: {line[:200]}") from e
        if r.get("test") == "membw":
            continue
        for key in ("model", "test", "threads", "tps"):
            if key not in r:
                raise BenchError(f"hearth bench row without {key!r}: {line[:200]}")
        rows.append(r)
    return rows


def parse_membw(text):
    """`hearth bench --membw --json` output -> {threads: best GB/s}."""
    out = {}
    for line in text.splitlines():
        if line.strip():
            r = json.loads(line)
            if r.get("test") == "membw":
                # The best repetition: the ceiling, least hurt by a busy machine.
                out[int(r["threads"])] = float(r.get("gbps_best", r["gbps"]))
    return out


def find(rows, test, threads):
    """The one row of `rows` for `test` at `threads`."""
    hits = [r for r in rows if r["test"] == test and int(r["threads"]) == threads]
    if len(hits) != 1:
        raise BenchError(f"expected one {test} result at {threads} threads, got {len(hits)}")
    return hits[0]


def ratio(subject, anchor):
    """subject / anchor, rounded to 3 places (None when the anchor measured 0)."""
    return round(subject / anchor, 3) if anchor > 0 else None


def make_row(model, test, threads, hearth, anchor_name, anchor):
    """One row of the result: `hearth` and `anchor` are parsed result rows."""
    return {
        "model": model,
        "test": test,
        "threads": threads,
        "hearth_tps": round(float(hearth["tps"]), 3),
        "anchor": anchor_name,
        "anchor_tps": round(float(anchor["tps"]), 3),
        "ratio": ratio(float(hearth["tps"]), float(anchor["tps"])),
        "hearth_tps_stddev": round(float(hearth.get("tps_stddev", 0.0)), 3),
        "anchor_tps_stddev": round(float(anchor.get("tps_stddev", 0.0)), 3),
        "hearth_gbps": hearth.get("gbps") and round(float(hearth["gbps"]), 3),
    }


# The keys of a row in the JSON line; the others only feed the table.
ROW_KEYS = ("model", "test", "threads", "hearth_tps", "anchor", "anchor_tps", "ratio")


def summary_json(bench, rows):
    """The one JSON line: {"bench": ..., "rows": [...]} with ROW_KEYS only."""
    return json.dumps({"bench": bench, "rows": [{k: r[k] for k in ROW_KEYS} for r in rows]})


def geomean(xs):
    xs = [x for x in xs if x]
    return statistics.geometric_mean(xs) if xs else None


def anchor_gbps(row):
    """The anchor's effective GB/s in a decode row: it reads the same weights
    per token as Hearth does, so Hearth's GB/s scaled by the speed ratio."""
    if not row.get("hearth_gbps") or not row["hearth_tps"]:
        return None
    return row["hearth_gbps"] * row["anchor_tps"] / row["hearth_tps"]


def bandwidth_ceilings(rows, membw):
    """{threads: GB/s}: the most any decode read at that thread count, the
    bandwidth test's figure or a model's (either engine's), whichever is
    higher. Decode cannot read faster than memory delivers, so no ratio to
    the anchor can pass this over the anchor's GB/s."""
    ceilings = dict(membw)
    for r in rows:
        for gbps in (r.get("hearth_gbps"), anchor_gbps(r)):
            if gbps:
                ceilings[r["threads"]] = max(ceilings.get(r["threads"], 0.0), gbps)
    return ceilings


def max_ratio(row, ceilings):
    """The highest ratio to the anchor that memory bandwidth allows in a
    decode row ([`bandwidth_ceilings`]), None where it cannot be told."""
    a = anchor_gbps(row)
    bw = ceilings.get(row["threads"])
    return bw / a if a and bw else None


def format_table(bench, rows, membw=None):
    """A readable table of `rows`, then geometric means of the ratios per
    test kind. Decode rows show Hearth's effective GB/s against the
    measured read bandwidth, and the highest ratio that bandwidth allows
    ("max": a target above it cannot be met on this machine)."""
    membw = membw or {}
    ceilings = bandwidth_ceilings(rows, membw)
    anchor = rows[0]["anchor"] if rows else "anchor"
    width = max([len("model")] + [len(r["model"]) for r in rows])
    head = f"| {'model':<{width}} | test  | thr | {'hearth t/s':>16} | {anchor + ' t/s':>16} | ratio |  max | hearth GB/s"
    lines = [head, "|" + "-" * (len(head) - 1)]
    for r in rows:
        gbps = ""
        if r.get("hearth_gbps"):
            gbps = f"{r['hearth_gbps']:.2f}"
            bw = membw.get(r["threads"])
            if bw:
                gbps += f" ({100 * r['hearth_gbps'] / bw:.0f}% of {bw:.1f})"
        h = f"{r['hearth_tps']:.2f} ± {r.get('hearth_tps_stddev', 0):.2f}"
        a = f"{r['anchor_tps']:.2f} ± {r.get('anchor_tps_stddev', 0):.2f}"
        q = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        m = max_ratio(r, ceilings)
        m = f"{m:.2f}" if m else ""
        lines.append(
            f"| {r['model']:<{width}} | {r['test']:<5} | {r['threads']:>3} | {h:>16} | {a:>16} | {q:>5} | {m:>4} | {gbps}"
        )
    for kind in ("pp", "tg"):
        for t in sorted({r["threads"] for r in rows}):
            g = geomean([r["ratio"] for r in rows if r["test"].startswith(kind) and r["threads"] == t])
            if g:
                lines.append(f"geometric mean ratio, {kind} at {t} thread{'s' if t > 1 else ''}: {g:.2f}")
    if membw:
        bws = ", ".join(f"{bw:.1f} GB/s at {t} thread{'s' if t > 1 else ''}" for t, bw in sorted(membw.items()))
        lines.append(f"memory read bandwidth (hearth bench --membw): {bws}")
    return "\n".join(lines)


# ---------------------------------------------------------------- running


# Where each row is appended as it is measured, so a run cut short keeps them.
PARTIAL = None


def keep(row):
    if PARTIAL is not None:
        with open(PARTIAL, "a") as f:
            f.write(json.dumps(row) + "\n")


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# What the measured programs are built from.
SOURCES = ("src", "native/cli/src", "examples", "Cargo.toml", "native/cli/Cargo.toml")


def stale(program, root=ROOT):
    """The newest source file changed after `program` was built, or None.

    `cargo build --release` at the top builds the core crate only, not the
    CLI: a bench run straight after it would time the old `hearth`."""
    built = program.stat().st_mtime
    files = []
    for name in SOURCES:
        top = Path(root) / name
        files += [top] if top.is_file() else list(top.rglob("*.rs"))
    newer = [(f.stat().st_mtime, f) for f in files if f.stat().st_mtime > built]
    return max(newer)[1] if newer else None


def warn_if_stale(program):
    newer = stale(program)
    if newer is not None:
        log(f"warning: {program} is older than {newer.relative_to(ROOT)}: it may not measure the "
            f"sources; `make bench` / `make bench-wasm` rebuild it "
            f"(`cargo build --release -p hearth-cli` for the CLI)")


def run(cmd):
    """Runs `cmd`, returns its stdout; its stderr passes through only on failure."""
    log(" ".join(str(c) for c in cmd))
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-4000:])
        raise BenchError(f"{Path(str(cmd[0])).name} exited with status {p.returncode}: {' '.join(map(str, cmd))}")
    return p.stdout


def config():
    quick = os.environ.get("BENCH_QUICK", "") not in ("", "0")
    threads = [int(t) for t in os.environ.get("BENCH_THREADS", "1,2").split(",") if t.strip()]
    return {
        "quick": quick,
        "reps": int(os.environ.get("BENCH_REPS", "1" if quick else "3")),
        "p": int(os.environ.get("BENCH_P", "64" if quick else "512")),
        "n": int(os.environ.get("BENCH_N", "16" if quick else "128")),
        "threads": threads,
        "only": [m for m in os.environ.get("BENCH_MODELS", "").split(",") if m.strip()],
        "synth": [t.strip() for t in os.environ.get("BENCH_SYNTH_TYPES", "").split(",") if t.strip()]
        or SYNTH_TYPES,
    }


def models(hearth, cfg, models_dir, bench_dir):
    """The model files, writing the synthetic ones that are missing."""
    types = ["Q4_0"] if cfg["quick"] else cfg["synth"]
    real = REAL_MODELS[:1] if cfg["quick"] else REAL_MODELS
    # The small real models first: a run cut short has them.
    out = [models_dir / name for name in real]
    for path in out:
        if not path.exists():
            raise BenchError(f"{path} is missing; run `make setup` first")
    out += [bench_dir / f"{SYNTH_SHAPE}-{t}.gguf" for t in types]
    if cfg["only"]:
        out = [m for m in out if any(o in m.name for o in cfg["only"])]
        if not out:
            raise BenchError(f"BENCH_MODELS={','.join(cfg['only'])} matches no model")
    bench_dir.mkdir(parents=True, exist_ok=True)
    for path in out:
        if not path.exists():
            t = path.name[len(SYNTH_SHAPE) + 1:-len(".gguf")]
            run([hearth, "synth", "--shape", SYNTH_SHAPE, "--type", t, path])
    return out


def llama_bench_path():
    if os.environ.get("LLAMA_BENCH"):
        return Path(os.environ["LLAMA_BENCH"])
    out = run(["bash", ROOT / "scripts" / "build-llamacpp.sh"])
    for line in out.splitlines():
        if line.startswith("BIN="):
            return Path(line[4:]) / "llama-bench"
    raise BenchError("scripts/build-llamacpp.sh printed no BIN= line")


def name_of(path):
    return path.name[:-5] if path.name.endswith(".gguf") else path.name


def measure_pair(subject, anchor, flip):
    """Runs the two measurements, `anchor` first when `flip`; returns (subject, anchor)."""
    if flip:
        a = anchor()
        return subject(), a
    s = subject()
    return s, anchor()


def tests(cfg):
    """The (name, (prompt, decode)) tests to run: pp and tg, without one set to 0."""
    both = ((f"pp{cfg['p']}", (cfg["p"], 0)), (f"tg{cfg['n']}", (0, cfg["n"])))
    return [(name, pn) for name, pn in both if max(pn) > 0]


def bench_cpu(hearth, cfg, model_paths, against=None):
    if against is not None:
        return bench_builds(hearth, against, cfg, model_paths)
    llama = llama_bench_path()
    llama_flags = shlex.split(os.environ.get("BENCH_LLAMA_FLAGS", ""))

    def anchor(common):
        cmd = [llama, *common, "-o", "json"]
        try:
            return parse_llama_bench(run([*cmd, *llama_flags]))
        except BenchError as e:
            if "--repack" in llama_flags:
                raise
            log(f"{e}; once more with {' '.join(REPACK_OFF)}, kept from here on")
            llama_flags.extend(REPACK_OFF)
            return parse_llama_bench(run([*cmd, *llama_flags]))

    rows, k = [], 0
    for path in model_paths:
        for test, (p, n) in tests(cfg):
            for t in cfg["threads"]:
                common = ["-m", path, "-p", p, "-n", n, "-t", t, "-r", cfg["reps"]]
                h, a = measure_pair(
                    lambda: find(parse_hearth(run([hearth, "bench", *common, "--json"])), test, t),
                    lambda: find(anchor(common), test, t),
                    flip=k % 2 == 1,
                )
                k += 1
                rows.append(make_row(name_of(path), test, t, h, "llama.cpp", a))
                keep(rows[-1])
                log(f"{name_of(path)} {test} t={t}: hearth {h['tps']:.2f}, llama.cpp {a['tps']:.2f} tok/s")
    return rows


def bench_builds(hearth, other, cfg, model_paths):
    """`hearth` against another build of it (`--against`), same files and
    settings, alternating: what a change did to speed."""
    return bench_hearth_pair(cfg, model_paths, [hearth], [other], "baseline")


def bench_webgpu(hearth, cfg, model_paths):
    return bench_hearth_pair(
        cfg, model_paths, [hearth, "--backend", "webgpu"], [hearth, "--backend", "cpu"], "hearth-cpu"
    )


def bench_hearth_pair(cfg, model_paths, subject, anchor, anchor_name):
    """Two `hearth bench` commands side by side, alternating which runs
    first: `subject` and `anchor` are a hearth binary and the flags that
    follow `bench`'s own."""
    rows, k = [], 0
    for path in model_paths:
        for test, (p, n) in tests(cfg):
            for t in cfg["threads"]:
                common = ["-m", path, "-p", p, "-n", n, "-t", t, "-r", cfg["reps"], "--json"]
                bench = lambda cmd: find(parse_hearth(run([cmd[0], "bench", *common, *cmd[1:]])), test, t)
                h, a = measure_pair(lambda: bench(subject), lambda: bench(anchor), flip=k % 2 == 1)
                k += 1
                rows.append(make_row(name_of(path), test, t, h, anchor_name, a))
                keep(rows[-1])
                log(f"{name_of(path)} {test} t={t}: hearth {h['tps']:.2f}, {anchor_name} {a['tps']:.2f} tok/s")
    return rows


def parse_decode_speed(text):
    """examples/decode_speed output (one JSON object per repeat) -> a result
    row: the mean and stddev of decode tokens/s over the repeats after the
    first (all of them if there is only one)."""
    tps = []
    for line in text.splitlines():
        if line.strip():
            try:
                tps.append(float(json.loads(line)["decode_tps"]))
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                raise BenchError(f"decode_speed printed a line without decode_tps ({e}): {line[:200]}") from e
    if not tps:
        raise BenchError("decode_speed printed no result")
    steady = tps[1:] or tps
    sd = statistics.stdev(steady) if len(steady) > 1 else 0.0
    return {"tps": statistics.mean(steady), "tps_stddev": sd}


WASM_PROGRAM = ROOT / "target" / "wasm32-wasip1" / "release" / "examples" / "decode_speed.wasm"
NATIVE_PROGRAM = ROOT / "target" / "release" / "examples" / "decode_speed"
# As .cargo/config.toml's wasm runner, and the whole module optimized up
# front: V8's collector on the main thread and not incremental (its marking
# crashed inside memory.grow).
NODE_FLAGS = ["--no-warnings", "--no-wasm-dynamic-tiering", "--single-threaded-gc", "--no-incremental-marking"]
PROMPT = "The capital of France is"


def bench_wasm(cfg, model_paths):
    for path in (WASM_PROGRAM, NATIVE_PROGRAM):
        if not path.exists():
            raise BenchError(f"{path} is missing; `make bench-wasm` builds it")
        warn_if_stale(path)
    node = os.environ.get("BENCH_NODE", "node")
    reps = max(cfg["reps"], 1) + 1
    rows, k, n = [], 0, cfg["n"]
    def wasm(args):
        cmd = [node, *NODE_FLAGS, ROOT / "scripts" / "wasi-run.mjs", WASM_PROGRAM, *args]
        try:
            return parse_decode_speed(run(cmd))
        except BenchError as e:
            # In case V8 dies of another crash of its own; one retry tells
            # that from a bug.
            log(f"{e}; once more")
            return parse_decode_speed(run(cmd))

    for path in model_paths:
        args = [path.resolve(), PROMPT, n, reps]
        w, c = measure_pair(
            lambda: wasm(args),
            lambda: parse_decode_speed(run([NATIVE_PROGRAM, *args])),
            flip=k % 2 == 1,
        )
        k += 1
        rows.append(make_row(name_of(path), f"tg{n}", 1, w, "hearth-native", c))
        keep(rows[-1])
        log(f"{name_of(path)} tg{n}: wasm {w['tps']:.2f}, native {c['tps']:.2f} tok/s")
    return rows


def check_backend(hearth, backend):
    """Fails early, saying why, when this hearth build lacks `backend`."""
    p = subprocess.run([str(hearth), "bench", "--backend", backend, "--membw", "--membw-mib", "1",
                        "-r", "1", "-t", "1", "--json"], capture_output=True, text=True)
    if p.returncode != 0:
        raise BenchError(f"hearth cannot run --backend {backend}: {p.stderr.strip()}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench", choices=["cpu", "webgpu", "wasm"])
    ap.add_argument("--hearth", default=ROOT / "target" / "release" / "hearth", type=Path)
    ap.add_argument("--models-dir", default=Path(os.environ.get("HEARTH_MODELS", ROOT / ".cache" / "models")), type=Path)
    ap.add_argument("--bench-dir", default=ROOT / ".cache" / "bench", type=Path)
    ap.add_argument("--against", type=Path, metavar="HEARTH",
                    help="cpu: another hearth build as the anchor instead of llama-bench (old against new)")
    args = ap.parse_args(argv)
    cfg = config()
    global PARTIAL
    args.bench_dir.mkdir(parents=True, exist_ok=True)
    PARTIAL = args.bench_dir / f"rows-{args.bench}-{time.strftime('%Y%m%dT%H%M%S')}.jsonl"
    try:
        if args.against is not None and args.bench != "cpu":
            raise BenchError("--against compares CPU builds: use it with `cpu`")
        for build in (args.hearth, args.against):
            if build is not None and not build.exists():
                raise BenchError(f"{build} is missing; build it with `cargo build --release -p hearth-cli`")
        warn_if_stale(args.hearth)
        if args.bench == "webgpu":
            check_backend(args.hearth, "webgpu")
        paths = models(args.hearth, cfg, args.models_dir, args.bench_dir)
        threads = "1" if args.bench == "wasm" else ",".join(map(str, cfg["threads"]))
        membw = parse_membw(run([args.hearth, "bench", "--membw", "-t", threads, "-r", "3", "--json"]))
        log("memory read bandwidth: " + ", ".join(f"{bw:.1f} GB/s at {t} threads" for t, bw in sorted(membw.items())))
        if args.bench == "wasm":
            rows = bench_wasm(cfg, paths)
        elif args.bench == "cpu":
            rows = bench_cpu(args.hearth, cfg, paths, args.against)
        else:
            rows = bench_webgpu(args.hearth, cfg, paths)
    except BenchError as e:
        print(f"bench: error: {e}", file=sys.stderr)
        return 1
    print(format_table(args.bench, rows, membw))
    print(summary_json(args.bench, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
