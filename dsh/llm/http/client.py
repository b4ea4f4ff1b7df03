"""The per-run HTTP client and reading its responses (part of :mod:`dsh.llm.http`).

One ``httpx.Client`` per run, kept by this module (not in ``ctx.resources``, where a plugin
could swap it) and closed by the run's cleanups (:func:`get_client`). **The connection is
dsh's** (issue 23, MISSION C3): the client is dsh's own class with dsh's own transport and
event hook; :func:`check_client` refuses, before anything is sent, a client that has gained an
event hook, a transport or a mount, naming the plugin whose code it is; and the transport
compares a digest of the exact body bytes it is about to write with the digest of the bytes
dsh made from the record (:func:`expect_body`) — a divergence is an
:class:`~dsh.core.errors.InvariantViolation` and nothing is written.

Cancellation ends a blocked read at once: the client records
every socket it opens (through httpcore's ``trace`` extension) and an abort *shuts them down*
(:func:`abort_client`) — closing a socket from another thread does not wake a ``recv`` blocked
on it, ``shutdown`` does. A response is read within :data:`MAX_RESPONSE_BYTES`, whole
(:func:`read_capped`) or as server-sent events as bytes arrive (:func:`iter_sse`).
"""

from __future__ import annotations

import contextvars
import hashlib
import socket
import threading
import weakref
from collections.abc import Iterator
from collections.abc import Mapping
from typing import Any

import httpx

from dsh._version import __version__
from dsh.core.errors import InvariantViolation
from dsh.core.errors import ProviderError
from dsh.host.runcontext import RunContext
from dsh.host.runcontext import current_or_none
from dsh.llm.sse import SSEEvent
from dsh.llm.sse import SSEParser

_sockets: weakref.WeakKeyDictionary[httpx.Client, weakref.WeakSet[socket.socket]] = (
    weakref.WeakKeyDictionary()
)
_lock = threading.Lock()
#: Per run: its client (module-private: no plugin can swap the run's connection).
_clients: weakref.WeakKeyDictionary[RunContext, httpx.Client] = weakref.WeakKeyDictionary()
#: Per client: the event hook dsh installed (the only one a checked client may have).
_own_hooks: weakref.WeakKeyDictionary[httpx.Client, Any] = weakref.WeakKeyDictionary()
#: The SHA-256 of the body the request being sent must have (set around a model request).
_expected: contextvars.ContextVar[bytes | None] = contextvars.ContextVar("dsh_body_digest",
                                                                        default=None)


def digest(content: bytes) -> bytes:
    return hashlib.sha256(content).digest()


class _Transport(httpx.HTTPTransport):
    """dsh's transport: immediately before the write, the body must be the one dsh made."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        expected = _expected.get()
        if expected is not None:
            _expected.set(None)  # one write per expectation (a retry sets it again)
            if digest(request.read()) != expected:
                raise InvariantViolation(
                    "invariant C3 violated: the body about to be sent is not the one dsh made "
                    "from the session ledger (something between the adapter and the socket "
                    "changed it); nothing was sent")
        return super().handle_request(request)


class _Client(httpx.Client):
    """An ``httpx.Client`` whose every transport (proxies from the environment too) is dsh's."""

    def _init_transport(self, **kwargs: Any) -> httpx.BaseTransport:  # type: ignore[override]
        if kwargs.pop("transport", None) is not None:
            raise InvariantViolation("dsh's model client takes no foreign transport")
        return _Transport(**kwargs)

    # httpx passes every argument by keyword
    def _init_proxy_transport(  # type: ignore[override]
            self, proxy: httpx.Proxy, **kwargs: Any) -> httpx.BaseTransport:
        return _Transport(proxy=proxy, **kwargs)


def expect_body(content: bytes) -> contextvars.Token[bytes | None]:
    """The next request written through dsh's transport must have exactly ``content``."""
    return _expected.set(digest(content))


def check_client(client: httpx.Client, pm: Any = None) -> None:
    """Refuse a model client that is not dsh's as dsh made it: another class, an event hook
    or a transport or mount added since. Names the plugin whose code was added, when
    ``pm`` (the agent's plugin manager) can tell."""
    problem = ""
    code: Any = None
    own = _own_hooks.get(client)
    if type(client) is not _Client or own is None:
        problem = f"the HTTP client is a {type(client).__name__}, not dsh's own"
        code = getattr(type(client), "__init__", None)
    else:
        hooks = client.event_hooks
        extra = [h for h in hooks.get("request", []) if h is not own]
        extra += list(hooks.get("response", []))
        if extra or set(hooks) - {"request", "response"}:
            problem = "an event hook was added to dsh's HTTP client"
            code = extra[0] if extra else None
        else:
            transports = [client._transport, *client._mounts.values()]
            foreign = [t for t in transports if t is not None and type(t) is not _Transport]
            if foreign:
                problem = (f"a foreign transport ({type(foreign[0]).__name__}) was put on "
                           "dsh's HTTP client")
                code = getattr(type(foreign[0]), "handle_request", None)
    if not problem:
        return
    who = _who(code, pm)
    raise InvariantViolation(
        f"invariant C3: {problem}{f' by plugin {who}' if who else ''}; model requests leave "
        "through dsh's own connection (a plugin that wants to see or change a request has the "
        "`request` hook, whose change is recorded first); nothing was sent", plugin=who)


def _who(fn: Any, pm: Any) -> str:
    code = getattr(fn, "__code__", None)
    if code is None:
        return str(getattr(fn, "__module__", "") or "")
    if pm is not None:
        from dsh.llm.transport import plugin_of_code

        name = plugin_of_code(pm, code)
        if name:
            return name
    return str(getattr(fn, "__module__", "") or "")


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

    client = _Client(
        timeout=httpx.Timeout(600.0, connect=10.0),
        headers={"user-agent": f"dsh/{__version__}"},
        event_hooks={"request": [on_request]},
    )
    with _lock:
        _sockets[client] = socks
        _own_hooks[client] = on_request
    return client


def get_client(settings: Mapping[str, Any] | None = None) -> httpx.Client:
    """The run's shared client (created on first use, closed by the run's cleanups); outside a
    run a new client that the caller must close. ``settings`` is accepted for per-model client
    options; today timeouts and headers are applied per request, so all models share one."""
    ctx = current_or_none()
    if ctx is None:
        return new_client()
    with _lock:
        client = _clients.get(ctx)
    if client is not None:
        return client
    fresh = new_client()
    with _lock:
        client = _clients.setdefault(ctx, fresh)
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
