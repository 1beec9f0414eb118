"""One unmodified llama-server replica, as the server tests (check_server.py) and the demo
(server_ab.py) run it: the binary built by scripts/llama-server-setup (shared libraries, so
LD_PRELOAD interposes libllama's calls), on a loopback port, with or without kvshim.

    bins = replica.binaries()                     # Skip when it cannot be built here
    r = replica.Replica(bins, model, env=..., args=["-np", "1"], log=path).start()
    out = r.complete(prompt, n_predict=16)        # {"content", "ttft_s", "total_s", "timings"}
    r.stop()

Requests are llama-server's own /completion API (tools/server/README.md of the release):
temperature 0 (greedy), streamed, so ttft_s is the wall time from sending the request to the
first streamed token. `timings.prompt_n` counts the tokens llama-server evaluated; restored
tokens count as evaluated there (kvshim's restore happens inside llama_decode).
"""
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
import harness  # noqa: E402

SETUP = os.path.join(ROOT, "scripts", "llama-server-setup")


def binaries():
    """The bin directory of llama-server, llama-cli and llama-completion, built once into the
    cache outside the tree (scripts/llama-server-setup); Skip when this machine cannot."""
    p = subprocess.run([SETUP], stdout=subprocess.PIPE, text=True)
    if p.returncode == harness.SKIP:
        raise harness.Skip("scripts/llama-server-setup cannot build llama-server here")
    harness.require(p.returncode == 0, "scripts/llama-server-setup exited %d" % p.returncode)
    path = p.stdout.strip().splitlines()[-1]
    harness.require(os.path.isfile(os.path.join(path, "llama-server")),
                    "no llama-server in %s" % path)
    return path


def free_port():
    """A loopback TCP port nobody listens on now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Replica:
    """A llama-server process. env: the whole child environment (LD_PRELOAD and KVSHIM_*
    set only there); args: llama-server flags beyond model, host, port and threads."""

    def __init__(self, bins, model, env=None, args=(), log=None, threads=1, ctx=4096):
        self.bins, self.model, self.args, self.log = bins, model, list(args), log
        self.env = dict(os.environ if env is None else env)
        self.threads, self.ctx = threads, ctx
        self.port, self.proc, self._log_file = None, None, None

    def start(self, timeout=120):
        self.port = free_port()
        cmd = [os.path.join(self.bins, "llama-server"), "-m", self.model, "--host", "127.0.0.1",
               "--port", str(self.port), "-t", str(self.threads), "-c", str(self.ctx),
               "--no-webui"] + self.args
        self._log_file = open(self.log or os.devnull, "ab")
        self.proc = subprocess.Popen(cmd, env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=self._log_file, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise harness.Failure("llama-server exited %d at start (log: %s)"
                                      % (self.proc.returncode, self.log))
            try:
                status, _ = self._request("GET", "/health", None, 2)
                if status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        self.kill()
        raise harness.Failure("llama-server not healthy within %d s (log: %s)" % (timeout, self.log))

    def _request(self, method, path, body, timeout):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, None if body is None else json.dumps(body),
                         {"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def post(self, path, body, timeout=300):
        """POST a JSON body; returns (status, parsed JSON or raw bytes)."""
        status, data = self._request("POST", path, body, timeout)
        try:
            return status, json.loads(data)
        except ValueError:
            return status, data

    def complete(self, prompt, n_predict=16, timeout=600, **extra):
        """A streamed /completion at temperature 0: content, ttft_s, total_s, timings, slot."""
        body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "top_k": 1,
                "seed": 1, "stream": True}
        body.update(extra)
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        t0 = time.monotonic()
        ttft, content, last = None, [], {}
        try:
            conn.request("POST", "/completion", json.dumps(body),
                         {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise harness.Failure("/completion answered %d: %s"
                                      % (resp.status, resp.read()[:300]))
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data: "):
                    continue
                msg = json.loads(line[6:])
                if msg.get("content") and ttft is None:
                    ttft = time.monotonic() - t0
                content.append(msg.get("content", ""))
                last = msg
                if msg.get("stop"):
                    break
        finally:
            conn.close()
        total = time.monotonic() - t0
        return {"content": "".join(content), "ttft_s": ttft if ttft is not None else total,
                "total_s": total, "timings": last.get("timings", {}),
                "slot": last.get("id_slot"), "tokens_cached": last.get("tokens_cached")}

    def stop(self, timeout=30):
        """SIGTERM, then SIGKILL after timeout; returns the exit status. kvshim writes its
        KVSHIM_STATS file at a normal exit."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log_file:
            self._log_file.close()
            self._log_file = None
        return self.proc.returncode

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        return self.stop()
