"""Time to first token: `dsh run --stream` against a raw httpx SSE read, same loopback server.

    python benchmarks/stream.py [--runs 20]

A loopback server speaking OpenAI's chat-completions SSE records the instant (CLOCK_MONOTONIC,
shared by every process on the machine) at which it writes the first token. The time to first
token is measured from that instant to the moment the token is readable by the consumer:

* raw: an in-process ``httpx`` streaming read, parsing SSE lines by hand;
* dsh: the first byte ``dsh run --stream -m openai:bench`` writes to its stdout pipe (the whole
  path: adapter, incremental SSE parser, tool-call stream gate, recorder, CLI printer).

Process start-up is excluded on purpose (benchmarks/startup.py measures it); what is printed is
what dsh adds between the wire and the reader. Target: ≤ 2 ms added.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler
from http.server import ThreadingHTTPServer
from pathlib import Path

FIRST = "Hello"
REST = [" from", " the", " loopback", " server", "."]


def chunk(delta: dict, finish: str | None = None) -> bytes:
    body = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": "bench",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return f"data: {json.dumps(body)}\n\n".encode()


class Handler(BaseHTTPRequestHandler):
    sent_first: list[float] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        self.wfile.write(chunk({"role": "assistant", "content": ""}))
        self.wfile.flush()
        time.sleep(0.02)  # the model "thinks"; then the first token leaves
        Handler.sent_first.append(time.perf_counter())
        self.wfile.write(chunk({"content": FIRST}))
        self.wfile.flush()
        for piece in REST:
            self.wfile.write(chunk({"content": piece}))
        self.wfile.write(chunk({}, "stop"))
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


def raw_ttft(url: str) -> float:
    import httpx

    body = {"model": "bench", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.Client() as client, client.stream("POST", url + "/chat/completions",
                                                 json=body) as r:
        buf = b""
        first: float | None = None
        for data in r.iter_raw():
            buf += data
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                payload = event.removeprefix(b"data: ")
                if payload == b"[DONE]" or first is not None:
                    continue
                if json.loads(payload)["choices"][0]["delta"].get("content"):
                    first = time.perf_counter()
    if first is None:
        raise RuntimeError("no token")
    return first - Handler.sent_first[-1]


def dsh_ttft(url: str, env: dict[str, str]) -> float:
    script = Path(sys.executable).with_name("dsh")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "dsh"]
    proc = subprocess.Popen([*cmd, "run", "--stream", "-m", "openai:bench", "hi"],
                            stdout=subprocess.PIPE, env={**env, "OPENAI_BASE_URL": url})
    assert proc.stdout is not None
    first = os.read(proc.stdout.fileno(), 1)
    t = time.perf_counter()
    rest = proc.stdout.read()
    proc.wait()
    assert proc.returncode == 0 and (first + rest).decode().startswith(FIRST), first + rest
    return t - Handler.sent_first[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    home = tempfile.mkdtemp(prefix="dsh-stream-")
    env = {**os.environ, "DSH_HOME": home, "XDG_CONFIG_HOME": home}
    env.pop("OPENAI_API_KEY", None)
    raw_ttft(url), dsh_ttft(url, env)  # warm up
    raw, dsh = [], []
    for _ in range(args.runs):
        raw.append(raw_ttft(url))
        dsh.append(dsh_ttft(url, env))
    r, d = statistics.median(raw), statistics.median(dsh)
    print(f"raw httpx SSE read:  first token after {r * 1e3:.2f} ms (median of {args.runs})")
    print(f"dsh run --stream:    first token after {d * 1e3:.2f} ms (median of {args.runs})")
    print(f"added by dsh: {(d - r) * 1e3:.2f} ms  (target <= 2 ms)")
    server.shutdown()


if __name__ == "__main__":
    main()
