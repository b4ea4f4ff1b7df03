"""The MCP SDK's async client inside dsh's synchronous core.

One asyncio event loop runs in one daemon thread (``dsh-mcp-loop``), owned by the process-wide
:class:`Pool`; tool calls are submitted to it with ``asyncio.run_coroutine_threadsafe`` and
waited for in the tool's thread. Each server config (:attr:`Server.key`) has at most one
:class:`Connection` per process, shared by every app, agent, session and sub-agent that uses
it. The protocol is the SDK's (``ClientSession`` over ``stdio_client`` or
``streamable_http_client``); nothing here speaks JSON-RPC.

Why one pool per process rather than one per App: the issue asks for a server "started at most
once per process per config" and dsh's App has no close hook; the pool is closed by an
``atexit`` handler (dsh's CLI turns SIGTERM/SIGHUP/Ctrl-C into a normal exit, so it runs
then too), by :func:`shutdown`, and a run's cleanup cancels that run's unfinished calls.

Importing this module imports asyncio (~10 ms); it is imported only when a server is used.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import os
import threading
from typing import Any

from dsh.core.errors import Cancelled
from dsh.core.errors import ToolError
from dsh.core.redact import redact
from dsh_mcp.process import StderrTail
from dsh_mcp.settings import Server

#: Seconds an exiting process waits for its servers to stop (the SDK's own escalation,
#: stdin close → SIGTERM → SIGKILL, takes up to ~4 s per stuck server, run concurrently).
CLOSE_TIMEOUT = 10.0
STDERR_TAIL = 400


class ServerFailed(ToolError):
    """A server could not be started or reached: one line naming it (and its stderr tail)."""


class Connection:
    """One server: started on first use, restarted once if it dies, stopped by the pool."""

    def __init__(self, server: Server, pool: Pool) -> None:
        self.server = server
        self.pool = pool
        self.session: Any = None
        self.server_info: dict[str, Any] = {}
        self.protocol: str | None = None
        self.starts = 0
        self.broken = False
        self.failed: str | None = None  # why the last start failed
        self._task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._lock: asyncio.Lock | None = None
        self._errlog: StderrTail | None = None  # the server's stderr, bounded
        self._sandbox_temp: Any = None  # keeps a sandboxed server's private TMPDIR alive
        self._background: set[asyncio.Task[None]] = set()
        self.redactor: Any = None  # dsh.core.redact.Redactor of this server's secrets

    @property
    def state(self) -> str:
        if self.session is not None and not self.broken:
            return "running"
        if self.failed:
            return "failed"
        return "stopped" if self.starts else "not started"

    async def ensure(self) -> Any:
        """The live session, starting (or restarting once) the server."""
        task = self._task
        if self.session is not None and not self.broken and task is not None and not task.done():
            return self.session  # the common case, without the lock
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._task is not None and self._task.done():
                self.broken = True  # the connection ended on its own (the server exited)
            if self.session is not None and not self.broken:
                return self.session
            if self.failed is not None and self.starts >= 2:
                raise ServerFailed(f"mcp server {self.server.name!r} did not start: "
                                   f"{self.failed} (not retried again){self._tail()}")
            if self.starts and self.broken:
                await self._shutdown()
                if self.starts >= 2:
                    raise ServerFailed(
                        f"mcp server {self.server.name!r} stopped again after a restart; not "
                        f"restarting it in this process{self._tail()}")
            await self._start()
            return self.session

    async def _start(self) -> None:
        self.starts += 1
        self.broken = False
        self.failed = None
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        self._stop = asyncio.Event()
        self._task = loop.create_task(self._serve(ready), name=f"mcp-{self.server.name}")
        try:
            await asyncio.wait_for(asyncio.shield(ready), self.server.startup_timeout)
        except BaseException as exc:
            if not self._task.done():
                self._task.cancel()
                with contextlib.suppress(BaseException):
                    await self._task
            if isinstance(exc, asyncio.CancelledError):
                raise
            reason = (f"no answer to initialize within {self.server.startup_timeout:g}s"
                      if isinstance(exc, TimeoutError) else _describe(exc))
            self.failed = reason
            raise ServerFailed(f"mcp server {self.server.name!r} ({self.server.describe()}) "
                               f"did not start: {reason}{self._tail()}") from None

    async def _serve(self, ready: asyncio.Future[None]) -> None:
        from mcp import ClientSession

        server = self.server
        try:
            async with contextlib.AsyncExitStack() as stack:
                if server.transport == "stdio":
                    from mcp import StdioServerParameters
                    from mcp import stdio_client

                    from dsh_mcp.process import harden

                    harden()  # non-dumpable before the first server runs (docs/mcp.md)
                    if self._errlog is not None:
                        self._errlog.close()
                    self._errlog = StderrTail(asyncio.get_running_loop())
                    command, args = server.command, list(server.args)
                    env: dict[str, str] = {}
                    if server.sandbox is not None:  # the launcher confines it, then execs
                        from dsh.sandbox.spawn import wrap

                        # a project's server: the project root, whatever its cwd
                        root = server.workspace or os.path.realpath(server.cwd or os.getcwd())
                        argv, env, self._sandbox_temp = wrap(
                            [command, *args], server.sandbox, workspace=root)
                        command, args = argv[0], argv[1:]
                    params = StdioServerParameters(command=command, args=args,
                                                   env={**server_env(server), **env},
                                                   cwd=server.cwd)
                    streams = await stack.enter_async_context(
                        stdio_client(params, errlog=self._errlog.writer))
                    self._errlog.started()
                else:
                    from mcp.client.streamable_http import streamable_http_client
                    from mcp.shared._httpx_utils import create_mcp_http_client

                    http = await stack.enter_async_context(
                        create_mcp_http_client(headers=dict(server.headers)))
                    streams = await stack.enter_async_context(
                        streamable_http_client(server.url, http_client=http))
                from dsh_mcp.process import escape_sdk_logging

                escape_sdk_logging()  # the SDK's loggers exist now (they log server text)
                session = await stack.enter_async_context(
                    ClientSession(streams[0], streams[1], message_handler=self._on_message))
                result = await session.initialize()
                info = result.server_info
                self.server_info = {"name": info.name, "version": info.version}
                self.protocol = result.protocol_version
                self.session = session
                ready.set_result(None)
                assert self._stop is not None
                await self._stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception)
                                    else RuntimeError(_describe(exc)))
            else:
                self.broken = True
            if not isinstance(exc, Exception):
                raise
        finally:
            self.session = None

    async def _on_message(self, message: Any) -> None:
        import mcp_types

        if isinstance(message, mcp_types.ToolListChangedNotification):
            # Re-list and re-cache in the background: the next assembly (the next `dsh run`,
            # a new App) shows the new list, and its turn/start records the change (C3).
            task = asyncio.get_running_loop().create_task(self._relist())
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _relist(self) -> None:
        from dsh_mcp import cache

        with contextlib.suppress(Exception):
            tools = await self.list_tools()
            cache.store(self.server, tools, self.server_info, self.protocol)

    async def _shutdown(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        if self._stop is not None:
            self._stop.set()
        try:
            await asyncio.wait_for(task, CLOSE_TIMEOUT)
        except BaseException:  # noqa: BLE001 - stopping must go on whatever the server did
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        self.session = None

    async def list_tools(self) -> list[dict[str, Any]]:
        session = await self.ensure()
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            from mcp_types import PaginatedRequestParams

            page = await self._guard(session.list_tools(
                params=PaginatedRequestParams(cursor=cursor) if cursor else None))
            tools.extend(t.model_dump(mode="json", by_alias=True, exclude_none=True)
                         for t in page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools

    async def call(self, tool: str, arguments: dict[str, Any]) -> Any:
        session = await self.ensure()
        return await self._guard(session.call_tool(
            tool, arguments, read_timeout_seconds=self.server.timeout))

    async def _guard(self, awaitable: Any) -> Any:
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED
        from mcp_types import REQUEST_TIMEOUT

        try:
            return await awaitable
        except MCPError as exc:
            if exc.code == CONNECTION_CLOSED:
                self.broken = True
                raise ServerFailed(f"mcp server {self.server.name!r} closed the connection "
                                   f"(it will be restarted for the next call){self._tail()}"
                                   ) from None
            if exc.code == REQUEST_TIMEOUT:
                raise ToolError(f"mcp server {self.server.name!r} did not answer within "
                                f"{self.server.timeout:g}s (the call was cancelled)") from None
            raise ToolError(f"mcp server {self.server.name!r}: {redact(exc.message)}") from None
        except (OSError, EOFError) as exc:
            self.broken = True
            raise ServerFailed(f"mcp server {self.server.name!r}: {_describe(exc)}") from None

    def _tail(self) -> str:
        """``; stderr: …`` with the server's last stderr output, on one line."""
        from dsh.cli.render import escape_controls

        log = self._errlog
        if log is None:
            return ""
        text = log.text()[-4 * STDERR_TAIL:]
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        if not lines:
            return ""
        tail = " | ".join(lines)[-STDERR_TAIL:]
        # one line whatever the server wrote: its control characters made visible
        return f"; stderr: {escape_controls(redact(tail), newlines=False)}"

    def clean(self, text: str) -> str:
        """A tool output without this server's env/header values."""
        return self.redactor.redact_registered(text) if self.redactor is not None else text


class Pool:
    """The process's MCP event loop thread and its connections."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="dsh-mcp-loop", daemon=True)
        self._lock = threading.Lock()
        self.connections: dict[str, Connection] = {}
        self.closed = False
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def connection(self, server: Server) -> Connection:
        with self._lock:
            conn = self.connections.get(server.key)
            if conn is None:
                conn = self.connections[server.key] = Connection(server, self)
                conn.redactor = _register_secrets(server)
            return conn

    def submit(self, coro: Any) -> concurrent.futures.Future[Any]:
        if self.closed:
            coro.close()
            raise ToolError("mcp: the process is shutting down")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Any, timeout: float | None = None) -> Any:
        """Run ``coro`` on the loop and wait; the run's cancellation (``abort()``,
        ``--timeout``, Ctrl-C) cancels it, and with it the SDK sends
        ``notifications/cancelled`` for an in-flight request."""
        from dsh.host.runcontext import current_or_none

        fut = self.submit(coro)
        ctx = current_or_none()

        def cancel() -> None:
            fut.cancel()  # cancels the task on the loop; the SDK tells the server

        unregister = ctx.cancel.on_cancel(cancel) if ctx is not None else None
        try:
            return fut.result(timeout)
        except concurrent.futures.CancelledError:
            reason = ctx.cancel.reason if ctx is not None and ctx.cancel.cancelled else ""
            raise Cancelled(f"mcp call cancelled: {reason or 'aborted'}") from None
        except concurrent.futures.TimeoutError:
            raise ToolError(f"mcp call did not finish within {timeout:g}s") from None
        finally:
            if not fut.done():
                fut.cancel()
            if unregister is not None:
                unregister()

    def close(self) -> None:
        """Stop every server and the loop thread; idempotent."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            conns = list(self.connections.values())
        if self._thread.is_alive():
            async def stop_all() -> None:
                await asyncio.gather(*(c._shutdown() for c in conns), return_exceptions=True)

            fut = asyncio.run_coroutine_threadsafe(stop_all(), self.loop)
            with contextlib.suppress(BaseException):
                fut.result(CLOSE_TIMEOUT + 2)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)
        for conn in conns:
            if conn._errlog is not None:
                conn._errlog.close()


_pool: Pool | None = None
_pool_lock = threading.Lock()


def pool() -> Pool:
    """The process's pool, started on first use (and closed at exit)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool.closed:
            _pool = Pool()
            atexit.register(_pool.close)
        return _pool


def shutdown() -> None:
    """Stop every MCP server this process started (also done at exit)."""
    with _pool_lock:
        current = _pool
    if current is not None:
        current.close()


def running_pool() -> Pool | None:
    return _pool


def server_env(server: Server) -> dict[str, str]:
    """The server's environment: the allowlist dsh-shell gives commands (``PATH``, ``HOME``,
    locale, ``TERM``, ``TZ``, ``TMPDIR``…) plus the server's own ``env``; nothing else of
    dsh's environment (API keys) reaches it. (The SDK also adds its own short list: ``HOME``,
    ``LOGNAME``, ``PATH``, ``SHELL``, ``TERM``, ``USER``, all in the allowlist.)"""
    try:
        from dsh_shell.process import BASE_ENV
    except ImportError:  # dsh-shell not installed: the same list, kept in step by a test
        BASE_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE",  # noqa: N806
                    "LC_*", "TERM", "TZ", "TMPDIR")
    env = {}
    for key, value in os.environ.items():
        if key in BASE_ENV or any(p.endswith("*") and key.startswith(p[:-1])
                                  for p in BASE_ENV):
            env[key] = value
    env.update(server.env)
    return env


def _register_secrets(server: Server) -> Any:
    """env and header values (and values ``${VAR}`` expanded to) are secrets: registered with
    dsh.core.redact (so every error line,
    turn/end reason and log record hides them, in every encoding it knows), and returned as
    the server's own redactor, which its tool outputs go through."""
    from dsh.core import redact as r

    own = r.Redactor()
    for registry in (r.default, own):
        for value in [*server.env.values(), *server.headers.values(), *server.expanded]:
            registry.register(value)
        registry.register_headers(server.headers)
        registry.register_url(server.url)
    return own


def one_line(exc: BaseException, limit: int = 300) -> str:
    """A short line for an exception a server's answer caused (a pydantic validation error
    is many lines with links: its count and first problem)."""
    errors = getattr(exc, "errors", None)
    if callable(errors) and type(exc).__name__ == "ValidationError":
        try:
            found = errors()
            first = found[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            text = f"{len(found)} problem(s), first: {where}: {first.get('msg', '')}"
        except Exception:  # noqa: BLE001 - fall back to the plain description
            text = _describe(exc)
    else:
        text = _describe(exc)
    text = redact(" ".join(text.split()))
    return text if len(text) <= limit else text[:limit] + "…"


def _describe(exc: BaseException) -> str:
    """One line for an exception, unwrapping anyio's exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, FileNotFoundError):
        return f"command not found: {exc.filename or exc}"
    text = str(exc) or type(exc).__name__
    if not isinstance(exc, ToolError):
        text = f"{type(exc).__name__}: {text}"
    return redact(" ".join(text.split()))
