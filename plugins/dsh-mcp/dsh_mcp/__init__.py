"""dsh-mcp: the tools of Model Context Protocol servers as dsh tools, per agent.

Installed, it is found through the ``dsh`` entry point ``mcp`` and reaches only the agents that
enable it. Its settings come from ``[plugins.mcp]``, overlaid (key by key) with
``[agents.NAME.plugin_settings.mcp]``:

``servers.NAME``
    ``{command, args, env, cwd}`` (a stdio server) or ``{url, headers}`` (streamable HTTP),
    plus optional ``timeout`` (seconds per call), ``tools_allow`` and ``tools_deny`` (the
    server's own tool names);
``mcp_json``
    a path or list of paths of ``mcpServers`` files (Claude Code's ``.mcp.json``, Cursor's
    ``mcp.json``) read as they are; relative to the current directory; missing files skipped;
    one inside the project is used only once its content is trusted, and its servers are
    confined to the project (:mod:`dsh_mcp.project`);
``use``
    the names of the servers this agent uses (default: all);
``timeout`` / ``startup_timeout``
    defaults for every server (60 s per call, 30 s to start and initialize);
``sandbox``
    the kernel sandbox of stdio servers (a policy name or table, as ``[sandbox]``; per server
    too, ``servers.NAME.sandbox``); default ``off``, ``workspace-write`` for a project's
    servers (docs/mcp.md, "Sandbox");
``approve``
    how dsh's approval service treats a server's tool calls (docs/mcp.md, "Approval"; per
    server too, ``servers.NAME.approve``, over the plugin-wide one): ``"read"`` (the tool only
    reads: it runs in every mode), ``"ask"`` (the default: a call of a stdio server confined
    without network is a ``command``, of any other an ``outside`` action) or ``"deny"``
    (always refused), or a table of the server's own tool names (``"*"``: the others) to
    these. An ``mcpServers`` file cannot set it, and a project's server is never made
    ``"read"`` by the plugin-wide one.

Each server tool becomes ``mcp__SERVER__TOOL``. Tool lists are cached on disk
(:mod:`dsh_mcp.cache`), so assembly starts no server once a list is cached; the first
assembly without a cache starts the server once to list its tools. See docs/mcp.md.

Importing this module imports neither ``mcp`` nor ``asyncio``: runs that call no MCP tool do
not pay for them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any

from dsh.hookspecs import hookimpl
from dsh_mcp import cache
from dsh_mcp.settings import McpSettings
from dsh_mcp.settings import Server
from dsh_mcp.settings import parse_settings
from dsh_mcp.validation import make_validator

if TYPE_CHECKING:
    import click

    from dsh.host.scope import AgentInfo

__version__ = "0.1.0"
__all__ = ["McpSettings", "Server", "__version__", "register_commands", "register_tools",
           "settings_for", "tool_list"]


def settings_for(agent: AgentInfo) -> McpSettings:
    return parse_settings(agent.plugin_settings("mcp"), where=f"plugins.mcp, agent {agent.name}")


def tool_list(server: Server, *, refresh: bool = False) -> dict[str, Any]:
    """The server's cached listing; fetched (server started, ``tools/list``) and cached when
    there is none or ``refresh`` is set. Raises :class:`dsh.core.errors.ToolError` (one line naming
    the server, with its stderr tail) when it cannot be fetched; that failure is remembered
    for :data:`dsh_mcp.cache.FAILED_FOR` seconds, so the runs in that time do not wait for
    the server again (``refresh`` tries at once)."""
    from dsh.core.errors import Cancelled
    from dsh.core.errors import ToolError

    if not refresh:
        data = cache.load(server)
        if data is not None:
            return data
        failed = cache.load_failure(server)
        if failed is not None:
            raise ToolError(failed)
    from dsh_mcp import client

    pool = client.pool()
    conn = pool.connection(server)
    try:
        tools = pool.run(conn.list_tools(), timeout=server.startup_timeout + server.timeout + 5)
    except Cancelled:
        raise
    except Exception as exc:  # noqa: BLE001 - an unreadable answer is one line, not a traceback
        if not isinstance(exc, ToolError):
            exc = ToolError(f"mcp server {server.name!r} sent a tools/list answer dsh cannot "
                            f"read: {client.one_line(exc)}")
        cache.store_failure(server, str(exc))
        raise exc from None
    return cache.store(server, tools, conn.server_info, conn.protocol)


@hookimpl
def register_tools(register: Callable[..., None], agent: AgentInfo) -> None:
    """Register the tools of every server the agent uses, from their cached lists. A tool
    whose dsh name another already has (``a.b`` and ``a_b`` are both ``mcp__S__a_b``) is left
    out with a warning naming both: the rest of the run is not affected."""
    from dsh.core.errors import PluginError
    from dsh.core.errors import ToolError

    taken: dict[str, str] = {}  # dsh name -> "server 'S' tool 'T'"
    for server in settings_for(agent).servers.values():
        try:
            listing = tool_list(server)
        except ToolError as exc:
            # Without a list there are no schemas to show the model; the run goes on without
            # this server's tools, and says so on one line.
            _warn(f"{exc}; its tools are not available to agent {agent.name}")
            continue
        for entry in listing["tools"]:
            name = entry.get("name")
            if not isinstance(name, str) or not server.wants(name):
                continue
            dsh_name = server.tool_name(name)
            which = f"server {server.name!r} tool {name!r}"
            if dsh_name in taken:
                _warn(f"mcp: {which} is left out: its name {dsh_name} is already that of "
                      f"{taken[dsh_name]}")
                continue
            schema = entry.get("inputSchema")
            if not isinstance(schema, dict):
                schema = {"type": "object"}
            try:
                register(_caller(server, name), name=dsh_name,
                         description=_description(entry, name), parameters=schema,
                         validator=make_validator(schema))
            except PluginError as exc:  # the name is another plugin's tool
                _warn(f"mcp: {which} is left out: {exc}")
                continue
            taken[dsh_name] = which


def _description(entry: dict[str, Any], name: str) -> str:
    """The server's description with its control characters made visible (``dsh tools``
    prints it; the model sees the same, recorded text)."""
    from dsh.cli.render import escape_controls

    return escape_controls(str(entry.get("description") or entry.get("title") or name))


def _warn(text: str) -> None:
    """One ``dsh: warning:`` line on stderr: redacted, control characters made visible."""
    from dsh.cli.render import escape_controls
    from dsh.core.redact import redact

    sys.stderr.write(f"dsh: warning: {escape_controls(redact(text), newlines=False)}\n")


def _caller(server: Server, tool: str) -> Callable[..., str]:
    def call(**arguments: Any) -> str:
        from dsh.core.errors import ToolError
        from dsh_mcp import client
        from dsh_mcp.results import cap
        from dsh_mcp.results import to_output

        _approve(server, tool, arguments)  # before anything starts; raises when refused
        _cleanup_after_run()
        _record_sandbox(server)
        pool = client.pool()
        conn = pool.connection(server)
        # The SDK's own read timeout cancels the request (notifications/cancelled); the wait
        # here is a backstop a little longer than a start plus that timeout.
        result = pool.run(conn.call(tool, arguments),
                          timeout=server.startup_timeout + server.timeout + 5)
        try:
            return cap(conn.clean(to_output(result)), server.max_output)
        except ToolError as exc:  # an isError result: its text, cleaned and capped the same way
            raise ToolError(cap(conn.clean(str(exc)), server.max_output)) from None

    call.__name__ = server.tool_name(tool)
    return call


#: The most characters of a call (tool name and JSON arguments) shown and recorded as the
#: approval's subject.
SUBJECT_CAP = 2000


def _approve(server: Server, tool: str, arguments: dict[str, Any]) -> None:
    """Ask dsh's approval service (:mod:`dsh.tools.approval`) whether this call may run
    (docs/mcp.md, "Approval"): a ``read`` action for a tool the person's ``approve`` says
    only reads; ``command`` for a stdio server confined by the kernel sandbox without
    network; ``outside`` for any other (unconfined, networked, HTTP: its effects are outside
    dsh's sandbox). ``approve = "deny"`` refuses it, recorded like any refusal."""
    import json
    import os

    from dsh.tools import approval

    rule, setting = server.approval(tool)
    name = server.tool_name(tool)
    policy = server.sandbox if server.transport == "stdio" else None
    confined = policy is not None and not policy.network
    action = "read" if rule == "read" else "command" if confined else "outside"
    shown = json.dumps(arguments, ensure_ascii=False, sort_keys=True, default=str)
    subject = f"{tool} {shown}"
    if len(subject) > SUBJECT_CAP:
        subject = subject[:SUBJECT_CAP - 30] + f" … [{len(subject)} characters]"
    sandbox = policy.describe() if policy is not None else (
        "off (unconfined)" if server.transport == "stdio" else "none: a remote server")
    detail = f"server {server.name} ({server.transport}, sandbox {sandbox})\n{server.describe()}"
    root = os.path.abspath(server.workspace or server.cwd or os.getcwd())
    reason = ("an MCP server's tool" if confined or rule == "read"
              else "an MCP server's tool, outside dsh's sandbox")
    ask = approval.Ask(tool=name, action=action, subject=subject, root=root, detail=detail,
                       program=name, reason=reason, verb="call", always="tool")
    if rule == "deny":
        decision = approval.Decision(False, "config", f"the person's config refuses it "
                                                      f"({setting} = \"deny\")")
        approval.note(ask, decision)
        raise approval.refusal(ask, decision)
    approval.request(ask)


def _record_sandbox(server: Server) -> None:
    """``x/mcp/sandbox`` with the call's id: what confines the server that runs this call
    (``off`` for an HTTP server or an unconfined one), for ``dsh sessions show``."""
    from dsh.tools.registry import current_call

    try:
        call = current_call()
    except LookupError:
        return
    from dsh.core.errors import NoRunContext
    from dsh.ledger.plugin_events import record_event

    policy = server.sandbox
    record: dict[str, Any] = {"policy": "off", "backend": "none"}
    if policy is not None:
        record = {**policy.record(), "workspace": server.workspace or server.cwd or ".",
                  "backend": "landlock"}
    try:
        record_event("mcp", "sandbox", {"call_id": call.call.id, "tool": call.call.name,
                                        "server": server.name, **record})
    except NoRunContext:
        return


def _cleanup_after_run() -> None:
    """Once per run that calls an MCP tool: a cleanup that stops this process's servers if
    the run was aborted (abort(), Ctrl-C twice, SIGTERM/SIGHUP, --timeout). ``dsh run`` then
    leaves with ``os._exit`` (it does not wait for tool threads), so the ``atexit`` handler
    that stops them after a normal ending would not run. A run that ends normally leaves
    them running for the next run of the process (``dsh chat``, a library user)."""
    from dsh.host.runcontext import current_or_none

    ctx = current_or_none()
    if ctx is None or "dsh_mcp" in ctx.data:
        return
    ctx.data["dsh_mcp"] = True

    def after() -> None:
        if ctx.cancel.cancelled:
            from dsh_mcp import client

            client.shutdown()

    ctx.add_cleanup(after)


@hookimpl
def register_commands(cli: click.Group) -> None:
    from dsh_mcp.commands import mcp

    cli.add_command(mcp)
