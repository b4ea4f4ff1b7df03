"""``dsh llm models`` and ``dsh llm tools``: what the installed llm plugins offer.

Imported only when a plugin command is looked up; llm itself only when one of them runs.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

import click


@click.group("llm")
def llm_group() -> None:
    """Models and tools of the llm CLI's plugins (dsh-llm)."""


@llm_group.command("models")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
def models_command(as_json: bool) -> None:
    """List llm's models as dsh model ids (llm:MODEL_ID), with their plugin and aliases."""
    from dsh_llm import listing

    key = listing.cache_key()
    rows: list[dict[str, Any]] = listing.rows()
    listing.store(key, rows)  # `dsh models` reads it
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    width = max((len(r["id"]) for r in rows), default=0)
    for r in rows:
        extras = []
        if r["aliases"]:
            extras.append("aliases: " + ", ".join(r["aliases"]))
        if r["tools"]:
            extras.append("tools")
        if r["key"]:
            extras.append(f"key: {r['key']}")
        if not r["sync"]:
            extras.append("async only: not usable")
        tail = f"  ({'; '.join(extras)})" if extras else ""
        click.echo(f"{r['id']:<{width}}  [{r['plugin']}]{tail}")


@llm_group.command("tools")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
def tools_command(as_json: bool) -> None:
    """List the tools and toolboxes of llm tool plugins (select them with [plugins.llm] tools)."""
    from dsh_llm.model import import_llm

    llm = import_llm()
    rows: list[dict[str, Any]] = []
    tool: Any
    for name, tool in llm.get_tools().items():
        if inspect.isclass(tool):
            box: Any = tool
            methods = [t.name for t in box.method_tools()]
            rows.append({"name": name, "kind": "toolbox", "plugin": box.plugin or "",
                         "description": (box.__doc__ or "").strip().split("\n")[0],
                         "tools": methods})
        else:
            rows.append({"name": name, "kind": "tool", "plugin": tool.plugin or "",
                         "description": (tool.description or "").strip().split("\n")[0],
                         "tools": [name]})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        what = (f"toolbox: {', '.join(r['tools'])}" if r["kind"] == "toolbox"
                else r["description"])
        click.echo(f"{r['name']}  [{r['plugin']}]  {what}")
