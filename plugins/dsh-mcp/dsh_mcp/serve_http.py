"""``dsh mcp serve --http``: the server of :mod:`dsh_mcp.serve_server` over the MCP SDK's
streamable HTTP transport, on a loopback address only.

Anyone who can send it a request can run an agent with the person's tools and keys, so:

* it listens on loopback only (``127.0.0.1``, ``localhost``, ``::1``): another ``--host`` is
  refused (:func:`bind_address`);
* every request's ``Host`` must be this server's own (``127.0.0.1:PORT``, ``localhost:PORT``),
  else ``421``: a page that rebinds a DNS name to 127.0.0.1 sends its own name
  (DNS-rebinding protection, as the MCP specification requires);
* an ``Origin`` header, when there is one, must be a loopback origin (``http://localhost:3000``,
  ``http://127.0.0.1:PORT``), else ``403``: a web page elsewhere cannot drive it from the
  person's browser. Clients that are not browsers send none.

Both are checked before the SDK sees the request (:class:`Guard`), and again by the SDK's own
:class:`~mcp.server.transport_security.TransportSecuritySettings`. Request bodies are limited
to the SDK's default (4 MiB): a larger one is answered ``413`` and nothing runs.
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from typing import Any
from urllib.parse import urlsplit

from dsh_mcp.serve import Service

#: The path the MCP endpoint is served at.
PATH = "/mcp"
#: Seconds a stop (Ctrl-C, SIGTERM) waits for running requests before closing them.
GRACEFUL = 5


def bind_address(host: str) -> str:
    """The address to listen on for ``--host``: loopback only, else a
    :class:`~dsh.core.errors.UsageError` saying why."""
    from dsh.core.errors import UsageError

    if host == "localhost":
        return "127.0.0.1"
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        ip = None
    if ip is None or not ip.is_loopback:
        raise UsageError(f"--host {host!r} is not a loopback address: dsh mcp serve --http "
                         "listens on 127.0.0.1, localhost or ::1 only (whoever can reach it "
                         "runs agents with your tools and keys)")
    return str(ip)


def _loopback(name: str | None) -> bool:
    if not name:
        return False
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def origin_allowed(origin: str) -> bool:
    """Whether an ``Origin`` header names a loopback origin: ``http(s)://HOST[:PORT]`` with a
    loopback HOST, nothing else (no path, no user, a numeric port)."""
    try:
        parts = urlsplit(origin)
        port = parts.port  # raises for a port that is not a number
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or parts.path or parts.query or parts.fragment:
        return False
    if parts.username is not None or parts.password is not None:
        return False
    if port is None and parts.netloc.endswith(":"):
        return False
    return _loopback(parts.hostname)


class Guard:
    """ASGI middleware: ``Host`` must be one of ``hosts`` (421 otherwise), an ``Origin`` a
    loopback one (403 otherwise), before anything else sees the request."""

    def __init__(self, app: Any, hosts: set[str]) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":  # not served: closed before anything sees it
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":  # the lifespan
            await self.app(scope, receive, send)
            return
        headers: dict[str, list[str]] = {}
        for key, value in scope.get("headers") or ():
            headers.setdefault(key.decode("latin-1").lower(), []).append(
                value.decode("latin-1"))
        host = headers.get("host", [])
        origin = headers.get("origin", [])
        if len(host) != 1 or host[0] not in self.hosts:
            await _refuse(send, 421, "Invalid Host header: this server answers only as "
                                     + " or ".join(sorted(self.hosts)))
            return
        if len(origin) > 1 or (origin and not origin_allowed(origin[0])):
            await _refuse(send, 403, "Invalid Origin header: only loopback origins may call "
                                     "this server")
            return
        await self.app(scope, receive, send)


async def _refuse(send: Any, status: int, text: str) -> None:
    body = text.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def listen(address: str, port: int) -> socket.socket:
    """A listening socket on ``address``:``port`` (0: a free port)."""
    from dsh.core.errors import UsageError

    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {address} port {port}: {exc.strerror or exc}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def app_for(service: Service, address: str, port: int) -> Any:
    """The ASGI application: the SDK's streamable HTTP app behind :class:`Guard`."""
    from mcp.server.transport_security import TransportSecuritySettings

    from dsh_mcp.serve_server import build_server

    shown = f"[{address}]" if ":" in address else address
    hosts = {f"{shown}:{port}", f"localhost:{port}"}
    loopback = ("127.0.0.1", "localhost", "[::1]")
    origins = [f"{scheme}://{name}{port_}" for scheme in ("http", "https") for name in loopback
               for port_ in ("", ":*")]
    security = TransportSecuritySettings(enable_dns_rebinding_protection=True,
                                         allowed_hosts=sorted(hosts), allowed_origins=origins)
    server = build_server(service)
    inner = server.streamable_http_app(streamable_http_path=PATH, transport_security=security,
                                       host=address)
    return Guard(inner, hosts)


async def serve_http(service: Service, host: str, port: int) -> None:
    import uvicorn

    address = bind_address(host)
    sock = listen(address, port)
    port = sock.getsockname()[1]
    app = app_for(service, address, port)
    from dsh_mcp.process import escape_sdk_logging

    escape_sdk_logging()  # the SDK logs a refused Host or Origin: made terminal-safe
    shown = f"[{address}]" if ":" in address else address
    config = uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False,
                            timeout_graceful_shutdown=GRACEFUL)
    server = uvicorn.Server(config)
    sys.stderr.write(f"dsh: MCP server listening on http://{shown}:{port}{PATH} (agents: "
                     f"{', '.join(service.agents)}; mode {service.mode})\n")
    sys.stderr.flush()
    try:
        await server.serve(sockets=[sock])
    finally:
        sock.close()
