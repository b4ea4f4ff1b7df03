"""dsh: run LLM agents as a tree of pluggy plugins.

This module is dsh's public API for plugin authors and library users: every name in
:data:`__all__` (docs/api.md lists them, one line each). ``dsh.sandbox`` (confined processes)
and ``dsh.testing`` (the pytest plugin) are public modules too; every other module is private
and may move. The names are imported lazily, on first use, so that ``import dsh`` (and ``dsh
--help``) stays cheap.

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
    from dsh import sandbox
    from dsh.cli.shared import pass_app
    from dsh.config.declared import settings
    from dsh.core.errors import BudgetExceeded
    from dsh.core.errors import Cancelled
    from dsh.core.errors import ConfigError
    from dsh.core.errors import DshError
    from dsh.core.errors import DshWarning
    from dsh.core.errors import InvariantViolation
    from dsh.core.errors import LedgerError
    from dsh.core.errors import NoRunContext
    from dsh.core.errors import NoToolCall
    from dsh.core.errors import OutputSchemaError
    from dsh.core.errors import PluginError
    from dsh.core.errors import PluginWarning
    from dsh.core.errors import ProviderError
    from dsh.core.errors import SessionInUse
    from dsh.core.errors import ToolError
    from dsh.core.errors import UsageError
    from dsh.core.escape import escape_controls
    from dsh.core.messages import Change
    from dsh.hookspecs import hookimpl
    from dsh.host.runcontext import CancelToken
    from dsh.host.runcontext import Limits
    from dsh.host.runcontext import RunContext
    from dsh.host.runcontext import context
    from dsh.host.scope import AgentHandle
    from dsh.host.scope import NotInRun
    from dsh.host.stash import Stash
    from dsh.host.stash import StashKey
    from dsh.ledger.events import Event
    from dsh.ledger.plugin_events import OutsideRun
    from dsh.ledger.plugin_events import PluginEventError
    from dsh.ledger.state import StateError
    from dsh.ledger.state import StateKey
    from dsh.run.app import App
    from dsh.run.app import RunResult
    from dsh.tools.approval import Ask
    from dsh.tools.approval import Decision
    from dsh.tools.approval import request_approval
    from dsh.tools.registry import ToolInvocation
    from dsh.tools.registry import ToolOutcome
    from dsh.tools.registry import current_call
    from dsh.tools.registry import tool

__all__ = [
    "AgentHandle",
    "App",
    "Ask",
    "BudgetExceeded",
    "CancelToken",
    "Cancelled",
    "Change",
    "ConfigError",
    "Decision",
    "DshError",
    "DshWarning",
    "Event",
    "InvariantViolation",
    "LedgerError",
    "Limits",
    "NoRunContext",
    "NoToolCall",
    "NotInRun",
    "OutputSchemaError",
    "OutsideRun",
    "PluginError",
    "PluginEventError",
    "PluginWarning",
    "ProviderError",
    "RunContext",
    "RunResult",
    "SessionInUse",
    "Stash",
    "StashKey",
    "StateError",
    "StateKey",
    "ToolError",
    "ToolInvocation",
    "ToolOutcome",
    "UsageError",
    "__version__",
    "context",
    "current_call",
    "escape_controls",
    "hookimpl",
    "pass_app",
    "request_approval",
    "sandbox",
    "settings",
    "tool",
]

_LAZY = {
    "AgentHandle": "dsh.host.scope",
    "App": "dsh.run.app",
    "Ask": "dsh.tools.approval",
    "BudgetExceeded": "dsh.core.errors",
    "CancelToken": "dsh.host.runcontext",
    "Cancelled": "dsh.core.errors",
    "Change": "dsh.core.messages",
    "ConfigError": "dsh.core.errors",
    "Decision": "dsh.tools.approval",
    "DshError": "dsh.core.errors",
    "DshWarning": "dsh.core.errors",
    "Event": "dsh.ledger.events",
    "InvariantViolation": "dsh.core.errors",
    "LedgerError": "dsh.core.errors",
    "Limits": "dsh.host.runcontext",
    "NoRunContext": "dsh.core.errors",
    "NoToolCall": "dsh.core.errors",
    "NotInRun": "dsh.host.scope",
    "OutputSchemaError": "dsh.core.errors",
    "OutsideRun": "dsh.ledger.plugin_events",
    "PluginError": "dsh.core.errors",
    "PluginEventError": "dsh.ledger.plugin_events",
    "PluginWarning": "dsh.core.errors",
    "ProviderError": "dsh.core.errors",
    "RunContext": "dsh.host.runcontext",
    "RunResult": "dsh.run.app",
    "SessionInUse": "dsh.core.errors",
    "Stash": "dsh.host.stash",
    "StashKey": "dsh.host.stash",
    "StateError": "dsh.ledger.state",
    "StateKey": "dsh.ledger.state",
    "ToolError": "dsh.core.errors",
    "ToolInvocation": "dsh.tools.registry",
    "ToolOutcome": "dsh.tools.registry",
    "UsageError": "dsh.core.errors",
    "context": "dsh.host.runcontext",
    "current_call": "dsh.tools.registry",
    "escape_controls": "dsh.core.escape",
    "hookimpl": "dsh.hookspecs",
    "pass_app": "dsh.cli.shared",
    "request_approval": "dsh.tools.approval",
    "settings": "dsh.config.declared",
    "tool": "dsh.tools.registry",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None and name == "sandbox":  # a public module, imported on first use
        import importlib

        return importlib.import_module("dsh.sandbox")
    if module is None:
        raise AttributeError(f"module 'dsh' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
