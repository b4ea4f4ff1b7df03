"""Loopback HTTP servers for the adapter tests: real sockets, scripted replies, no mocks.

:class:`ScriptedServer` is a stdlib ``ThreadingHTTPServer`` on 127.0.0.1 (port 0). Each request
pops the next :class:`Reply` from its script and is recorded (:class:`Received`) so a test can
assert what the adapter sent. A reply is a plain body, or a stream of byte chunks written with
chunked transfer encoding and a flush per chunk, optionally with delays, a stall, or an abrupt
disconnect after N body bytes. The ``openai_*`` and ``anthropic_*`` builders produce
protocol-faithful bodies shaped like the real services' output.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
from collections import deque
from collections.abc import Iterator
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from http.server import BaseHTTPRequestHandler
from http.server import ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    """One scripted response.

    ``body`` (bytes, str, or JSON-able) is sent with a Content-Length; ``chunks`` instead
    streams with chunked encoding (``framing="close"``: no framing, the body ends when the
    connection closes). ``delay`` stalls before the status line, ``chunk_delay`` between chunks,
    ``stall`` after the last chunk; ``disconnect_after`` closes the socket after that many body
    bytes, without finishing the body.
    """

    status: int = 200
    body: Any = b""
    headers: dict[str, str] = field(default_factory=dict)
    chunks: Sequence[bytes] | None = None
    framing: str = "chunked"
    delay: float = 0.0
    chunk_delay: float = 0.0
    stall: float = 0.0
    disconnect_after: int | None = None


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    client_port: int


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def _serve(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        owner = self.server.owner
        with owner.lock:
            owner.received.append(
                Received(
                    self.command,
                    self.path,
                    {k.lower(): v for k, v in self.headers.items()},
                    body,
                    self.client_address[1],
                )
            )
            reply = owner.replies.popleft() if owner.replies else None
        if reply is None:
            reply = Reply(status=418, body={"error": {"message": "test script exhausted"}})
        try:
            self._reply(reply)
        except OSError:
            self.close_connection = True  # the client went away (an abort, a timeout)

    def _wait(self, seconds: float) -> bool:
        """Sleep, waking early when the server stops; True if it is stopping."""
        return seconds > 0 and self.server.owner.stopping.wait(seconds)

    def _reply(self, r: Reply) -> None:
        if self._wait(r.delay):
            return
        self.send_response(r.status)
        for k, v in r.headers.items():
            self.send_header(k, v)
        if r.chunks is None:
            body = r.body
            if not isinstance(body, bytes):
                body = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            if "content-type" not in {k.lower() for k in r.headers}:
                self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self._write_body([body], r, framed=False)
            return
        if "content-type" not in {k.lower() for k in r.headers}:
            self.send_header("content-type", "text/event-stream")
        chunked = r.framing == "chunked"
        if chunked:
            self.send_header("transfer-encoding", "chunked")
        else:
            self.send_header("connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.flush()
        if not self._write_body(r.chunks, r, framed=chunked):
            return
        if self._wait(r.stall):
            return
        if chunked:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    def _write_body(self, chunks: Sequence[bytes], r: Reply, framed: bool) -> bool:
        """Write ``chunks``; False when the reply ended early (disconnect or server stop)."""
        left = r.disconnect_after
        for i, chunk in enumerate(chunks):
            if i and self._wait(r.chunk_delay):
                return False
            if left is not None and len(chunk) >= left:
                chunk, cut = chunk[:left], True
            else:
                cut = False
            if left is not None:
                left -= len(chunk)
            if chunk:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if framed else chunk)
                self.wfile.flush()
            if cut:
                self._disconnect()
                return False
        return True

    def _disconnect(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    owner: ScriptedServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], OSError):  # resets from aborting clients are normal
            super().handle_error(request, client_address)


class ScriptedServer:
    """A loopback server replying from a script; use as a context manager."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.received: list[Received] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._httpd = _Server(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.02,), daemon=True)

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def script(self, *replies: Reply) -> ScriptedServer:
        with self.lock:
            self.replies.extend(replies)
        return self

    @property
    def bodies(self) -> list[Any]:
        return [r.body for r in self.received]

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)


def scripted_server() -> Iterator[ScriptedServer]:
    """Body of a pytest fixture: ``yield from scripted_server()``."""
    with ScriptedServer() as server:
        yield server


def closed_port() -> int:
    """A port on 127.0.0.1 with nothing listening (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- protocol-faithful bodies ----------------------------------------------------------------


def sse(data: Any, event: str | None = None) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


#: A tool call for the builders: (id, name, argument fragments as the model streamed them).
Call = tuple[str, str, Sequence[str]]


def openai_chunks(
    text: Sequence[str] = (),
    calls: Sequence[Call] = (),
    finish: str | None = None,
    usage: tuple[int, int] = (11, 7),
    model: str = "gpt-4o-mini-2024-07-18",
    done: bool = True,
) -> list[bytes]:
    """An OpenAI chat.completion.chunk stream: role chunk, content deltas, tool-call deltas
    (id and name first, then argument fragments), finish chunk, usage chunk, ``[DONE]``."""
    base = {
        "id": "chatcmpl-AbC123",
        "object": "chat.completion.chunk",
        "created": 1727000000,
        "model": model,
        "system_fingerprint": "fp_0ba0d124f1",
    }

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return sse({**base, "choices": [choice], "usage": None})

    out = [chunk({"role": "assistant", "content": "", "refusal": None})]
    out += [chunk({"content": t}) for t in text]
    for i, (cid, name, fragments) in enumerate(calls):
        head = {"index": i, "id": cid, "type": "function"}
        out.append(chunk({"tool_calls": [{**head, "function": {"name": name, "arguments": ""}}]}))
        for frag in fragments:
            out.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": frag}}]}))
    out.append(chunk({}, finish or ("tool_calls" if calls else "stop")))
    prompt, completion = usage
    out.append(
        sse(
            {
                **base,
                "choices": [],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                },
            }
        )
    )
    if done:
        out.append(b"data: [DONE]\n\n")
    return out


def openai_completion(
    text: str | None = None,
    calls: Sequence[tuple[str, str, str]] = (),
    finish: str | None = None,
    usage: tuple[int, int] = (11, 7),
    model: str = "gpt-4o-mini-2024-07-18",
) -> dict[str, Any]:
    """A non-streamed chat.completion with the same content as :func:`openai_chunks`."""
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
            for cid, name, args in calls
        ]
    return {
        "id": "chatcmpl-AbC123",
        "object": "chat.completion",
        "created": 1727000000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish or ("tool_calls" if calls else "stop"),
            }
        ],
        "usage": {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": sum(usage),
        },
        "system_fingerprint": "fp_0ba0d124f1",
    }


def anthropic_chunks(
    text: Sequence[str] = (),
    calls: Sequence[Call] = (),
    stop: str | None = None,
    usage: tuple[int, int] = (25, 15),
    model: str = "claude-sonnet-4-20250514",
    done: bool = True,
) -> list[bytes]:
    """An Anthropic Messages stream: message_start, ping, a text block, tool_use blocks with
    input_json_delta fragments, message_delta (stop_reason, usage), message_stop."""
    start = {
        "type": "message_start",
        "message": {
            "id": "msg_01XYZ",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": usage[0],
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": 1,
            },
        },
    }
    out = [sse(start, "message_start"), sse({"type": "ping"}, "ping")]
    index = 0
    if text:
        block: dict[str, Any] = {"type": "text", "text": ""}
        out.append(
            sse(
                {"type": "content_block_start", "index": 0, "content_block": block},
                "content_block_start",
            )
        )
        for t in text:
            delta = {"type": "text_delta", "text": t}
            out.append(
                sse(
                    {"type": "content_block_delta", "index": 0, "delta": delta},
                    "content_block_delta",
                )
            )
        out.append(sse({"type": "content_block_stop", "index": 0}, "content_block_stop"))
        index = 1
    for cid, name, fragments in calls:
        block = {"type": "tool_use", "id": cid, "name": name, "input": {}}
        out.append(
            sse(
                {"type": "content_block_start", "index": index, "content_block": block},
                "content_block_start",
            )
        )
        for frag in ["", *fragments]:  # the API opens with an empty partial_json
            delta = {"type": "input_json_delta", "partial_json": frag}
            out.append(
                sse(
                    {"type": "content_block_delta", "index": index, "delta": delta},
                    "content_block_delta",
                )
            )
        out.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
        index += 1
    message_delta = {
        "type": "message_delta",
        "delta": {
            "stop_reason": stop or ("tool_use" if calls else "end_turn"),
            "stop_sequence": None,
        },
        "usage": {"output_tokens": usage[1]},
    }
    out.append(sse(message_delta, "message_delta"))
    if done:
        out.append(sse({"type": "message_stop"}, "message_stop"))
    return out


def anthropic_message(
    text: str | None = None,
    calls: Sequence[tuple[str, str, dict[str, Any]]] = (),
    stop: str | None = None,
    usage: tuple[int, int] = (25, 15),
    model: str = "claude-sonnet-4-20250514",
) -> dict[str, Any]:
    """A non-streamed Messages response with the same content as :func:`anthropic_chunks`."""
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    content += [{"type": "tool_use", "id": c, "name": n, "input": i} for c, n, i in calls]
    return {
        "id": "msg_01XYZ",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop or ("tool_use" if calls else "end_turn"),
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage[0],
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": usage[1],
        },
    }


def bytewise(chunks: Sequence[bytes]) -> list[bytes]:
    """The same stream, one byte per chunk (every byte boundary is a split point)."""
    joined = b"".join(chunks)
    return [joined[i : i + 1] for i in range(len(joined))]
