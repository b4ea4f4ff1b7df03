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
from collections.abc import Callable
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
    #: The request body's bytes as they arrived (byte-identity checks).
    raw: bytes = b""


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
                    raw,
                )
            )
            reply: Reply | None
            if owner.responder is not None:  # a simulated service: replies computed
                reply = owner.responder(owner.received[-1])
            else:
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
        #: Computes each reply from the request instead of the script (a simulated service
        #: such as :class:`AnthropicSim`); called under the server's lock, in arrival order.
        self.responder: Callable[[Received], Reply] | None = None
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


# -- a simulated Anthropic Messages service (issue 17) ---------------------------------------

#: The API's 400 when thinking is enabled and the assistant turn before the tool results lost
#: its thinking blocks (the text of the published error, with the message index filled in).
THINKING_MISSING = (
    "messages.{i}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
    "`{found}`. When `thinking` is enabled, a final `assistant` message must start with a "
    "thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). We "
    "recommend you include thinking blocks from previous turns. To avoid this requirement, "
    "disable `thinking`. Please consult our documentation at "
    "https://docs.claude.com/en/docs/build-with-claude/extended-thinking")

#: A step of :class:`AnthropicSim`: content blocks to answer with, in order —
#: ``("thinking", text)``, ``("redacted", data)``, ``("text", text)``,
#: ``("tool_use", id, name, input)``.
SimBlock = tuple[Any, ...]


def approx_tokens(segment: Any) -> int:
    """The simulated tokenizer: one token per 4 characters of the block's JSON, at least 1."""
    return max(1, -(-len(json.dumps(segment, sort_keys=True, ensure_ascii=False)) // 4))


class AnthropicSim:
    """The Messages API's rules that replay and caching depend on, as a ``responder`` of a
    :class:`ScriptedServer` (``server.responder = sim``).

    * **Thinking**: each ``thinking`` block it returns is signed (an HMAC over its text), and
      the ``redacted_thinking`` data it returns is remembered. Every request is checked as the
      API does: with ``thinking`` enabled, the assistant message before the last tool results
      must start with that turn's thinking blocks — here stricter than the API: all of them,
      unchanged, in order — else the API's 400 ``invalid_request_error``; a thinking block
      anywhere whose signature does not match its text is refused (``Invalid `signature```),
      and so is redacted data it never issued. Also: ``budget_tokens`` ≥ 1024 and below
      ``max_tokens``; at most 4 ``cache_control`` breakpoints, none on a thinking block.
    * **Prompt caching**, by the published accounting: the prompt is the sequence tools →
      system → messages; a breakpoint writes the prefix ending at its block; a request reads
      the longest cached prefix ending at a breakpoint or at most 20 blocks before one;
      ``cache_read_input_tokens`` is that prefix, ``cache_creation_input_tokens`` what lies
      between it and the last breakpoint, ``input_tokens`` the rest. Entries never expire here
      (the 5-minute TTL is longer than any test); ``min_cacheable`` (tokens) defaults to 0.

    Replies stream (``stream: true``) with the published event sequence — ``message_start``
    (usage with the cache fields), ``content_block_start`` / ``thinking_delta`` /
    ``signature_delta`` / ``text_delta`` / ``input_json_delta`` / ``content_block_stop``,
    ``message_delta`` (stop_reason, usage), ``message_stop`` — or come whole.
    """

    LOOKBACK = 20

    def __init__(self, steps: Sequence[Sequence[SimBlock]] = (), *,
                 model: str = "claude-sonnet-4-5-20250929", min_cacheable: int = 0,
                 output_tokens: int = 20, secret: bytes = b"sim-signing-key") -> None:
        self.steps: deque[Sequence[SimBlock]] = deque(steps)
        self.model = model
        self.min_cacheable = min_cacheable
        self.output_tokens = output_tokens
        self._secret = secret
        #: tool_use id → the reasoning blocks of the turn that made the call, as sent.
        self.issued: dict[str, list[dict[str, Any]]] = {}
        self._redacted: set[str] = set()
        self._cache: set[str] = set()
        #: The error messages of the 400s it answered with.
        self.errors: list[str] = []
        #: The usage object of every reply, in order.
        self.usages: list[dict[str, int]] = []

    def sign(self, text: str) -> str:
        import base64
        import hashlib
        import hmac

        mac = hmac.new(self._secret, text.encode(), hashlib.sha256).digest()
        return "Eu" + base64.b64encode(mac * 3).decode()  # base64, as the API's look

    # -- the checks ---------------------------------------------------------------------------

    def check(self, body: dict[str, Any]) -> str | None:
        """The API's error message for ``body``, or None when it would be accepted."""
        marks = 0
        for tool in body.get("tools") or []:
            marks += "cache_control" in tool
        system = body.get("system")
        if isinstance(system, list):
            marks += sum("cache_control" in b for b in system)
        messages = body.get("messages") or []
        for i, m in enumerate(messages):
            content = m.get("content")
            if not isinstance(content, list):
                continue
            for j, b in enumerate(content):
                marks += "cache_control" in b
                kind = b.get("type")
                if kind in ("thinking", "redacted_thinking") and "cache_control" in b:
                    return f"messages.{i}.content.{j}.{kind}.cache_control: Extra inputs are " \
                           "not permitted"
                if kind == "thinking" and b.get("signature") != self.sign(b.get("thinking", "")):
                    return f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
                if kind == "redacted_thinking" and b.get("data") not in self._redacted:
                    return f"messages.{i}.content.{j}: Invalid `data` in `redacted_thinking` block"
        if marks > 4:
            return f"A maximum of 4 blocks with cache_control may be provided. Found {marks}."
        thinking = body.get("thinking")
        if not (isinstance(thinking, dict) and thinking.get("type") == "enabled"):
            return None
        budget = thinking.get("budget_tokens")
        if not isinstance(budget, int) or budget < 1024:
            return "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
        if budget >= int(body.get("max_tokens") or 0):
            return "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult " \
                   "our documentation at https://docs.claude.com/en/docs/build-with-claude/" \
                   "extended-thinking#max-tokens-and-context-window-size"
        last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"),
                   default=None)
        if last is None or last + 1 >= len(messages):
            return None
        after = messages[last + 1].get("content")
        if not (isinstance(after, list) and any(b.get("type") == "tool_result" for b in after)):
            return None
        content = messages[last].get("content") or []
        if not isinstance(content, list) or not content:
            return THINKING_MISSING.format(i=last, found="text")
        first = content[0].get("type")
        if first not in ("thinking", "redacted_thinking"):
            return THINKING_MISSING.format(i=last, found=first)
        sent = [b for b in content if b.get("type") in ("thinking", "redacted_thinking")]
        calls = [b.get("id") for b in content if b.get("type") == "tool_use"]
        expected = self.issued.get(calls[0]) if calls else None
        if expected is not None and sent != expected:
            return f"messages.{last}.content: the `thinking` blocks of this turn must be " \
                   "passed back unmodified, in the order they were returned"
        return None

    # -- the accounting -------------------------------------------------------------------------

    def account(self, body: dict[str, Any]) -> dict[str, int]:
        """Input usage of ``body`` by the published cache accounting (and remember what it
        writes)."""
        import hashlib

        segments: list[tuple[Any, bool]] = []
        for tool in body.get("tools") or []:
            segments.append((("tool", _uncached(tool)), "cache_control" in tool))
        system = body.get("system")
        if isinstance(system, str):
            segments.append((("system", {"type": "text", "text": system}), False))
        elif isinstance(system, list):
            segments += [(("system", _uncached(b)), "cache_control" in b) for b in system]
        for i, m in enumerate(body.get("messages") or []):
            content = m.get("content")
            if isinstance(content, str):
                content = [{"type": "text", "text": content}]
            for b in content or []:
                segments.append(((i, m.get("role"), _uncached(b)), "cache_control" in b))
        hashes, tokens = [], []
        h = hashlib.sha256(str(body.get("model")).encode())
        for seg, _ in segments:
            h.update(json.dumps(seg, sort_keys=True, ensure_ascii=False).encode())
            hashes.append(h.copy().hexdigest())
            tokens.append(approx_tokens(seg[-1]))
        points = [k for k, (_, mark) in enumerate(segments) if mark]
        hit = -1
        for bp in points:
            for k in range(bp, max(-1, bp - self.LOOKBACK - 1), -1):
                if hashes[k] in self._cache:
                    hit = max(hit, k)
                    break
        read = sum(tokens[:hit + 1])
        written = 0
        if points and points[-1] > hit and sum(tokens[:points[-1] + 1]) >= self.min_cacheable:
            written = sum(tokens[hit + 1:points[-1] + 1])
            self._cache.update(hashes[k] for k in points)
        total = sum(tokens)
        return {"input_tokens": total - read - written, "cache_creation_input_tokens": written,
                "cache_read_input_tokens": read}

    # -- replying -------------------------------------------------------------------------------

    def __call__(self, received: Received) -> Reply:
        body = received.body if isinstance(received.body, dict) else {}
        problem = self.check(body)
        if problem is not None:
            self.errors.append(problem)
            return Reply(400, {"type": "error", "error": {"type": "invalid_request_error",
                                                          "message": problem}},
                         headers={"request-id": f"req_sim{len(self.errors)}"})
        if not self.steps:
            return Reply(418, {"type": "error", "error": {"type": "api_error",
                                                          "message": "simulation exhausted"}})
        blocks = self.blocks(self.steps.popleft())
        usage = {**self.account(body), "output_tokens": self.output_tokens}
        self.usages.append(usage)
        stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
        if body.get("stream"):
            return Reply(chunks=self.stream(blocks, usage, stop))
        return Reply(body={"id": "msg_01Sim", "type": "message", "role": "assistant",
                           "model": self.model, "content": blocks, "stop_reason": stop,
                           "stop_sequence": None, "usage": usage})

    def blocks(self, step: Sequence[SimBlock]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for spec in step:
            if spec[0] == "thinking":
                out.append({"type": "thinking", "thinking": spec[1],
                            "signature": self.sign(spec[1])})
            elif spec[0] == "redacted":
                self._redacted.add(spec[1])
                out.append({"type": "redacted_thinking", "data": spec[1]})
            elif spec[0] == "text":
                out.append({"type": "text", "text": spec[1]})
            else:
                out.append({"type": "tool_use", "id": spec[1], "name": spec[2],
                            "input": spec[3]})
        reasoning = [b for b in out if b["type"] in ("thinking", "redacted_thinking")]
        for b in out:
            if b["type"] == "tool_use":
                self.issued[b["id"]] = reasoning
        return out

    def stream(self, blocks: list[dict[str, Any]], usage: dict[str, int],
               stop: str) -> list[bytes]:
        start = {"type": "message_start", "message": {
            "id": "msg_01Sim", "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {**usage, "output_tokens": 1}}}
        out = [sse(start, "message_start")]
        for index, b in enumerate(blocks):
            def delta(d: dict[str, Any], i: int = index) -> bytes:
                return sse({"type": "content_block_delta", "index": i, "delta": d},
                           "content_block_delta")

            kind = b["type"]
            head = {"thinking": {"type": "thinking", "thinking": "", "signature": ""},
                    "redacted_thinking": b, "text": {"type": "text", "text": ""},
                    "tool_use": {"type": "tool_use", "id": b.get("id"), "name": b.get("name"),
                                 "input": {}}}[kind]
            out.append(sse({"type": "content_block_start", "index": index,
                            "content_block": head}, "content_block_start"))
            if kind == "thinking":
                text = b["thinking"]
                for k in range(0, len(text), 7):  # several deltas, split anywhere
                    out.append(delta({"type": "thinking_delta", "thinking": text[k:k + 7]}))
                out.append(delta({"type": "signature_delta", "signature": b["signature"]}))
            elif kind == "text":
                out.append(delta({"type": "text_delta", "text": b["text"]}))
            elif kind == "tool_use":
                raw = json.dumps(b["input"])
                for frag in ["", raw[: len(raw) // 2], raw[len(raw) // 2:]]:
                    out.append(delta({"type": "input_json_delta", "partial_json": frag}))
            out.append(sse({"type": "content_block_stop", "index": index},
                           "content_block_stop"))
            if index == 0:
                out.append(sse({"type": "ping"}, "ping"))
        out.append(sse({"type": "message_delta",
                        "delta": {"stop_reason": stop, "stop_sequence": None},
                        "usage": {"output_tokens": usage["output_tokens"]}}, "message_delta"))
        out.append(sse({"type": "message_stop"}, "message_stop"))
        return out


def _uncached(block: Any) -> Any:
    """``block`` without its ``cache_control`` marker (a marker is not part of the prefix)."""
    if isinstance(block, dict) and "cache_control" in block:
        return {k: v for k, v in block.items() if k != "cache_control"}
    return block


def reconstruct(path: Any, adapter: Any = None, *, stream: bool = False) -> list[Any]:
    """The body of every request a session sent, rebuilt from its ledger file alone (C3): for
    each ``assistant/message``, the request is the projection of every line before it, as
    ``adapter`` (default: an OpenAI-compatible one) writes it."""
    from pathlib import Path

    from dsh.core.messages import ModelRequest
    from dsh.ledger.fragments import DirectoryBlobs
    from dsh.ledger.history import Projection
    from dsh.llm.openai import OpenAIModel

    if adapter is None:
        adapter = OpenAIModel("x", {"base_url": "http://127.0.0.1:9/v1"})
    proj = Projection()
    proj.blobs = DirectoryBlobs(Path(path).parent)  # fragment texts, kept beside the ledger
    bodies = []
    for line in Path(path).read_text().splitlines():
        d = json.loads(line)
        if d["type"] == "assistant/message":
            req = ModelRequest(model=proj.model, system=proj.system, messages=proj.view(),
                               tools=proj.tools, options=proj.options)
            bodies.append(json.loads(json.dumps(adapter.build_body(req, stream=stream))))
        proj.apply_raw(d)
    return bodies


def sigkill_when(proc: Any, ready: Callable[[], bool], what: str, timeout: float = 60) -> None:
    """SIGKILL ``proc`` (a ``subprocess.Popen``) once ``ready()`` holds — typically when the
    scripted server holds its request — and reap it: a crash mid-turn, for the resume tests.
    Fails with ``what`` if ``proc`` exits first or ``ready`` never holds."""
    import signal
    import time

    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, what
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
