"""Starts and stops `hearth serve` for the Python tests of the server.

The binary comes from HEARTH_BIN (the Rust test that runs these scripts sets
it to the hearth it built), the models from HEARTH_MODELS (.cache/models).
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
BIN = os.environ.get("HEARTH_BIN", str(ROOT / "target" / "release" / "hearth"))
MODELS = Path(os.environ.get("HEARTH_MODELS", ROOT / ".cache" / "models"))
SMOLLM2 = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"


def wait_healthy(url, proc, timeout=60):
    """True once `url`/health answers 200; False if `proc` exits or time runs out."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        if proc.poll() is not None:
            return False
        time.sleep(0.1)
    return False


class Server:
    """A `hearth serve` process on a free loopback port."""

    def __init__(self, *args, model=SMOLLM2, wait_ready=True):
        if not Path(model).exists():
            sys.exit(f"{model} not found: run `make setup` (or set HEARTH_MODELS)")
        threads = [] if "-t" in args else ["-t", "2"]
        cmd = [BIN, "serve", "-m", str(model), "--port", "0", *threads, *args]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        self.log = []
        self.url = None
        deadline = time.time() + 60
        for line in self.proc.stderr:
            self.log.append(line)
            if "listening on http://" in line:
                self.url = line.split("listening on ")[1].split()[0]
                break
            if time.time() > deadline:
                break
        if self.url is None:
            self.proc.kill()
            raise RuntimeError("hearth serve did not start:\n" + "".join(self.log))
        # Keep draining stderr so the server never blocks on a full pipe.
        self._drain = threading.Thread(target=self._read_rest, daemon=True)
        self._drain.start()
        if wait_ready:
            self.wait_ready()

    def _read_rest(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def wait_ready(self, timeout=60):
        if not wait_healthy(self.url, self.proc, timeout):
            raise RuntimeError("hearth serve never became ready:\n" + "".join(self.log))

    def request(self, method, path, body=None, headers=None):
        """(status, parsed JSON or text) of one request; body bytes or a JSON value."""
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                status, raw = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        text = raw.decode("utf-8", "replace")
        try:
            return status, json.loads(text)
        except ValueError:
            return status, text

    def get(self, path, headers=None):
        try:
            return self.request("GET", path, headers=headers)
        except (urllib.error.URLError, ConnectionError):
            return 0, None

    def post(self, path, body, headers=None):
        return self.request("POST", path, body, headers)

    def metrics(self):
        """{series name with labels stripped: value} of /metrics."""
        _, text = self.get("/metrics")
        out = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, value = line.rsplit(" ", 1)
            base, _, labels = name.partition("{")
            labels = [l for l in labels.rstrip("}").split(",") if l and not l.startswith("model_name=")]
            out[base + ("{" + ",".join(labels) + "}" if labels else "")] = float(value)
        return out

    def stop(self, timeout=30):
        """SIGTERM, then the exit status (0 expected)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._drain.join(5)
        self.proc.stderr.close()
        return self.proc.returncode


def hearth_run(*args):
    """`hearth run ... --json`: (token texts, token ids) of the output."""
    out = subprocess.run([BIN, "run", "-t", "2", "--json", *args], check=True, capture_output=True, text=True)
    rows = [json.loads(l) for l in out.stdout.splitlines() if l.strip()]
    toks = [r for r in rows if "id" in r]
    return [t["text"] for t in toks], [t["id"] for t in toks]
