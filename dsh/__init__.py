"""dsh: run LLM agents as a tree of pluggy plugins.

The public API is small and imported lazily, so that ``import dsh`` (and ``dsh --help``) stays
cheap: ``hookimpl``, ``tool``, ``context``, ``App``, ``Agent``, the event base ``Event``, the
agent handle ``AgentHandle`` and plugin stashes ``Stash`` / ``StashKey``.

PYTEST_DONT_REWRITE: dsh ships a pytest plugin (``dsh.testing``, entry point ``pytest11``), so
pytest marks this package for assertion rewriting at start-up; this marker keeps pytest from
warning (an error under ``-W error``) when dsh was imported before pytest started.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

from dsh._version import __version__

if TYPE_CHECKING:
    from dsh.app import App
    from dsh.events import Event
    from dsh.hookspecs import hookimpl
    from dsh.runcontext import RunContext
    from dsh.runcontext import context
    from dsh.scope import AgentHandle
    from dsh.stash import Stash
    from dsh.stash import StashKey
    from dsh.tools import tool

__all__ = ["AgentHandle", "App", "Event", "RunContext", "Stash", "StashKey", "__version__",
           "context", "hookimpl", "tool"]

_LAZY = {
    "App": "dsh.app",
    "RunResult": "dsh.app",
    "RunContext": "dsh.runcontext",
    "context": "dsh.runcontext",
    "Event": "dsh.events",
    "hookimpl": "dsh.hookspecs",
    "tool": "dsh.tools",
    "AgentHandle": "dsh.scope",
    "Stash": "dsh.stash",
    "StashKey": "dsh.stash",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dsh' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
