#!/usr/bin/env python3
"""Unit tests of scripts/bench.py's parsing, ratio and output code, on canned
llama-bench and hearth output (tests/fixtures/bench). Runs without llama.cpp:

    python3 scripts/test_bench.py
"""

import json
import sys
import unittest
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ beside the tracked scripts
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "bench"

HEARTH_OUT = "\n".join([
    '{"test":"membw","threads":1,"gbps":19.5,"gbps_stddev":0.2}',
    '{"model":"llama-Q4_0","test":"pp16","threads":1,"tps":120.5,"tps_stddev":1.5,"backend":"cpu"}',
    '{"model":"llama-Q4_0","test":"tg4","threads":1,"tps":50.0,"tps_stddev":0.5,"gbps":4.25,"backend":"cpu"}',
    "",
])


class ParseLlamaBench(unittest.TestCase):
    def setUp(self):
        self.rows = bench.parse_llama_bench((FIXTURES / "llama-bench-tiny.json").read_text())

    def test_every_result_with_its_test_and_threads(self):
        self.assertEqual([(r["test"], r["threads"]) for r in self.rows],
                         [("pp16", 1), ("tg4", 1), ("pp16", 2), ("tg4", 2)])

    def test_mean_and_stddev_are_llama_bench_avg_ts_and_stddev_ts(self):
        r = bench.find(self.rows, "pp16", 2)
        self.assertAlmostEqual(r["tps"], 27.949021)
        self.assertAlmostEqual(r["tps_stddev"], 8.571576)

    def test_combined_test_name(self):
        self.assertEqual(bench.test_name(512, 128), "pp512+tg128")
        self.assertEqual(bench.test_name(0, 128), "tg128")

    def test_garbage_is_a_clear_error(self):
        with self.assertRaisesRegex(bench.BenchError, "no JSON"):
            bench.parse_llama_bench("main: error: failed to load model")
        with self.assertRaisesRegex(bench.BenchError, "without"):
            bench.parse_llama_bench('[{"n_prompt": 512}]')

    def test_find_wants_exactly_one(self):
        with self.assertRaisesRegex(bench.BenchError, "got 0"):
            bench.find(self.rows, "tg128", 1)


class ParseHearth(unittest.TestCase):
    def test_rows_without_membw(self):
        rows = bench.parse_hearth(HEARTH_OUT)
        self.assertEqual([r["test"] for r in rows], ["pp16", "tg4"])
        self.assertEqual(bench.parse_membw(HEARTH_OUT), {1: 19.5})

    def test_missing_key_and_non_json(self):
        with self.assertRaisesRegex(bench.BenchError, "'tps'"):
            bench.parse_hearth('{"model":"m","test":"pp16","threads":1}')
        with self.assertRaisesRegex(bench.BenchError, "not JSON"):
            bench.parse_hearth("| model | size |")


class Rows(unittest.TestCase):
    def rows(self):
        anchor = bench.parse_llama_bench((FIXTURES / "llama-bench-tiny.json").read_text())
        hearth = bench.parse_hearth(HEARTH_OUT)
        return [
            bench.make_row("llama-Q4_0", "pp16", 1, bench.find(hearth, "pp16", 1), "llama.cpp",
                           bench.find(anchor, "pp16", 1)),
            bench.make_row("llama-Q4_0", "tg4", 1, bench.find(hearth, "tg4", 1), "llama.cpp",
                           bench.find(anchor, "tg4", 1)),
        ]

    def test_ratio_is_hearth_over_anchor(self):
        rows = self.rows()
        self.assertAlmostEqual(rows[0]["ratio"], round(120.5 / 9022.49079, 3))
        self.assertAlmostEqual(rows[1]["ratio"], round(50.0 / 3474.666718, 3))
        self.assertIsNone(bench.ratio(1.0, 0.0))

    def test_json_line_has_exactly_the_row_keys(self):
        line = bench.summary_json("cpu", self.rows())
        self.assertNotIn("\n", line)
        doc = json.loads(line)
        self.assertEqual(doc["bench"], "cpu")
        self.assertEqual(len(doc["rows"]), 2)
        for r in doc["rows"]:
            self.assertEqual(set(r), {"model", "test", "threads", "hearth_tps", "anchor", "anchor_tps", "ratio"})
            self.assertEqual(r["anchor"], "llama.cpp")
        self.assertEqual(doc["rows"][1]["hearth_tps"], 50.0)

    def test_table_shows_ratios_bandwidth_and_geometric_means(self):
        table = bench.format_table("cpu", self.rows(), {1: 19.5})
        lines = table.splitlines()
        self.assertIn("llama.cpp t/s", lines[0])
        self.assertIn("0.01", lines[2])  # 120.5 / 9022.5
        self.assertIn("4.25 (22% of 19.5)", lines[3])
        self.assertTrue(any(l.startswith("geometric mean ratio, tg at 1 thread:") for l in lines))

    def test_decode_rows_show_the_ratio_bandwidth_allows(self):
        rows = self.rows()
        tg = rows[1]
        # The anchor read 4.25 * 3474.67 / 50 GB/s; memory gives 19.5.
        a = 4.25 * tg["anchor_tps"] / tg["hearth_tps"]
        self.assertAlmostEqual(bench.anchor_gbps(tg), a, places=6)
        self.assertAlmostEqual(bench.max_ratio(tg, bench.bandwidth_ceilings(rows, {1: 19.5})), max(19.5, a) / a)
        # A decode faster than the bandwidth test raises the ceiling.
        self.assertAlmostEqual(bench.bandwidth_ceilings(rows, {1: 1.0})[1], max(4.25, a))
        self.assertIsNone(bench.max_ratio(rows[0], {1: 19.5}))  # a prefill row
        table = bench.format_table("cpu", rows, {1: 19.5})
        self.assertIn(f"| {max(19.5, a) / a:.2f} |", table.splitlines()[3])


class ParseDecodeSpeed(unittest.TestCase):
    OUT = "\n".join([
        '{"target": "wasm32", "isa": "simd128", "prompt_tokens": 5, "prefill_tps": 40.0, "decode_tokens": 63, "decode_tps": 50.0}',
        '{"target": "wasm32", "isa": "simd128", "prompt_tokens": 5, "prefill_tps": 120.0, "decode_tokens": 63, "decode_tps": 76.0}',
        '{"target": "wasm32", "isa": "simd128", "prompt_tokens": 5, "prefill_tps": 121.0, "decode_tokens": 63, "decode_tps": 78.0}',
        "",
    ])

    def test_the_first_repeat_is_a_warm_up(self):
        r = bench.parse_decode_speed(self.OUT)
        self.assertAlmostEqual(r["tps"], 77.0)
        self.assertAlmostEqual(r["tps_stddev"], 2 ** 0.5)

    def test_one_repeat_is_kept(self):
        r = bench.parse_decode_speed(self.OUT.splitlines()[0])
        self.assertAlmostEqual(r["tps"], 50.0)
        self.assertEqual(r["tps_stddev"], 0.0)

    def test_garbage_is_a_clear_error(self):
        with self.assertRaisesRegex(bench.BenchError, "decode_tps"):
            bench.parse_decode_speed("RuntimeError: unreachable")
        with self.assertRaisesRegex(bench.BenchError, "no result"):
            bench.parse_decode_speed("")


class Stale(unittest.TestCase):
    def test_a_source_newer_than_the_program_is_named(self):
        import os
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            root = Path(d)
            (root / "src" / "a").mkdir(parents=True)
            old, new = root / "src" / "a" / "old.rs", root / "src" / "a" / "new.rs"
            program = root / "hearth"
            for f in (old, program, new):
                f.write_text("")
            os.utime(old, (100, 100))
            os.utime(program, (200, 200))
            os.utime(new, (300, 300))
            self.assertEqual(bench.stale(program, root), new)
            os.utime(program, (400, 400))
            self.assertIsNone(bench.stale(program, root))


if __name__ == "__main__":
    unittest.main()
