"""`hearth serve` under load and under hostile input, on SmolLM2.

    HEARTH_BIN=target/release/hearth .cache/pyenv/bin/python native/cli/tests/serve/test_load.py

Load: 64 concurrent streaming requests, a third cancelled at random points,
some with bad bodies; every surviving request must get exactly the tokens it
gets alone, each exactly once, and every K/V block must be free at the end.
"""

import asyncio
import json
import random
import socket
import sys
import time
import unittest

sys.dont_write_bytecode = True
from harness import Server  # noqa: E402
from rawhttp import post_json, request  # noqa: E402

SEED = 20261207
PROMPTS = [f"Question {i}: what is {i} plus {i * 3}? Answer:" for i in range(16)]
MAX_TOKENS = 20


def completion(prompt, stream):
    return {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "logprobs": 0,
            "stream": stream, "ignore_eos": True}


async def alone(url, prompt):
    """The tokens of `prompt` when it runs by itself."""
    status, body = await post_json(url, "/v1/completions", completion(prompt, False))
    assert status == 200, body
    return body["choices"][0]["logprobs"]["tokens"]


async def streamed(url, prompt, cancel_after):
    """('done', tokens, finish chunks, [DONE] count) or ('cancelled', n) of one stream."""
    r = await request(url, "POST", "/v1/completions", completion(prompt, True))
    assert r.status == 200, r.status
    tokens, finishes, dones = [], 0, 0
    try:
        async for data in r.events():
            if data == "[DONE]":
                dones += 1
                continue
            chunk = json.loads(data)
            assert "error" not in chunk, chunk
            for c in chunk["choices"]:
                if c["finish_reason"]:
                    finishes += 1
                elif c["logprobs"]:
                    tokens.extend(c["logprobs"]["tokens"])
            if cancel_after is not None and len(tokens) >= cancel_after:
                return ("cancelled", len(tokens))
        return ("done", tokens, finishes, dones)
    finally:
        r.close()


async def bad_body(url, body):
    status, reply = await post_json(url, "/v1/completions", body)
    return status, reply


class Load(unittest.TestCase):
    def test_64_streams_with_cancellations_and_bad_bodies(self):
        server = Server("--parallel", "16", "--ctx", "512")
        try:
            asyncio.run(self.run_load(server.url))
            m = self.settled(server)
            self.assertEqual(m["vllm:num_requests_running"], 0)
            self.assertEqual(m["vllm:num_requests_waiting"], 0)
            self.assertEqual(m["vllm:kv_cache_usage_perc"], 0.0, "every K/V block is free at the end")
            self.assertEqual(m["hearth_kv_blocks_free"], m["hearth_kv_blocks"])
            self.assertGreater(m["hearth_requests_cancelled_total"], 0)
            self.assertEqual(server.get("/health")[0], 200)
        finally:
            self.assertEqual(server.stop(), 0, "".join(server.log))

    def settled(self, server, timeout=30):
        """Metrics once nothing runs (cancellations land between steps)."""
        deadline = time.time() + timeout
        while True:
            m = server.metrics()
            if m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0 or time.time() > deadline:
                return m
            time.sleep(0.1)

    async def run_load(self, url):
        rng = random.Random(SEED)
        expected = {}
        for p in PROMPTS:
            expected[p] = await alone(url, p)
            self.assertEqual(len(expected[p]), MAX_TOKENS)
        plan = []
        for i in range(64):
            cancel = rng.randrange(0, MAX_TOKENS - 2) if rng.random() < 1 / 3 else None
            plan.append((PROMPTS[i % len(PROMPTS)], cancel))
        bad = [b"{not json", {"prompt": 5}, {"prompt": "x", "max_tokens": -1}, b"\xff\xfe{}", {"prompt": "x", "n": 10**30}]
        tasks = [streamed(url, p, c) for p, c in plan] + [bad_body(url, b) for b in bad]
        rng.shuffle(order := list(range(len(tasks))))
        results = await asyncio.gather(*(tasks[i] for i in order))
        by_task = dict(zip(order, results))
        done = cancelled = 0
        for i, (prompt, cancel) in enumerate(plan):
            r = by_task[i]
            with self.subTest(request=i, prompt=prompt, cancel=cancel):
                if cancel is None:
                    self.assertEqual(r[0], "done")
                    self.assertEqual(r[1], expected[prompt], "a batched request gets the tokens it gets alone")
                    self.assertEqual((r[2], r[3]), (1, 1), "one finish chunk and one [DONE]")
                    done += 1
                else:
                    self.assertEqual(r[0], "cancelled")
                    cancelled += 1
        for j in range(len(bad)):
            status, reply = by_task[len(plan) + j]
            with self.subTest(bad=bad[j]):
                self.assertEqual(status, 400)
                self.assertIn("message", reply["error"])
        self.assertGreater(done, 30)
        self.assertGreater(cancelled, 10)


class Hostile(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server("--ctx", "256", "--max-body-bytes", "20000", "--max-tokens", "64")

    @classmethod
    def tearDownClass(cls):
        code = cls.server.stop()
        if code != 0:
            raise AssertionError(f"exit {code}:\n" + "".join(cls.server.log))

    def post(self, path, body, **kw):
        return asyncio.run(post_json(self.server.url, path, body, **kw))

    def assertError(self, status, reply, want, code=None):
        self.assertEqual(status, want, reply)
        self.assertIsInstance(reply["error"]["message"], str)
        self.assertTrue(reply["error"]["message"])
        if code:
            self.assertEqual(reply["error"]["code"], code)

    def test_each_bad_body_gets_a_clear_error(self):
        deep = b"[" * 100000 + b"]" * 100000
        cases = [
            ("malformed JSON", b'{"prompt": "x",', 400),
            ("wrong type", {"messages": "hello"}, 400),
            ("wrong nested type", {"messages": [{"role": 1, "content": "x"}]}, 400),
            ("huge integer", b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 18446744073709551616}', 400),
            ("huge float", b'{"messages": [{"role": "user", "content": "x"}], "temperature": 1e400}', 400),
            ("negative n", {"messages": [{"role": "user", "content": "x"}], "n": -3}, 400),
            ("over --max-tokens", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 65}, 400),
            ("NaN", b'{"messages": [{"role": "user", "content": "x"}], "top_p": NaN}', 400),
            ("invalid UTF-8", b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', 400),
            ("image part", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400),
            ("deep nesting", deep[:19000], 400),
            ("empty body", b"", 400),
            ("too large", {"messages": [{"role": "user", "content": "x" * 30000}]}, 413),
        ]
        for name, body, want in cases:
            with self.subTest(case=name):
                status, reply = self.post("/v1/chat/completions", body)
                self.assertError(status, reply, want)

    def test_prompt_over_the_context(self):
        status, reply = self.post("/v1/completions", {"prompt": "word " * 400, "max_tokens": 4})
        self.assertError(status, reply, 400, "context_length_exceeded")

    def test_unknown_route_and_method(self):
        status, reply = self.post("/v1/nothing", {})
        self.assertError(status, reply, 404)
        r = asyncio.run(self.get_status("/v1/chat/completions"))
        self.assertEqual(r, 405)

    async def get_status(self, path):
        r = await request(self.server.url, "GET", path)
        await r.body()
        r.close()
        return r.status

    def test_slow_client_does_not_hold_up_others(self):
        async def go():
            body = {"prompt": "Hello", "max_tokens": 2, "temperature": 0}
            slow = asyncio.create_task(post_json(self.server.url, "/v1/completions", body, trickle=0.03))
            t0 = time.time()
            fast = [await post_json(self.server.url, "/v1/completions", body) for _ in range(3)]
            fast_s = time.time() - t0
            status, reply = await slow
            return fast, fast_s, status, reply, time.time() - t0
        fast, fast_s, status, reply, total = asyncio.run(go())
        self.assertTrue(all(s == 200 for s, _ in fast))
        self.assertLess(fast_s, total, "the fast requests finished while the slow body trickled in")
        self.assertEqual(status, 200, reply)

    def test_garbage_and_half_requests_leave_the_server_up(self):
        host, port = self.server.url.split("//")[1].split(":")
        for junk in [b"\x00\x01\x02 not http\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"pro"]:
            with socket.create_connection((host, int(port))) as s:
                s.sendall(junk)
                s.shutdown(socket.SHUT_WR)
                s.settimeout(10)
                try:
                    s.recv(4096)
                except (socket.timeout, ConnectionResetError):
                    pass
        status, reply = self.post("/v1/completions", {"prompt": "Hi", "max_tokens": 1})
        self.assertEqual(status, 200, reply)


class Limits(unittest.TestCase):
    def test_over_max_concurrent_is_429(self):
        server = Server("--max-concurrent", "2", "--parallel", "2")
        try:
            async def go():
                body = {"prompt": "Count:", "max_tokens": 48, "ignore_eos": True, "temperature": 0}
                return await asyncio.gather(*(post_json(server.url, "/v1/completions", body) for _ in range(6)))
            results = asyncio.run(go())
            codes = sorted(s for s, _ in results)
            self.assertGreaterEqual(codes.count(200), 2, codes)
            self.assertGreaterEqual(codes.count(429), 1, codes)
            for s, r in results:
                if s == 429:
                    self.assertEqual(r["error"]["type"], "rate_limit_error")
        finally:
            self.assertEqual(server.stop(), 0)


def stream_through_sigterm(server, max_tokens):
    """The events of one stream whose server gets SIGTERM at its first event."""
    async def go():
        r = await request(server.url, "POST", "/v1/completions",
                          {"prompt": "Once", "max_tokens": max_tokens, "ignore_eos": True,
                           "stream": True, "temperature": 0})
        events = []
        async for data in r.events():
            if not events:
                server.proc.send_signal(15)
            events.append(data)
        r.close()
        return events
    return asyncio.run(go())


class Shutdown(unittest.TestCase):
    def test_sigterm_lets_a_stream_finish(self):
        server = Server()
        events = stream_through_sigterm(server, 40)
        self.assertEqual(events[-1], "[DONE]")
        finish = [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-1]]
        self.assertEqual(finish[-1], "length", "the in-flight stream ran to its end")
        self.assertEqual(server.stop(), 0)

    def test_past_the_grace_period_requests_are_cancelled(self):
        server = Server("--shutdown-grace", "1", "--ctx", "4096")
        t0 = time.time()
        events = stream_through_sigterm(server, 4000)
        self.assertLess(time.time() - t0, 30)
        self.assertEqual(events[-1], "[DONE]")
        self.assertIn("error", json.loads(events[-2]), "the cut stream says why")
        self.assertEqual(server.stop(), 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
