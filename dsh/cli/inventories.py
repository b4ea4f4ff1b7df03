"""The inventories of ``dsh plugins``, ``tools``, ``models`` and ``agents`` (docs/cli.md): one
``*_rows``/``*_report`` function builds the data a command prints with ``--json``, one
``*_text`` function the plain view of it. The commands are
:mod:`dsh.cli.commands.inventory`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import click


def plugin_rows(app: Any, commands: dict[str, list[str]], builtins: bool) -> list[dict[str, Any]]:
    """One row per plugin: name, distribution and version, hooks it implements, agents that
    use it, commands it adds, whether it is disabled, and its load error."""
    from dsh.core.errors import DshError
    from dsh.host.manager import BUILTIN_PLUGINS

    pm = app.pm
    using: dict[str, list[str]] = {}
    for name in app.config.agent_names():
        try:
            for p in app.agent(name).plugin_names:
                using.setdefault(p, []).append(name)
        except DshError as exc:
            click.echo(f"dsh: warning: agent {name}: {exc}", err=True)
    rows: list[dict[str, Any]] = [
        {"name": name, "builtin": True, "dist": "", "version": "", "agents": ["*"],
         "error": None} for name in (BUILTIN_PLUGINS if builtins else ())
    ]
    rows += [{"name": r.name, "builtin": False, "dist": r.dist, "version": r.version,
              "agents": using.get(r.name, []), "error": r.error} for r in app.plugins]
    for row in rows:
        obj = pm.get_plugin(row["name"])
        row["disabled"] = pm.is_blocked(row["name"])
        row["hooks"] = sorted(h.name for h in pm.get_hookcallers(obj) or ()) if obj else []
        row["commands"] = sorted(commands.get(row["name"], []))
    return rows


def plugins_text(rows: list[dict[str, Any]]) -> str:
    lines = []
    for row in rows:
        origin = "built-in" if row["builtin"] else " ".join(
            x for x in (row["dist"], row["version"]) if x) or "module"
        lines.append(f"{row['name']}  {origin}{' (disabled)' if row['disabled'] else ''}")
        lines.append(f"  hooks: {', '.join(row['hooks']) or '-'}")
        lines.append(f"  agents: {', '.join(row['agents']) or '-'}")
        if row["commands"]:
            lines.append(f"  commands: {', '.join(row['commands'])}")
        if row["error"]:
            lines.append(f"  error: {row['error']}")
    return "\n".join(lines)


def tool_rows(tools: Iterable[Any]) -> list[dict[str, Any]]:
    return [{"name": t.name, "plugin": t.plugin, "description": t.description,
             "parameters": t.parameters} for t in tools]


def tools_text(rows: list[dict[str, Any]]) -> str:
    """``name(param: type, optional?: type)  [plugin]`` and the description's first line.
    Every piece comes from a plugin or a server (an MCP tool's schema): each is shown with
    its control characters escaped and on its own line, never raw to the terminal."""
    from dsh.cli.escape import escape_controls

    def e(value: Any) -> str:
        return escape_controls(str(value), newlines=False)

    lines = []
    for t in rows:
        props = t["parameters"].get("properties", {})
        required = set(t["parameters"].get("required", ()))
        params = ", ".join(
            f"{e(n)}{'' if n in required else '?'}: "
            f"{e(s.get('type', 'any') if isinstance(s, dict) else 'any')}"
            for n, s in props.items())
        lines.append(f"{e(t['name'])}({params})  [{e(t['plugin'])}]")
        if t["description"]:
            lines.append(f"  {e(t['description'].splitlines()[0])}")
    return "\n".join(lines)


def models_report(app: Any) -> dict[str, Any]:
    """The adapters, the models adapters list (an adapter that registered a listing: dsh-llm
    lists the models of the installed llm plugins, each with its plugin), the configured
    ones and the default. A listing that fails is one warning, the rest is still shown."""
    from dsh.cli.shared import warn

    listed: list[dict[str, Any]] = []
    for e in app.models.values():
        if e.listing is None:
            continue
        try:
            rows = e.list_models()
        except Exception as exc:  # noqa: BLE001 - a plugin's listing: named, not fatal
            warn(f"cannot list the models of adapter {e.prefix!r} ({e.plugin}): "
                 f"{type(exc).__name__}: {exc}")
            continue
        listed += [{"id": str(r.get("id")), "plugin": str(r.get("plugin", "")),
                    "adapter": e.prefix, **{k: v for k, v in r.items()
                                            if k not in ("id", "plugin", "adapter")}}
                   for r in rows if isinstance(r, dict)]
    return {
        "default": app.default_model.id,
        "default_why": app.default_model.why,
        "adapters": [{"prefix": e.prefix, "plugin": e.plugin, "description": e.description}
                     for e in app.models.values()],
        "models": listed,
        "configured": [{"id": k, "adapter": v.get("adapter", k.partition(":")[0])}
                       for k, v in app.config.models.items()],
    }


def models_text(report: dict[str, Any]) -> str:
    adapters = report["adapters"]
    width = max((len(a["prefix"]) for a in adapters), default=0)
    lines = [f"{a['prefix'].ljust(width)}  {a['description']}  [{a['plugin']}]"
             for a in adapters]
    listed = report.get("models", [])
    if listed:
        width = max(len(m["id"]) for m in listed)
        lines += [f"{m['id'].ljust(width)}  [{m['plugin']}]" for m in listed]
    lines += [f"{c['id']}  (configured, adapter {c['adapter']})" for c in report["configured"]]
    lines.append(f"default: {report['default']} ({report['default_why']})")
    return "\n".join(lines)


def agent_rows(app: Any) -> list[dict[str, Any]]:
    rows = []
    _ = app.pm  # agents plugins provide (register_agents) are merged into the config
    for name in app.config.agent_names():
        a = app.agent(name)
        rows.append({"name": name, "default": name == app.config.agent, "model": a.model_id,
                     "max_steps": a.max_steps, "plugins": list(a.plugin_names),
                     "tools": list(a.tools),
                     "prompt": [{"plugin": p.plugin, "name": p.name, "order": p.order}
                                for p in a.prompt_parts]})
    return rows


def agents_text(rows: list[dict[str, Any]]) -> str:
    lines = []
    for r in rows:
        lines.append(f"{r['name']}{' (default)' if r['default'] else ''}")
        lines.append(f"  model: {r['model']}  max_steps: {r['max_steps']}")
        lines.append(f"  plugins: {', '.join(r['plugins']) or '-'}")
        lines.append(f"  tools: {', '.join(r['tools']) or '-'}")
        parts = [f"{p['plugin']}:{p['name'] or '-'}@{p['order']}" for p in r["prompt"]]
        lines.append(f"  prompt: {', '.join(parts) or '-'}")
    return "\n".join(lines)
