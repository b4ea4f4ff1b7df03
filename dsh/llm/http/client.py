"""The per-run HTTP client and reading its responses (part of :mod:`dsh.llm.http`).

One ``httpx.Client`` per run, kept in ``ctx.resources["httpx"]`` and closed by the run's
cleanups (:func:`get_client`). Cancellation ends a blocked read at once: the client records
every socket it opens (through httpcore's ``trace`` extension) and an abort *shuts them down*
(:func:`abort_client`) — closing a socket from another thread does not wake a ``recv`` blocked
on it, ``shutdown`` does. A response is read within :data:`MAX_RESPONSE_BYTES`, whole
(:func:`read_capped`) or as server-sent events as bytes arrive (:func:`iter_sse`).
"""

from __future__ import annotations

import socket
import threading
import weakref
from collections.abc import Iterator
from collections.abc import Mapping
from typing import Any

import httpx

from dsh._version import __version__
from dsh.core.errors import ProviderError
from dsh.host.runcontext import current_or_none
from dsh.llm.sse import SSEEvent
from dsh.llm.sse import SSEParser

_sockets: weakref.WeakKeyDictionary[httpx.Client, weakref.WeakSet[socket.socket]] = (
    weakref.WeakKeyDictionary()
)
_lock = threading.Lock()


def new_client() -> httpx.Client:
    """A client that remembers the sockets it opens, so :func:`abort_client` can end reads."""
    socks: weakref.WeakSet[socket.socket] = weakref.WeakSet()

    def on_request(request: httpx.Request) -> None:
        previous = request.extensions.get("trace")

        def trace(event: str, info: dict[str, Any]) -> None:
            if event.endswith((".connect_tcp.complete", ".start_tls.complete")):
                stream = info.get("return_value")
                sock = stream.get_extra_info("socket") if stream is not None else None
                if isinstance(sock, socket.socket):
                    with _lock:
                        socks.add(sock)
            if previous is not None:
                previous(event, info)

        request.extensions["trace"] = trace

    client = httpx.Client(
        timeout=httpx.Timeout(600.0, connect=10.0),
        headers={"user-agent": f"dsh/{__version__}"},
        event_hooks={"request": [on_request]},
    )
    with _lock:
        _sockets[client] = socks
    return client


def get_client(settings: Mapping[str, Any] | None = None) -> httpx.Client:
    """The run's shared client (created on first use, closed by the run's cleanups); outside a
    run a new client that the caller must close. ``settings`` is accepted for per-model client
    options; today timeouts and headers are applied per request, so all models share one."""
    ctx = current_or_none()
    if ctx is None:
        return new_client()
    with _lock:
        client = ctx.resources.get("httpx")
    if isinstance(client, httpx.Client):
        return client
    fresh = new_client()
    with _lock:
        client = ctx.resources.setdefault("httpx", fresh)
    if client is fresh:
        ctx.add_cleanup(fresh.close)
    else:  # another thread of the run won the race
        fresh.close()
    return client


def shutdown_socket(sock: socket.socket) -> None:
    try:
        # The plain-socket method on purpose: ssl.SSLSocket.shutdown would also drop its SSL
        # object under the reading thread's feet.
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass  # already closed


def _remember_socket(client: httpx.Client, resp: httpx.Response) -> None:
    """Also record the response's own socket: covers a client not made by :func:`new_client`."""
    stream = resp.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if isinstance(sock, socket.socket):
        with _lock:
            _sockets.setdefault(client, weakref.WeakSet()).add(sock)


def abort_client(client: httpx.Client) -> None:
    """Shut down every socket ``client`` opened: blocked reads return at once with an error."""
    with _lock:
        socks = list(_sockets.get(client, ()))
    for sock in socks:
        shutdown_socket(sock)


#: The most bytes of one provider response dsh reads (a stream, a body, an error body): a
#: runaway or hostile server — one endless line, an endless stream of text — cannot fill
#: memory. Far above any real response (a Responses API ``response.completed`` repeats every
#: output item, encrypted reasoning included: a few MiB).
MAX_RESPONSE_BYTES = 256 * 1024 * 1024


class ResponseTooLarge(ProviderError):
    """A provider response over :data:`MAX_RESPONSE_BYTES`: not retried, nothing recorded."""


def _capped(response: httpx.Response, where: str) -> Iterator[bytes]:
    limit = MAX_RESPONSE_BYTES
    total = 0
    for chunk in response.iter_bytes():
        total += len(chunk)
        if total > limit:
            raise ResponseTooLarge(f"{where}: the response is larger than {limit} bytes (a "
                                   "runaway or hostile server); nothing was recorded")
        yield chunk


def read_capped(response: httpx.Response, where: str) -> bytes:
    """The whole body of ``response``, at most :data:`MAX_RESPONSE_BYTES`."""
    return b"".join(_capped(response, where))


def iter_sse(response: httpx.Response, where: str = "provider") -> Iterator[SSEEvent]:
    """Parse a streaming response's body into SSE events as bytes arrive (at most
    :data:`MAX_RESPONSE_BYTES`; ``where`` names the server in the error)."""
    parser = SSEParser()
    for chunk in _capped(response, where):
        yield from parser.feed(chunk)
    yield from parser.flush()
