"""The one approval service: whether a tool call that changes the world may run, and who said so
(docs/security.md, "Permission modes and approvals").

Every tool that reads, writes or runs asks :func:`request` with an :class:`Ask` before it acts.
The answer comes, in this order, from:

1. **the mode** the person chose (``--mode``, ``[agents.NAME] mode``; :data:`MODES`): it runs
   what the mode allows at once and refuses what the mode forbids;
2. ``--yes`` (``RunContext.approve_all``): the person approved every call of this run;
3. **a grant**: an earlier "always for this project" answer (kept in dsh's own config
   directory, per project root, never in the workspace; ``dsh permissions``) or "for this
   session";
4. **the person**, asked on the terminal (``/dev/tty``): yes once, always for this project,
   for this session, no, or no with a reason the model reads;
5. **no one to ask means no**: without a terminal the call is refused with a tool error naming
   the option that allows it; the run goes on.

Outside any run (a test or a script calling a tool's function itself) there is no model to
guard against: the call is the program's own, and runs.

Each decision is recorded in the session (``x/dsh.tools/approval``: the call, what it
asked, allowed or refused, and ``by``: ``mode``, ``yes``, ``grant``, ``session``, ``person``,
``no-terminal``), so ``dsh sessions show`` can say why each call ran.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

import attrs

from dsh.core.errors import ToolError
from dsh.host.runcontext import DEFAULT_MODE
from dsh.host.runcontext import MODES
from dsh.host.runcontext import check_mode
from dsh.host.runcontext import narrower
from dsh.tools.grants import add_grant
from dsh.tools.grants import load_grants
from dsh.tools.grants import matches

__all__ = ["DEFAULT_MODE", "MODES", "RULES", "Ask", "Decision", "always_scope", "asked",
           "asker_for", "check_mode", "narrower", "preapprove", "prompt", "question",
           "refusal", "request", "request_approval"]
#: What each mode lets run without a question (``True``), refuses (``False``) or asks (None),
#: per kind of action: ``read`` (files, read-only commands), ``write`` (files in the
#: workspace), ``command`` (any other program, inside the sandbox), ``outside`` (anything
#: leaving the sandbox: network, policy ``off``, protected paths).
RULES: dict[str, dict[str, bool | None]] = {
    "read-only": {"read": True, "write": False, "command": False, "outside": False},
    # plan: read-only until the person approves the model's plan (propose_plan), then the
    # mode they pick (dsh.tools.plan).
    "plan": {"read": True, "write": False, "command": False, "outside": False},
    "ask": {"read": True, "write": None, "command": None, "outside": None},
    "auto-edit": {"read": True, "write": True, "command": None, "outside": None},
    "full-auto": {"read": True, "write": True, "command": True, "outside": None},
}
#: Decisions are recorded as ``x/dsh.tools/approval``: the tool registry's built-in name.
PLUGIN = "dsh.tools"
EVENT = "approval"
_question_lock = threading.Lock()


@attrs.frozen
class Ask:
    """What a tool call is about to do, for the approval service."""

    #: The tool's name (``write_file``, ``run_command``).
    tool: str
    #: ``read``, ``write``, ``command`` or ``outside`` (see :data:`RULES`).
    action: str
    #: What it acts on: the command line, or the path written (relative to ``root``).
    subject: str
    #: The project root the call acts in (where grants are kept for).
    root: str
    #: More to show in the question: the diff of a write, the sandbox of a command.
    detail: str = ""
    #: For a command: its program (a grant may be for the program, any arguments).
    program: str | None = None
    #: Why it needs asking, in a few words (``not on the allowlist``), for the question
    #: and the refusal.
    reason: str = ""
    #: The terminal to ask on (default ``/dev/tty``; a plugin's setting, such as dsh-shell's
    #: ``tty``, may name another).
    terminal: str | None = None
    #: How the question words the act (``call``, ``fetch``); by default from ``action``.
    verb: str = ""
    #: What "always for this project" grants: ``command`` (this exact subject; the default
    #: for commands), ``program`` (``program``, any arguments), ``tool`` (any call of this
    #: tool) or ``path`` (writes under the subject's directory; the default for writes).
    always: str = ""


@attrs.frozen
class Decision:
    allowed: bool
    #: Who decided: ``mode``, ``yes``, ``grant``, ``session``, ``person``, ``no-terminal``
    #: (or ``caller``: outside any run).
    by: str
    #: Why, in words (the refusal's text for the model).
    why: str = ""


def _option_for(ask: Ask) -> str:
    for mode in MODES:
        if RULES[mode].get(ask.action) is True:
            return f"--mode {mode}"
    return "--yes"


# -- the service -------------------------------------------------------------------------------


def request(ask: Ask) -> Decision:
    """Whether the call may do what ``ask`` says; records the decision. Raises
    :class:`ToolError` (the model reads it) when it may not."""
    from dsh.host.runcontext import current_or_none

    ctx = current_or_none()
    if ctx is None:
        # Outside any run there is no model: the caller is the program itself (a test, a
        # script calling a tool's function), which is the person's own code.
        return Decision(True, "caller", "called outside a run")
    mode = getattr(ctx, "mode", DEFAULT_MODE)
    verdict = rule(mode, ask.action)
    if verdict is True:
        decision = Decision(True, "mode", f"mode {mode} allows it")
    elif verdict is False and mode == "plan":
        decision = Decision(False, "mode", "the permission mode is plan: read and plan, then "
                                           "call propose_plan with your plan for the person "
                                           "to approve; nothing changes before that")
    elif verdict is False:
        # No mode runs an act that leaves the sandbox unasked: name one that asks, not --yes
        # (which cannot override a mode's refusal).
        choice = _option_for(ask)
        choice = "--mode ask and approve it" if choice == "--yes" else choice
        decision = Decision(False, "mode", f"the permission mode is {mode}, which does not "
                                           f"allow this; the person may choose {choice}")
    elif ctx.approve_all:
        decision = Decision(True, "yes", "--yes approved every call of this run")
    elif (given := _given(ctx)) is not None:
        decision = given
    else:
        decision = granted(ask, ctx) or _ask_person(ask, ctx)
    note(ask, decision)
    if not decision.allowed:
        raise refusal(ask, decision)
    return decision


_GIVEN = "dsh.tools.approval:given"


def preapprove(call: Any, by: str, why: str) -> None:
    """Approve ``call`` (a :class:`~dsh.tools.registry.ToolInvocation`, in a ``pre_execute``
    hook) where the mode would ask; its decision is recorded with ``by`` (``hook``, or the
    plugin's name) and ``why``. It cannot widen the mode: what the mode refuses stays
    refused. dsh-hooks uses it for a user's own PreToolUse ``allow`` (a project's hooks
    cannot approve)."""
    from dsh.host.runcontext import current_or_none

    ctx = current_or_none()
    if ctx is not None:  # kept by the invocation itself: a model's call ids may repeat
        ctx.data.setdefault(_GIVEN, {})[id(call)] = (call, Decision(True, by, why))


def _given(ctx: Any) -> Decision | None:
    try:
        from dsh.tools.registry import current_call

        call = current_call()
    except LookupError:
        return None
    entry = ctx.data.get(_GIVEN, {}).pop(id(call), None)
    return entry[1] if entry is not None and entry[0] is call else None


#: The public name (``dsh.request_approval``).
request_approval = request


def refusal(ask: Ask, decision: Decision) -> ToolError:
    """The tool error the model reads for a refused call."""
    return ToolError(f"{ask.tool} was not run: {decision.why}; do not retry it")


_by_session: Any = None  # weakref.WeakKeyDictionary: session -> its grants "for this session"


def _session_grants(ctx: Any) -> list[dict[str, Any]]:
    global _by_session
    session = getattr(ctx, "session", None)
    if session is None:
        return []
    if _by_session is None:
        import weakref

        _by_session = weakref.WeakKeyDictionary()
    return _by_session.setdefault(session, [])


def rule(mode: str, action: str) -> bool | None:
    """What ``mode`` says of ``action``: run (True), refuse (False) or ask (None)."""
    return RULES.get(mode, RULES[DEFAULT_MODE]).get(action)


def granted(ask: Ask, ctx: Any) -> Decision | None:
    """The decision of a grant (for this session, or for this project) covering ``ask``."""
    for grant in _session_grants(ctx):
        if matches(grant, ask):
            return Decision(True, "session", f"granted for this session ({grant['scope']} "
                                             f"{grant['value']})")
    from dsh.core.errors import ConfigError

    try:
        held = load_grants()
    except ConfigError as exc:  # said once; no grant comes from a file dsh cannot vouch for
        _warn_once(str(exc))
        held = {}
    for grant in held.get(os.path.realpath(ask.root), []):
        if matches(grant, ask):
            return Decision(True, "grant", f"granted for this project ({grant['scope']} "
                                           f"{grant['value']}; dsh permissions)")
    return None


TTY = "/dev/tty"
_warned: set[str] = set()


def _warn_once(text: str) -> None:
    import sys

    from dsh.core.escape import escape_controls

    if text not in _warned:
        _warned.add(text)
        sys.stderr.write(f"dsh: warning: {escape_controls(text, newlines=False)}; no grant "
                         "from it is used\n")


def question(ask: Ask, ctx: Any = None) -> Decision:
    """Ask the person on the terminal (no mode, grant or ``--yes`` consulted, nothing
    recorded): what :func:`request` does when those leave the call open, and what a tool
    called outside any run may use to ask all the same (dsh-shell's commands do)."""
    return _ask_person(ask, ctx)


def _needs(ask: Ask) -> str:
    who = repr(ask.program) if ask.program else "it"
    return f"{who} needs approval: {ask.reason}" if ask.reason else f"{who} needs approval"


def asker_for(ctx: Any) -> Any:
    """The run's asker (``RunContext.asker``, else its nearest parent's), or None."""
    while ctx is not None:
        if getattr(ctx, "asker", None) is not None:
            return ctx.asker
        ctx = getattr(ctx, "parent", None)
    return None


def _ask_person(ask: Ask, ctx: Any) -> Decision:
    from dsh.core.escape import escape_controls

    asker = asker_for(ctx)
    if asker is not None:  # the run's own asker (an editor over ACP): never the terminal
        return asked(asker, ask)

    scope, value = _always_scope(ask)
    lines = [f"dsh: {ask.tool} wants to {_verb(ask)} "
             f"{escape_controls(_shown(ask), newlines=False)} in "
             f"{escape_controls(ask.root, newlines=False)}"
             + (f" ({escape_controls(ask.reason, newlines=False)})" if ask.reason else "")]
    for line in ask.detail.splitlines()[:40]:
        lines.append("  " + escape_controls(line, newlines=False))
    lines.append(f"[y] yes  [a] always for this project "
                 f"({scope} {escape_controls(_quoted(scope, value), newlines=False)})  "
                 "[s] for this session  [n] no  [r] no, and say why: ")
    try:
        choice, reason, ended = prompt(lines, ctx, terminal=ask.terminal)
    except OSError:
        return Decision(False, "no-terminal",
                        f"{_needs(ask)}; there is no terminal to ask on; the person "
                        f"may rerun with " + " or ".join(dict.fromkeys((_option_for(ask),
                                                                       "--yes"))))
    if ended:
        return Decision(False, "no-answer", f"no answer to the approval question before "
                                            f"{ended}")
    if choice == "y":
        return Decision(True, "person", "the person approved it")
    if choice == "a":
        add_grant(ask.root, ask.tool, scope, value)
        return Decision(True, "person", f"the person approved it always for this project "
                                        f"({scope} {value})")
    if choice == "s":
        _session_grants(ctx).append({"tool": ask.tool, "scope": scope, "value": value})
        return Decision(True, "person", f"the person approved it for this session "
                                        f"({scope} {value})")
    if choice == "r" and reason:
        return Decision(False, "person", f"the person refused it, saying: {reason[:500]}")
    return Decision(False, "person", "the person refused it; ask them or find another way")


def asked(asker: Any, ask: Ask) -> Decision:
    """``asker(ask)``'s decision; one that fails or answers no decision is a no."""
    try:
        decision = asker(ask)
    except Exception as exc:  # noqa: BLE001 - an asker that fails is a no, said why
        return Decision(False, "no-answer", f"{_needs(ask)}; asking failed: "
                                            f"{type(exc).__name__}: {exc}"[:500])
    if not isinstance(decision, Decision):
        return Decision(False, "no-answer", f"{_needs(ask)}; no answer came")
    return decision


def prompt(lines: list[str], ctx: Any = None, *, terminal: str | None = None
           ) -> tuple[str, str, str]:
    """Ask the person on the terminal (``/dev/tty``, or ``terminal``), one question at a
    time: show ``lines`` (already made safe to print: :func:`dsh.core.escape.escape_controls`),
    read a line and return ``(choice, reason, ended)``: the first letter typed, lowercased
    (``""`` for Ctrl-C, Esc or Ctrl-D: a no); after ``r``, the reason typed next; and
    ``ended``, why no answer came (the terminal closed, the run was aborted or reached its
    time limit), else ``""``. What was typed before the question appeared is dropped; the
    status line is paused meanwhile. Raises :class:`OSError` when there is no terminal."""
    import sys

    # O_NOCTTY: asking must never make the terminal dsh's controlling terminal.
    fd = os.open(terminal or TTY, os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC)
    status = sys.modules.get("dsh.cli.status")
    paused = status.status_paused() if status is not None else contextlib.nullcontext()
    with _question_lock, paused, os.fdopen(fd, "r+b", buffering=0) as tty, _cbreak(fd):
        _drain(fd)  # an answer typed before the question appeared is not an answer
        tty.write(("\n" + "\n".join(lines)).encode("utf-8", "replace"))
        answer, ended = _read_line(fd, ctx)
        choice = answer.strip().lower()[:1] if answer is not None else ""
        reason = ""
        if choice == "r":
            tty.write(b"why: ")
            reason = (_read_line(fd, ctx)[0] or "").strip()
        if ended:
            tty.write(f"(no answer: {ended})\n".encode())
    return choice, reason, ended


def _quoted(scope: str, value: str) -> str:
    return f"`{value}`" if scope == "command" else value


def _shown(ask: Ask) -> str:
    return f"`{ask.subject}`" if ask.action in ("command", "outside") else ask.subject


def _verb(ask: Ask) -> str:
    return ask.verb or {"write": "write", "read": "read", "command": "run"}.get(
        ask.action, "run (outside the sandbox)")


def _always_scope(ask: Ask) -> tuple[str, str]:
    scope = ask.always or ("path" if ask.action == "write" else "command")
    if scope == "path":
        return "path", os.path.dirname(os.path.normpath(ask.subject)) or "."
    if scope == "program" and ask.program:
        return "program", ask.program
    if scope == "tool":
        return "tool", ask.tool
    return "command", ask.subject


#: The scope an "always" answer grants for ``ask``: ``(scope, value)``, e.g. ``("path",
#: "src")`` or ``("command", "git status")`` (what the terminal's ``[a]`` offers).
always_scope = _always_scope


def _drain(fd: int) -> None:
    import select

    while select.select([fd], [], [], 0)[0]:
        try:
            if not os.read(fd, 1024):
                return
        except OSError:
            return


def _read_line(fd: int, ctx: Any) -> tuple[str | None, str]:
    """One line typed on the terminal ``fd``, echoed as typed; ``(None, "")`` on Ctrl-C (the
    run's first interrupt), Esc or Ctrl-D (a "no"); ``(None, why)`` when the terminal closes,
    the run is aborted or its time limit passes first. The terminal is in non-canonical mode
    meanwhile, so Esc answers at once."""
    import select

    line = b""
    while len(line) < 1024:
        if ctx is not None and (ctx.cancel.cancelled or ctx.stop_requested):
            reason = getattr(ctx.cancel, "reason", "")
            return None, f"the run was aborted ({reason})" if reason else "the run ended"
        left = _time_left(ctx)
        if left is not None and left <= 0:
            return None, "the run's time limit was reached"
        try:
            if not select.select([fd], [], [], 0.1)[0]:
                continue
            data = os.read(fd, 64)
        except KeyboardInterrupt:
            return None, ""
        except OSError:
            return None, "the terminal was closed"
        if not data:
            return None, "the terminal was closed"
        for byte in data:
            if byte in (0x1b, 0x03, 0x04):  # Esc, Ctrl-C (if not a signal), Ctrl-D
                return None, ""
            if byte in (0x0a, 0x0d):
                os.write(fd, b"\n")
                return line.decode("utf-8", "replace"), ""
            if byte in (0x7f, 0x08):
                if line:
                    line = line[:-1]
                    os.write(fd, b"\b \b")
                continue
            if byte >= 0x20:
                line += bytes([byte])
                os.write(fd, bytes([byte]))
    return line.decode("utf-8", "replace"), ""


def _time_left(ctx: Any) -> float | None:
    """Seconds until the first time limit of the run's budget chain, or None."""
    budget = getattr(ctx, "budget", None)
    left: float | None = None
    while budget is not None:
        seconds = getattr(getattr(budget, "limits", None), "seconds", None)
        if seconds is not None:
            rest = seconds - (budget.clock() - budget.started)
            left = rest if left is None else min(left, rest)
        budget = getattr(budget, "parent", None)
    return left


@contextlib.contextmanager
def _cbreak(fd: int) -> Iterator[None]:
    """The terminal in non-canonical mode (each key read as typed, Esc at once; Ctrl-C
    still the run's interrupt) while the question is asked; restored after."""
    try:
        import termios
        import tty

        saved: Any = termios.tcgetattr(fd)
        tty.setcbreak(fd, termios.TCSANOW)
    except (ImportError, OSError):
        saved = None
    try:
        yield
    finally:
        if saved is not None:
            try:
                termios.tcsetattr(fd, termios.TCSANOW, saved)
            except OSError:
                pass


def note(ask: Ask, decision: Decision) -> None:
    """The decision as ``x/dsh.tools/approval`` in the current session (none outside a
    run, as in a unit test of a tool)."""
    from dsh.host.runcontext import current_or_none

    ctx = current_or_none()
    if ctx is None:
        return
    call_id = None
    try:
        from dsh.tools.registry import current_call

        call_id = current_call().call.id
    except LookupError:
        pass
    data = {"call": call_id, "tool": ask.tool, "action": ask.action,
            "subject": ask.subject[:2000], "allowed": decision.allowed, "by": decision.by,
            "why": decision.why[:1000], "mode": getattr(ctx, "mode", DEFAULT_MODE)}
    from dsh.ledger import plugin_events

    # dsh's own record, written by the service whichever plugin's tool asked: through the
    # ledger, not a plugin's door (which writes only under that plugin's name).
    plugin_events.record(ctx.ledger, PLUGIN, EVENT, data)
