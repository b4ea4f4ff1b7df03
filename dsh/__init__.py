"""dsh: run LLM agents as a tree of pluggy plugins.

The public API is small and imported lazily, so that ``import dsh`` (and ``dsh --help``) stays
cheap: ``hookimpl``, ``tool``, ``context``, ``App``, ``Agent``, the event base ``Event``, the
agent handle ``AgentHandle``, plugin stashes ``Stash`` / ``StashKey`` and recorded state
``StateKey`` (issue 25).

PYTEST_DONT_REWRITE: dsh ships a pytest plugin (``dsh.testing``, entry point ``pytest11``), so
pytest marks this package for assertion rewriting at start-up; this marker keeps pytest from
warning (an error under ``-W error``) when dsh was imported before pytest started.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

from dsh import _compat
from dsh._version import __version__

_compat.install()  # old module paths (dsh.events, dsh.app…) still import, for one release

if TYPE_CHECKING:
    from dsh.core.messages import Change
    from dsh.hookspecs import hookimpl
    from dsh.host.runcontext import RunContext
    from dsh.host.runcontext import context
    from dsh.host.scope import AgentHandle
    from dsh.host.stash import Stash
    from dsh.host.stash import StashKey
    from dsh.ledger.events import Event
    from dsh.ledger.state import StateKey
    from dsh.run.app import App
    from dsh.tools.approval import Ask
    from dsh.tools.approval import Decision
    from dsh.tools.approval import request_approval
    from dsh.tools.registry import tool

__all__ = ["AgentHandle", "App", "Ask", "Change", "Decision", "Event", "RunContext", "Stash", "StashKey",
           "StateKey", "__version__",
           "context", "hookimpl", "request_approval", "tool"]

_LAZY = {
    "App": "dsh.run.app",
    "RunResult": "dsh.run.app",
    "RunContext": "dsh.host.runcontext",
    "context": "dsh.host.runcontext",
    "Event": "dsh.ledger.events",
    "hookimpl": "dsh.hookspecs",
    "tool": "dsh.tools.registry",
    "AgentHandle": "dsh.host.scope",
    "Stash": "dsh.host.stash",
    "StashKey": "dsh.host.stash",
    "StateKey": "dsh.ledger.state",
    "Ask": "dsh.tools.approval",
    "Change": "dsh.core.messages",
    "Decision": "dsh.tools.approval",
    "request_approval": "dsh.tools.approval",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dsh' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
