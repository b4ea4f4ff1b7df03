"""The ``/`` commands of ``dsh chat`` (docs/cli.md): :class:`ChatCommand` (a name, a function
``fn(chat, argument)`` that may return text to print, its help and plugin, whether it may be
typed while a turn runs) and the built-in ones (:data:`BUILTIN_COMMANDS`: ``/help``,
``/tools``, ``/model``, ``/mode``, ``/system``, ``/session``, ``/cost``, ``/clear``,
``/compact``, ``/fork``, ``/rewind``, ``/attach``, ``/inject``, ``/stop``, ``/exit``).
Plugins add theirs with the ``register_chat_commands`` hook; the chat collects them
(:meth:`dsh.cli.repl.Chat._commands`). Also here: the input syntax ``/help`` describes
(:data:`FOLLOW_UP`, :data:`BLOCK`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from dsh.core import errors

if TYPE_CHECKING:
    from dsh.cli.repl import Chat

#: Typed during a turn, a line starting with this is a follow-up, taken after the turn.
FOLLOW_UP = ">"
BLOCK = '"""'


@attrs.frozen
class ChatCommand:
    """A ``/NAME`` command: ``fn(chat, argument)`` may return text to print."""

    name: str
    fn: Callable[[Chat, str], str | None]
    help: str = ""
    plugin: str = "dsh.chat"
    #: May be typed while a turn runs (it then must not wait for the turn).
    during_turn: bool = False


def _help(chat: Chat, arg: str) -> str:
    rows = [f"  /{c.name:<10} {c.help}" + (f"  ({c.plugin})" if c.plugin != "dsh.chat" else "")
            for c in chat.commands.values()]
    from dsh.run.commands import known_commands

    agent = chat.session.agent
    rows += [f"  /{name:<10} {desc}  (sent as its expansion)"
             for name, desc in known_commands(agent.pm, agent.handle).items()
             if name not in chat.commands]
    return "\n".join([
        "Type a message and press Enter. While the agent works, a line you type steers it "
        "(taken after the current step);",
        f"start it with {FOLLOW_UP} to keep it for after the turn. End a line with \\ to go "
        f"on, or open a block with {BLOCK}.",
        "Ctrl-C stops the turn after the current step (twice: at once); Ctrl-D exits.", "",
        *rows])


def _tools(chat: Chat, arg: str) -> str:
    tools = chat.session.agent.tools
    if not tools:
        return "no tools"
    return "\n".join(f"  {t.name}: {t.description.splitlines()[0] if t.description else ''}"
                     for t in tools.values())


def _model(chat: Chat, arg: str) -> str:
    if not arg:
        return f"model: {chat.session.agent.model_id}"
    chat.set_agent(model=arg)
    return f"model: {arg} (from the next message on)"


def _mode(chat: Chat, arg: str) -> str:
    """``/mode [NAME]``: the permission mode of the next turns (as ``--mode``)."""
    from dsh.host.runcontext import MODES

    if not arg:
        return f"mode: {chat.session.agent.mode} (modes: {', '.join(MODES)})"
    if arg not in MODES:
        raise errors.UsageError(errors.unknown_name("mode", arg, MODES, "known"))
    chat.set_agent(mode=arg)
    return f"mode: {arg} (from the next message on)"


def _clear(chat: Chat, arg: str) -> str:
    """``/clear``: go on in a new, empty session with the same agent; the old one stays in
    the ledger as it was."""
    old = chat.session
    chat.session = chat.app.open_session(old.agent)
    old.close()
    chat.follow_ups.clear()
    return (f"new session {chat.session.id}; the previous one is kept as it was: "
            f"{old.id} (continue it with: dsh chat --session {old.id})")


def _compact(chat: Chat, arg: str) -> str:
    """``/compact [STRATEGY]``: compact the session's context now (``context/compacted``),
    as ``dsh sessions compact`` does."""
    from dsh.run.compaction import compact_now

    session = chat.session
    event = compact_now(session.agent, session.ledger, None, reason="manual",
                        strategy=arg or None)
    if event is None:
        return "nothing to compact"
    return (f"compacted messages {event.start}-{event.end} ({event.strategy}): "
            f"~{event.tokens_before} -> ~{event.tokens_after} tokens")


def _system(chat: Chat, arg: str) -> str:
    if not arg:
        return chat.session.agent.system or "(no system prompt)"
    chat.set_agent(system=arg)
    return "system prompt replaced (from the next message on)"


def _session(chat: Chat, arg: str) -> str:
    path = chat.session.ledger.path
    return f"session {chat.session.id}" + (f"\n{path}" if path else "")


def _cost(chat: Chat, arg: str) -> str:
    """``/cost``: tokens and cost of the session so far, sub-agents included."""
    from dsh.run.costs import app_prices
    from dsh.run.costs import session_cost
    from dsh.run.costs import tally_text

    store = chat.app.store
    session = chat.session
    try:
        events = list(store.read(session.id)) if session.ledger.path else []
    except errors.DshError:
        events = []
    found = session_cost(events, app_prices(chat.app), store.read)
    t = found.total
    n = len(found.children)
    subs = f", {n} sub-agent session{'s' if n != 1 else ''} included" if n else ""
    return (f"session {session.id}: {tally_text(t)}, {t.responses} "
            f"response{'s' if t.responses != 1 else ''}{subs}")


def _stop(chat: Chat, arg: str) -> str | None:
    output = chat.output
    ctx = getattr(output, "ctx", None)
    if ctx is None:
        return "no turn is running"
    ctx.stop()
    chat.note("dsh: stopping after the current step")
    return None


def _exit(chat: Chat, arg: str) -> None:
    chat.done = True


def _inject(chat: Chat, arg: str) -> str:
    if not arg.strip():
        raise errors.UsageError("usage: /inject TEXT")
    chat.session.inject(arg, source="chat")
    return "context queued: the model sees it with your next message"


def _attach(chat: Chat, arg: str) -> str:
    """``/attach FILE|URL``: read, check and store it now; it goes with the next message."""
    if not arg or arg == "-":
        return "usage: /attach FILE|URL (an image or a PDF; stdin is the chat's own)"
    from dsh.llm.attachments import describe

    (ref,) = chat.session.attach(arg)
    return f"attached {describe(ref)}: it goes with your next message"


def _switch(chat: Chat, new_id: str) -> None:
    """Continue the chat in session ``new_id`` (a fork just made): the same agent and
    overrides; the old session is closed (its lock released), never written again."""
    old = chat.session
    chat.session = chat.app.open_session(old.agent, new_id)
    old.close()


def _turn_arg(arg: str, usage: str) -> int | None:
    text = arg.strip()
    if not text:
        return None
    if not text.isdigit():
        raise errors.UsageError(usage)
    return int(text)


def _fork(chat: Chat, arg: str) -> str:
    """``/fork [TURN]``: go on in a new fork of this session (at its last turn, or TURN)."""
    from dsh.ledger.fork import fork

    at = _turn_arg(arg, "usage: /fork [TURN]")
    old = chat.session.id
    new = fork(chat.app.store, old, at=at)
    _switch(chat, new)
    where = f" at turn {at}" if at is not None else ""
    return f"forked {old}{where}: now in session {new} ({old} is kept as it was)"


def _rewind(chat: Chat, arg: str) -> str:
    """``/rewind N [--files]``: go on from the end of turn N, in a fork; with ``--files``,
    the files changed after turn N are put back from their recorded diffs."""
    from dsh.run.rewind import rewind

    usage = "usage: /rewind N [--files] (continue from the end of turn N)"
    words = arg.split()
    files = "--files" in words
    rest = " ".join(w for w in words if w != "--files")
    to = _turn_arg(rest, usage)
    if to is None:
        raise errors.UsageError(usage)
    old = chat.session.id
    done = rewind(chat.app.store, old, to=to, files=files)
    _switch(chat, done.session)
    from dsh.cli.escape import escape_controls

    lines = [f"{what}: {escape_controls(path)}" for path, what in done.files]
    if files and not lines:
        lines.append(f"no recorded file changes after turn {to}")
    return "\n".join([*lines, f"rewound to turn {to}: now in session {done.session} "
                              f"({old} is kept as it was)"])


BUILTIN_COMMANDS: tuple[ChatCommand, ...] = (
    ChatCommand("help", _help, "this help"),
    ChatCommand("tools", _tools, "the agent's tools"),
    ChatCommand("model", _model, "show or switch the model: /model NAME"),
    ChatCommand("mode", _mode, "show or switch the permission mode: /mode NAME"),
    ChatCommand("system", _system, "show or replace the system prompt: /system TEXT"),
    ChatCommand("session", _session, "the session's id and ledger path"),
    ChatCommand("cost", _cost, "tokens and cost of this session so far"),
    ChatCommand("clear", _clear, "go on in a new, empty session (this one is kept)"),
    ChatCommand("compact", _compact,
                "compact the context now: /compact [auto|mask|summarize|truncate]"),
    ChatCommand("fork", _fork, "go on in a fork of this session: /fork [TURN]"),
    ChatCommand("rewind", _rewind,
                "go on from the end of turn N, in a fork: /rewind N [--files]"),
    ChatCommand("attach", _attach, "an image or PDF for the next message: /attach FILE|URL"),
    ChatCommand("inject", _inject, "context for the next message: /inject TEXT",
                during_turn=True),
    ChatCommand("stop", _stop, "stop the running turn after its current step", during_turn=True),
    ChatCommand("exit", _exit, "leave (the session stays; continue it with dsh chat -c)"),
    ChatCommand("quit", _exit, "the same as /exit"),
)
