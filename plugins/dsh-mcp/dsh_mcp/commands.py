"""``dsh mcp list | tools SERVER | refresh [SERVER]``: thin commands over the settings, the
cache and the client; ``dsh mcp serve``: dsh agents as an MCP server (:mod:`dsh_mcp.serve`,
imported only when it runs)."""

from __future__ import annotations

import click

from dsh_mcp import cache
from dsh_mcp.settings import McpSettings
from dsh_mcp.settings import Server

_agent_option = click.option("-a", "--agent", metavar="AGENT",
                             help="Use this agent's MCP settings (default: the config's agent).")


def _settings(agent: str | None) -> tuple[str, McpSettings]:
    import attrs

    from dsh.core.errors import UsageError
    from dsh.host.scope import AgentInfo
    from dsh_mcp import settings_for

    app = click.get_current_context().obj.app
    cfg = app.config
    name = agent or cfg.agent
    if name not in cfg.agent_names():
        raise UsageError(f"unknown agent {name!r} (configured: {', '.join(cfg.agent_names())})")
    acfg = cfg.agent_config(name)
    info = AgentInfo(name=name, model="", settings=attrs.asdict(acfg),
                     plugins=tuple(acfg.plugins) if acfg.plugins is not None else None,
                     all_plugin_settings=cfg.plugins)
    return name, settings_for(info)


def _server(settings: McpSettings, name: str, agent: str) -> Server:
    from dsh.core.errors import UsageError

    if name not in settings.servers:
        known = ", ".join(settings.servers) or "none"
        raise UsageError(f"agent {agent!r} has no mcp server {name!r} (configured: {known})")
    return settings.servers[name]


def _esc(text: str) -> str:
    from dsh.cli.escape import escape_controls

    return escape_controls(text)


@click.group()
def mcp() -> None:
    """MCP servers: their status, tools and cached tool lists; dsh as one (dsh-mcp)."""


@mcp.command("list")
@_agent_option
def list_servers(agent: str | None) -> None:
    """List the agent's MCP servers: transport, command or URL, cached tool list."""
    name, settings = _settings(agent)
    if not settings.servers:
        click.echo(f"agent {name} has no mcp servers (configure [plugins.mcp] servers)", err=True)
        return
    for server in settings.servers.values():
        data = cache.load(server)
        if data is None:
            status = "tools not listed yet (dsh mcp refresh)"
        else:
            info = data.get("server_info") or {}
            shown = [t["name"] for t in data["tools"] if server.wants(t.get("name", ""))]
            status = (f"{len(shown)} tools cached {data.get('listed_at', '')} from "
                      f"{info.get('name', '?')} {info.get('version', '')}".rstrip())
        click.echo(_esc(f"{server.name}\t{server.transport}\t{server.describe()}\t{status}"))


@mcp.command("tools")
@click.argument("server")
@_agent_option
def list_tools(server: str, agent: str | None) -> None:
    """List SERVER's tools as the agent sees them (``mcp__SERVER__TOOL``), from the cache
    (listed now when there is none)."""
    from dsh_mcp import tool_list

    name, settings = _settings(agent)
    srv = _server(settings, server, name)
    data = tool_list(srv)
    for entry in data["tools"]:
        tool = entry.get("name", "")
        first = str(entry.get("description") or "").strip().splitlines()[:1]
        mark = "" if srv.wants(tool) else "  (filtered out by tools_allow/tools_deny)"
        click.echo(_esc(f"{srv.tool_name(tool)}\t{first[0] if first else ''}{mark}"))


@mcp.command("refresh")
@click.argument("server", required=False)
@_agent_option
def refresh(server: str | None, agent: str | None) -> None:
    """Start SERVER (default: every server of the agent), list its tools and cache them."""
    from dsh.core.errors import ToolError
    from dsh.core.redact import redact
    from dsh_mcp import tool_list

    name, settings = _settings(agent)
    servers = [_server(settings, server, name)] if server else list(settings.servers.values())
    failed = 0
    for srv in servers:
        try:
            data = tool_list(srv, refresh=True)
        except ToolError as exc:
            failed += 1
            click.echo(_esc(f"dsh: error: {redact(str(exc))}"), err=True)
            continue
        info = data.get("server_info") or {}
        click.echo(_esc(f"{srv.name}: {len(data['tools'])} tools from {info.get('name', '?')} "
                        f"{info.get('version', '')}".rstrip()))
    if failed:
        raise SystemExit(1)


@mcp.command("serve")
@click.option("--http", is_flag=True,
              help="Serve streamable HTTP on a loopback address (default: stdio).")
@click.option("--host", metavar="HOST",
              help="With --http: the loopback address to listen on (default 127.0.0.1; "
                   "localhost and ::1 too; any other is refused).")
@click.option("--port", type=click.IntRange(0, 65535), metavar="N",
              help="With --http: the port (default 8765; 0: a free one, printed on stderr).")
@click.option("-a", "--agent", "agents", multiple=True, metavar="AGENT",
              help="An agent the clients may run (repeatable; default: the config's agent, "
                   "the first is the default).")
@click.option("--mode", default="ask", show_default=True, metavar="MODE",
              help="Permission mode of every run: read-only, plan, ask, auto-edit or "
                   "full-auto. What it leaves open is refused: there is no one to ask.")
@click.option("--root", metavar="DIR", type=click.Path(file_okay=False, exists=True),
              help="The workspace: the server's working directory (default: the current one).")
def serve(http: bool, host: str | None, port: int | None, agents: tuple[str, ...], mode: str,
          root: str | None) -> None:
    """Serve dsh agents as MCP tools (run, resume, fork, search) for other agents and MCP
    clients: over stdio, or with --http streamable HTTP on loopback."""
    from dsh_mcp.serve import start

    start(click.get_current_context().obj.app, agents=agents, mode=mode, root=root, http=http,
          host=host, port=port)
