#!/usr/bin/env python3
"""`make bench-serve`: hearth serve beside llama.cpp's llama-server on the
same model and machine, one after the other, under the same load.

Each server gets the same requests: random prompts of --prompt-tokens token
ids (seeded, the same for both), --output-tokens tokens each (ignore_eos),
streamed from /v1/completions, at each concurrency (closed loop: N clients,
each sending its next request when the last one ends). Per server and
concurrency it prints output tokens/s, time to first token and the time
between tokens (p50 / p99), the ratios hearth / llama-server, and one JSON
line {"bench": "serve", "rows": [...]}.

The load client is this file, on asyncio sockets: aiperf installs from PyPI
but counts tokens with a Hugging Face or tiktoken tokenizer it downloads
from the web, which this machine cannot reach.

    python3 scripts/bench_serve.py --hearth target/release/hearth \
        --llama-server PATH --model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
"""

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
from pathlib import Path

sys.dont_write_bytecode = True
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "native/cli/tests/serve"))
from harness import wait_healthy  # noqa: E402
from rawhttp import request  # noqa: E402


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


class Proc:
    """A server process on `port`, ready when /health answers 200."""

    def __init__(self, cmd, port, log):
        self.port, self.url = port, f"http://127.0.0.1:{port}"
        self.log = open(log, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        if wait_healthy(self.url, self.proc, 300):
            return
        self.stop()
        sys.exit(f"{cmd[0]} did not become ready; see {log}")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


async def one(url, prompt, n_out):
    """(ttft, [gaps between tokens], output tokens) of one streamed request."""
    body = {"prompt": prompt, "max_tokens": n_out, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    r = await request(url, "POST", "/v1/completions", body)
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {(await r.body())[:200]!r}")
    times, usage = [], None
    async for data in r.events():
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if chunk.get("usage"):
            usage = chunk["usage"]
        for c in chunk.get("choices", []):
            if c.get("text"):
                times.append(time.perf_counter())
    r.close()
    if not times:
        raise RuntimeError("no tokens streamed")
    n = (usage or {}).get("completion_tokens") or len(times)
    gaps = [b - a for a, b in zip(times, times[1:])]
    return times[0] - t0, gaps, n


async def load(url, prompts, concurrency, n_out):
    queue = list(prompts)
    ttft, gaps, tokens = [], [], 0

    async def client():
        nonlocal tokens
        while queue:
            p = queue.pop()
            t, g, n = await one(url, p, n_out)
            ttft.append(t)
            gaps.extend(g)
            tokens += n
    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return {"tps": tokens / wall, "ttft_p50": pct(ttft, 50), "ttft_p99": pct(ttft, 99),
            "itl_p50": pct(gaps, 50), "itl_p99": pct(gaps, 99), "requests": len(prompts),
            "wall_s": wall}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hearth", required=True)
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vocab-range", default="1000,20000", help="prompt token ids are drawn from this range")
    ap.add_argument("--log-dir", default="/tmp/bench-serve")
    ap.add_argument("--hearth-args", default="", help="more arguments for hearth serve (e.g. '--prefill-chunk 32')")
    args = ap.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    slots = max(levels)
    ctx = args.prompt_tokens + args.output_tokens + 16
    lo, hi = (int(x) for x in args.vocab_range.split(","))
    Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    rows = []
    for model in args.model:
        name = Path(model).stem
        servers = {
            "hearth": [args.hearth, "serve", "-m", model, "-t", str(args.threads), "--parallel", str(slots),
                       "--ctx", str(ctx), "--kv-tokens", str(ctx * slots), *args.hearth_args.split()],
            "llama-server": [args.llama_server, "-m", model, "-t", str(args.threads), "-np", str(slots),
                             "-c", str(ctx * slots), "--cont-batching", "--no-webui"],
        }
        for level in levels:
            rng = random.Random(1000 * level + args.prompt_tokens)
            prompts = [[rng.randrange(lo, hi) for _ in range(args.prompt_tokens)]
                       for _ in range(level * args.requests_per_client)]
            warm = [[rng.randrange(lo, hi) for _ in range(args.prompt_tokens)]]
            got = {}
            for server, cmd in servers.items():
                port = 18000 + len(rows) * 2 + (server == "llama-server")
                p = Proc(cmd + ["--port", str(port)], port, f"{args.log_dir}/{name}-{server}-c{level}.log")
                try:
                    asyncio.run(load(p.url, warm, 1, 8))
                    print(f"[bench-serve] {name} {server} c={level}: {len(prompts)} requests", file=sys.stderr)
                    got[server] = asyncio.run(load(p.url, prompts, level, args.output_tokens))
                finally:
                    p.stop()
            h, l = got["hearth"], got["llama-server"]
            row = {"model": name, "concurrency": level, "prompt_tokens": args.prompt_tokens,
                   "output_tokens": args.output_tokens, "hearth": h, "llama_server": l,
                   "tps_ratio": h["tps"] / l["tps"], "ttft_p50_ratio": h["ttft_p50"] / l["ttft_p50"],
                   "itl_p99_ratio": h["itl_p99"] / l["itl_p99"]}
            rows.append(row)
    print(f"{'model':<32} {'c':>3} | {'out t/s H':>9} {'L':>7} {'x':>5} | {'TTFT p50 H':>10} {'L':>7} "
          f"{'p99 H':>7} {'L':>7} | {'ITL p50 H':>9} {'L':>7} {'p99 H':>7} {'L':>7}")
    for r in rows:
        h, l = r["hearth"], r["llama_server"]
        ms = lambda v: f"{v * 1000:7.1f}"  # noqa: E731
        print(f"{r['model']:<32} {r['concurrency']:>3} | {h['tps']:9.1f} {l['tps']:7.1f} {r['tps_ratio']:5.2f} | "
              f"{ms(h['ttft_p50']):>10} {ms(l['ttft_p50'])} {ms(h['ttft_p99'])} {ms(l['ttft_p99'])} | "
              f"{ms(h['itl_p50']):>9} {ms(l['itl_p50'])} {ms(h['itl_p99'])} {ms(l['itl_p99'])}")
    print("(times in ms; x = hearth / llama-server output tokens/s)")
    print(json.dumps({"bench": "serve", "rows": rows}))


if __name__ == "__main__":
    main()
