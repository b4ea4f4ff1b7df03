"""Errors dsh raises on purpose, each with the process exit code the CLI maps it to.

Private module: plugins import these names from :mod:`dsh` (docs/api.md).

Exit codes (documented in docs/cli.md): 0 completed; 1 runtime or provider error; 2 usage or
configuration error; 3 step or budget limit reached; 4 rejected by a plugin; 130 interrupted;
129 / 143 ended by SIGHUP / SIGTERM.
"""

from __future__ import annotations

from collections.abc import Iterable

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_LIMIT = 3
EXIT_REJECTED = 4
EXIT_INTERRUPTED = 130
#: Ended by a signal during a run (128 + the signal's number, as a shell reports it): the
#: running tool's process group is killed and the turn closed as ``aborted`` first.
EXIT_SIGHUP = 129
EXIT_SIGTERM = 143


class DshError(Exception):
    """Base of every error dsh raises deliberately; ``str(err)`` is the user-facing message."""

    exit_code: int = EXIT_ERROR


class ConfigError(DshError):
    """The configuration is wrong: the message names the file, the key or line, and what was
    expected."""

    exit_code = EXIT_USAGE


class UsageError(DshError):
    """The caller asked for something that cannot be done (unknown agent, model, session)."""

    exit_code = EXIT_USAGE


class PluginError(DshError):
    """A plugin failed to import, register or run; names the plugin (and hook, if any)."""

    def __init__(self, message: str, *, plugin: str = "", hook: str = "") -> None:
        super().__init__(message)
        self.plugin = plugin
        self.hook = hook


class SessionInUse(DshError):
    """Another process holds the session's lock."""


class LedgerError(DshError):
    """The session ledger cannot be read or written."""


class InvariantViolation(DshError):
    """A model request differs from what the ledger records (MISSION C3). Always a bug: some
    layer changed what the model would see without writing it to the log. ``plugin`` names
    the plugin that did, when the transport could tell (then the message names it too)."""

    def __init__(self, message: str, *, plugin: str = "") -> None:
        super().__init__(message)
        self.plugin = plugin


class ProviderError(DshError):
    """A model provider failed in a way the user can act on (HTTP status, network, stream)."""

    #: Part of the answer had already streamed to the user: no layer may send it again.
    streamed: bool = False

    def __init__(self, message: str, *, status: int | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable


class NoRunContext(DshError):
    """``dsh.context()`` was called outside a run (or in a thread started without copying the
    run's context)."""


class NoToolCall(DshError, LookupError):
    """:func:`dsh.current_call` was called outside a tool call (or in a thread the tool
    started without copying its context). A :class:`LookupError` too, as it was before it
    had a name of its own."""


class BudgetExceeded(DshError):
    """A counted unit (a model request, a step, a tool call) could not reserve its place in the
    run's budget chain, so it did not start (MISSION D8). ``str(err)`` names the limit; the
    loop ends the turn with outcome ``budget`` and that reason."""

    exit_code = EXIT_LIMIT


class Cancelled(DshError):
    """The run was aborted."""

    exit_code = EXIT_INTERRUPTED


class OutputSchemaError(DshError):
    """The model's answer did not match the run's output schema, also after it was told why
    (``dsh run --schema``)."""


class ToolError(DshError):
    """Raised by a tool to return a clean error message to the model (no traceback)."""


class DshWarning(UserWarning):
    """Base of the warnings dsh issues (``warnings.warn``); the CLI shows each as one
    ``dsh: warning:`` line on stderr."""


class InputDroppedWarning(DshWarning):
    """A session closed with input no turn took (injected context, a steered message): it is
    not recorded, and this says so instead of losing it silently (B3, issue 23)."""


class PluginWarning(DshWarning):
    """A plugin will not do what its author meant, though it loaded: e.g. a hook
    implementation whose name matches no hook (a typo), which would never be called."""


def did_you_mean(name: str, known: Iterable[str], label: str = "known") -> str:
    """``"; did you mean 'x'?"`` when a known name is close to ``name``, else
    ``" (known: a, b, c)"`` (``label`` names the list)."""
    known = list(known)
    import difflib  # only on an error: it costs a millisecond at start-up

    near = difflib.get_close_matches(name, known, n=1)
    if near:
        return f"; did you mean {near[0]!r}?"
    return f" ({label}: {', '.join(known) or 'none'})"


def unknown_name(kind: str, name: str, known: Iterable[str], label: str = "known") -> str:
    """``"unknown tool 'x'; did you mean 'y'?"``: the message for a name nothing defines."""
    return f"unknown {kind} {name!r}{did_you_mean(name, known, label)}"
