"""The protocol side of ``dsh mcp serve``: the MCP SDK's low-level ``Server`` with the tools of
:mod:`dsh_mcp.serve` (``tools/list``, ``tools/call``), served over stdio (:func:`serve_stdio`)
or, through :mod:`dsh_mcp.serve_http`, streamable HTTP.

A call runs in a worker thread (a dsh turn is synchronous); its progress messages travel to
the client as ``notifications/progress`` on the caller's ``progressToken``, in order and
before the result. A client that cancels the request (``notifications/cancelled``) aborts the
turn, which closes its ledger as any abort does. A call that fails (bad arguments, an unknown
agent or session, a model error, a budget) is a tool result with ``isError`` and the reason:
the server keeps serving.

Over stdio the SDK's transport serves the protocol from a private copy of the standard output
and points file descriptor 1 at standard error, so nothing else the process writes (a
plugin's print, a library's warning) can reach the protocol stream.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError

from dsh_mcp.serve import Service
from dsh_mcp.serve import ToolFailure


def build_server(service: Service) -> Server[Any]:
    """The SDK server answering with ``service``'s tools."""
    from dsh_mcp import __version__

    listed = [types.Tool.model_validate(t) for t in service.schemas.values()]

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listed)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        name = params.name
        if name not in service.schemas:
            raise MCPError(types.INVALID_PARAMS, f"unknown tool {ascii(name[:100])} (this server "
                                                 f"has {', '.join(service.schemas)})")
        arguments = params.arguments or {}
        try:
            service.check(name, arguments)
            data = await _in_thread(service, name, arguments, ctx)
        except ToolFailure as exc:
            return _failure(exc)
        import json

        data = clean(data)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=_text(name, data, json))],
            structured_content=data)

    return Server("dsh", version=__version__, title="dsh agents",
                  instructions=("Delegate work to dsh agents: run starts a session, resume "
                                "continues one, fork branches one, search finds them."),
                  on_list_tools=list_tools, on_call_tool=call_tool,
                  get_tool_input_schema=lambda tool: (service.schemas.get(tool) or {}).get(
                      "inputSchema"))


def _text(name: str, data: dict[str, Any], json: Any) -> str:
    """The result's text content: a run's answer then its session, else the JSON."""
    if name in ("run", "resume"):
        return f"{data['output']}\n\n[dsh session {data['session']}]"
    return json.dumps(data, ensure_ascii=False, indent=1)


def _failure(exc: ToolFailure) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=clean(str(exc)))],
                                structured_content=clean(exc.data), is_error=True)


def clean(value: Any) -> Any:
    """``value`` with every string encodable as UTF-8: a lone surrogate (valid in JSON's
    ``\\udcff``, echoed back from a client's argument) is written as its escape, since the
    transport cannot encode it and the answer would be lost."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {clean(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


async def _in_thread(service: Service, name: str, arguments: dict[str, Any],
                     ctx: Any) -> dict[str, Any]:
    """``service.call`` in a worker thread, its progress messages sent as they come (before
    the result), the turn aborted when the request is cancelled."""
    from dsh.host.runcontext import CancelToken

    loop = asyncio.get_running_loop()
    send, receive = anyio.create_memory_object_stream[str](math.inf)
    cancel = CancelToken()

    def push(message: str) -> None:
        try:
            send.send_nowait(message)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # the call has ended (a late message of an aborted turn)

    def progress(message: str) -> None:
        try:
            loop.call_soon_threadsafe(push, message)
        except RuntimeError:  # the loop is closed: the server is stopping
            pass

    async def drain() -> None:
        count = 0
        async with receive:
            async for message in receive:
                count += 1
                try:
                    await ctx.session.report_progress(count, None, message)
                except Exception:  # noqa: BLE001,S112 - a client gone does not stop the turn
                    continue

    data: dict[str, Any] = {}
    failure: ToolFailure | None = None
    async with anyio.create_task_group() as group:
        group.start_soon(drain)
        try:
            data = await anyio.to_thread.run_sync(service.call, name, arguments, progress,
                                                  cancel, abandon_on_cancel=True)
        except anyio.get_cancelled_exc_class():
            cancel.cancel("the MCP client cancelled the call")
            raise
        except ToolFailure as exc:
            failure = exc
        except Exception as exc:  # noqa: BLE001 - a bug is this call's error, not the server's
            failure = ToolFailure(_unexpected(name, exc))
        finally:
            # After every message already queued by the thread (call_soon is in order).
            loop.call_soon(send.close)
    if failure is not None:
        raise failure
    return data


def _unexpected(name: str, exc: BaseException) -> str:
    """One line on stderr (with the traceback) and the result's text."""
    import sys
    import traceback

    from dsh.core.redact import redact

    text = redact(f"{name}: unexpected error: {type(exc).__name__}: {exc}")
    sys.stderr.write(redact("dsh: error: " + "".join(traceback.format_exception(exc))))
    return text


async def serve_stdio(service: Service) -> None:
    from mcp.server.stdio import stdio_server

    from dsh_mcp.process import escape_sdk_logging

    server = build_server(service)
    escape_sdk_logging()  # what the SDK logs may quote a client: made terminal-safe
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())
