"""Two `hearth serve` replicas behind SGLang's router (PyPI `sglang-router`,
`--policy cache_aware`): requests sharing a long prefix land on one replica
and hit its prefix cache, as each replica's /metrics shows.

    HEARTH_BIN=target/release/hearth .cache/pyenv/bin/python native/cli/tests/serve/test_router.py
"""

import json
import socket
import subprocess
import sys
import unittest
import urllib.request

sys.dont_write_bytecode = True
from harness import Server, wait_healthy  # noqa: E402

FAMILIES = {
    "library": "You are a careful assistant for a library. The catalogue lists books by author, title "
               "and year, and the shelves are numbered from one to forty. Answer in one short sentence.",
    "garden": "You help people plan vegetable gardens in a cool climate with short summers, clay soil "
              "and frequent rain in spring. Keep every answer practical and brief, and name the month.",
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Router(unittest.TestCase):
    def setUp(self):
        self.replicas = [Server("-t", "1"), Server("-t", "1")]
        self.port = free_port()
        cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
               "--port", str(self.port), "--policy", "cache_aware", "--log-level", "warn",
               "--worker-urls", *[r.url for r in self.replicas]]
        self.router = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.url = f"http://127.0.0.1:{self.port}"
        if wait_healthy(self.url, self.router):
            return
        self.router.kill()
        raise RuntimeError("the router did not come up:\n" + self.router.stderr.read())

    def tearDown(self):
        self.router.terminate()
        self.router.wait(30)
        self.router.stderr.close()
        for r in self.replicas:
            self.assertEqual(r.stop(), 0)

    def complete(self, prompt):
        body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 2, "temperature": 0}).encode()
        req = urllib.request.Request(self.url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            self.assertEqual(r.status, 200)
            return json.loads(r.read())

    def counts(self):
        """(finished requests, prefix-cache hit tokens) per replica."""
        out = []
        for r in self.replicas:
            m = r.metrics()
            done = sum(v for k, v in m.items() if k.startswith("vllm:request_success_total"))
            out.append((done, m["vllm:prefix_cache_hits_total"]))
        return out

    def test_shared_prefixes_stick_to_one_replica_and_hit_its_cache(self):
        for name, prefix in FAMILIES.items():
            before = self.counts()
            for i in range(6):
                self.complete(f"{prefix} Question {i}:")
            after = self.counts()
            served = [a[0] - b[0] for a, b in zip(after, before)]
            hits = [a[1] - b[1] for a, b in zip(after, before)]
            with self.subTest(family=name, served=served, hits=hits):
                self.assertEqual(sorted(served), [0, 6], "all six went to one replica")
                home = served.index(6)
                # Five of the six find the shared prefix's full blocks cached.
                self.assertGreaterEqual(hits[home], 5 * 16 * 2)
                self.assertEqual(hits[1 - home], 0)


if __name__ == "__main__":
    unittest.main(verbosity=2)
