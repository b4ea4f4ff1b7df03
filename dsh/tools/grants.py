"""Grants: the "always for this project" answers of the approval question, kept in dsh's own
config directory per project root (never in the workspace), listed and revoked with
``dsh permissions`` (docs/security.md, "Permission modes and approvals")."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING
from typing import Any

from dsh.core.errors import UsageError

if TYPE_CHECKING:
    from dsh.tools.approval import Ask

__all__ = ["add_grant", "grants_path", "load_grants", "matches", "revoke_grants"]



def grants_path() -> str:
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(xdg, "dsh", "permissions.json")


def load_grants() -> dict[str, list[dict[str, Any]]]:
    """``{project root: [grant, ...]}``; a grant is ``{"tool", "scope", "value", "granted"}``
    with ``scope`` ``command`` (that exact command line), ``program`` (any arguments),
    ``tool`` (any call of that tool) or ``path`` (writes under that path prefix)."""
    from dsh.config.trust import read_record
    from dsh.core.errors import ConfigError

    path = grants_path()
    try:
        data = read_record(path)
    except FileNotFoundError:
        return {}
    if not isinstance(data, dict) or not isinstance(data.get("projects"), dict):
        raise ConfigError(f"{path}: not a dsh permissions file (want {{\"version\": 1, "
                          "\"projects\": {...}}); `dsh permissions revoke --all` starts afresh")
    return data["projects"]


def _save(change: Any) -> Any:
    from dsh.config.trust import update_record

    return update_record(grants_path(), "projects", load_grants, change)


def add_grant(root: str, tool: str, scope: str, value: str) -> None:
    key = os.path.realpath(root)

    def change(projects: dict[str, Any]) -> None:
        held = projects.setdefault(key, [])
        grant = {"tool": tool, "scope": scope, "value": value}
        if not any({k: g.get(k) for k in grant} == grant for g in held):
            held.append({**grant, "granted": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})

    _save(change)


def revoke_grants(root: str | None, index: int | None = None) -> int:
    """Forget the grants of ``root`` (its ``index``-th only, from 1), or every grant when
    ``root`` is None; how many were forgotten."""

    def change(projects: dict[str, Any]) -> int:
        key = os.path.realpath(str(root))
        held = projects.get(key, [])
        if index is None:
            projects.pop(key, None)
            return len(held)
        if not 1 <= index <= len(held):
            raise UsageError(f"no grant {index} for {key} (it has {len(held)})")
        del held[index - 1]
        if not held:
            projects.pop(key, None)
        return 1

    if root is None:  # everything, a corrupt file too
        path = grants_path()
        if not os.path.lexists(path):
            return 0
        try:
            n = sum(len(v) for v in load_grants().values())
        except Exception:
            n = 0
        os.unlink(path)
        return n
    return int(_save(change))


def matches(grant: dict[str, Any], ask: Ask) -> bool:
    if grant.get("tool") != ask.tool:
        return False
    scope, value = grant.get("scope"), grant.get("value")
    if not isinstance(value, str):
        return False
    if scope == "command":
        return ask.action in ("command", "read", "outside") and value == ask.subject
    if scope == "program":
        return ask.action in ("command", "read") and value == ask.program
    if scope == "tool":  # any call of this tool (an MCP server's tool, a plugin's)
        return value == ask.tool
    if scope == "path":
        if ask.action != "write":
            return False
        from dsh.core.beneath import within

        subject = os.path.normpath(ask.subject)
        return not subject.startswith("..") and (value in ("", ".") or within(subject, value))
    return False
