"""``dsh mcp serve``: dsh agents as the tools of an MCP server, for other agents (Claude Code,
Codex, any MCP client) to delegate whole sessions to.

This module is the dsh side, free of the protocol: :class:`Service` runs a turn in a new
session (``run``), continues one (``resume``), forks one (``fork``, :func:`dsh.ledger.fork.fork`)
and searches them (``search``, :func:`dsh.ledger.search.search`), each call a plain
function returning the tool's structured content or raising :class:`ToolFailure`. The tools'
schemas are :func:`tools`. The protocol is :mod:`dsh_mcp.serve_server` (the SDK's low-level
``Server``, over stdio) and :mod:`dsh_mcp.serve_http` (streamable HTTP on loopback).

Every session is an ordinary dsh session of the app's store (``dsh sessions show ID``): the
agent's budgets, sandbox and tools apply. Approvals are the server's permission mode's
(``--mode``, default ``ask``); what the mode leaves open is refused, since an MCP server has
no one to ask: the run's asker (``Session.send(asker=...)``) answers no, so the approval
service never opens the terminal, even when the server has one.

Imported only when ``dsh mcp serve`` runs. The user's guide is docs/editors.md, "From another
agent (MCP)".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: How many sessions ``search`` returns at most, and by default.
SEARCH_MAX = 100
SEARCH_DEFAULT = 20
#: Characters of a tool call's arguments shown in a progress message.
PROGRESS_WIDTH = 160

Progress = Callable[[str], None]


class ToolFailure(Exception):
    """A call that could not be done: its message is the tool result's text (``isError``);
    ``data``, when given, its structured content (a run that failed names its session)."""

    def __init__(self, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.data = data


#: The longest session id (or prefix) a call may give: ids are about 26 characters.
SESSION_MAX = 200
#: The most characters of a failure's message.
MESSAGE_MAX = 2000


def _string(description: str, longest: int | None = None) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "minLength": 1, "description": description}
    if longest is not None:
        schema["maxLength"] = longest
    return schema


def _result_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "session": {"type": "string", "description": "The session's id."},
            "output": {"type": "string", "description": "The agent's answer."},
            "outcome": {"type": "string", "enum": ["completed", "rejected", "stopped",
                                                   "aborted", "budget", "error"]},
            "reason": {"type": "string", "description": "Why a turn did not complete."},
            "cost": {"type": "number", "description": "What the turn's requests cost."},
        },
        "required": ["session", "output", "outcome"],
    }


def tools(agents: tuple[str, ...], mode: str) -> list[dict[str, Any]]:
    """The server's tools: ``{name, description, inputSchema, outputSchema, annotations}``,
    with input schemas as precise as the arguments are checked (required fields, types,
    the agents this server runs)."""
    strict = {"type": "object", "additionalProperties": False}
    agent = {"type": "string", "enum": list(agents),
             "description": f"The dsh agent to run (default: {agents[0]})."}
    writes = mode in ("auto-edit", "full-auto")
    return [
        {"name": "run",
         "description": (f"Run a prompt as one turn of a dsh agent in a new session; returns "
                         f"the answer and the session's id (continue it with resume). Tool "
                         f"calls are approved by the server's permission mode ({mode}); what "
                         f"it leaves open is refused."),
         "inputSchema": {**strict, "properties": {
             "prompt": _string("The task or question for the agent."), "agent": agent},
             "required": ["prompt"]},
         "outputSchema": _result_schema(),
         "annotations": {"title": "Run a dsh agent", "readOnlyHint": False,
                         "destructiveHint": writes, "openWorldHint": True}},
        {"name": "resume",
         "description": ("Continue a dsh session with a new prompt (its whole history is "
                         "sent), on the agent and model it recorded."),
         "inputSchema": {**strict, "properties": {
             "session": _string("A session id, a unique prefix of one, or 'latest'.",
                               SESSION_MAX),
             "prompt": _string("The next message.")},
             "required": ["session", "prompt"]},
         "outputSchema": _result_schema(),
         "annotations": {"title": "Continue a dsh session", "readOnlyHint": False,
                         "destructiveHint": writes, "openWorldHint": True}},
        {"name": "fork",
         "description": ("Make a new session whose history is the session's up to the end of "
                         "turn 'at' (default: its last); returns the new id, for resume."),
         "inputSchema": {**strict, "properties": {
             "session": _string("A session id, a unique prefix of one, or 'latest'.",
                               SESSION_MAX),
             "at": {"type": "integer", "minimum": 0,
                    "description": "Keep the history up to the end of this turn (0: none)."}},
             "required": ["session"]},
         "outputSchema": {"type": "object", "properties": {
             "session": {"type": "string", "description": "The new session's id."},
             "parent": {"type": "string", "description": "The session forked."},
             "at": {"type": "integer", "description": "The turn it was forked at."}},
             "required": ["session", "parent"]},
         "annotations": {"title": "Fork a dsh session", "readOnlyHint": False,
                         "destructiveHint": False, "idempotentHint": False,
                         "openWorldHint": False}},
        {"name": "search",
         "description": ("Search the dsh sessions' messages, tool calls and results for every "
                         "word of the text; returns the matching sessions of the agents this "
                         "server runs, newest first, each with its first hit."),
         "inputSchema": {**strict, "properties": {
             "text": _string("Words to look for (case and order ignored)."),
             "limit": {"type": "integer", "minimum": 1, "maximum": SEARCH_MAX,
                       "description": f"At most this many sessions (default "
                                      f"{SEARCH_DEFAULT})."}},
             "required": ["text"]},
         "outputSchema": {"type": "object", "properties": {"sessions": {"type": "array",
                                                                         "items": {
             "type": "object", "properties": {
                 "session": {"type": "string"}, "agent": {"type": "string"},
                 "model": {"type": "string"}, "started": {"type": "string"},
                 "turn": {"type": "integer"}, "kind": {"type": "string"},
                 "snippet": {"type": "string"}},
             "required": ["session", "turn", "kind", "snippet"]}}},
             "required": ["sessions"]},
         "annotations": {"title": "Search dsh sessions", "readOnlyHint": True,
                         "openWorldHint": False}},
    ]


class Service:
    """The tools' work, on ``app``: agents limited to ``agents`` (the first is the default),
    tool calls approved by ``mode`` alone."""

    def __init__(self, app: Any, agents: tuple[str, ...], mode: str) -> None:
        self.app = app
        self.agents = agents
        self.mode = mode
        self.schemas = {t["name"]: t for t in tools(agents, mode)}
        self._validators: dict[str, Any] = {}

    # -- the calls -------------------------------------------------------------------------

    def check(self, name: str, arguments: Any) -> None:
        """Raise :class:`ToolFailure` naming what is wrong with ``arguments`` (an unknown
        agent names the ones this server runs)."""
        if not isinstance(arguments, dict):
            raise ToolFailure(f"{name}: the arguments must be an object")
        agent = arguments.get("agent")
        if name == "run" and agent is not None and agent not in self.agents:
            raise ToolFailure(f"run: unknown agent {_quote(agent)}: this server runs "
                              f"{', '.join(self.agents)}")
        validator = self._validators.get(name)
        if validator is None:
            from jsonschema import Draft202012Validator

            validator = self._validators[name] = Draft202012Validator(
                self.schemas[name]["inputSchema"])
        problems = sorted(validator.iter_errors(arguments), key=lambda e: list(e.path))
        if problems:
            where = "/".join(str(p) for p in problems[0].path)
            raise ToolFailure(f"{name}: invalid arguments: "
                              + (f"{where}: " if where else "") + _cut(problems[0].message))

    def call(self, name: str, arguments: dict[str, Any], progress: Progress,
             cancel: Any = None) -> dict[str, Any]:
        """Do tool ``name`` (arguments already :meth:`check`-ed); raise :class:`ToolFailure`."""
        from dsh.core.errors import DshError
        from dsh.core.redact import redact

        try:
            if name == "run":
                return self.run(arguments["prompt"], arguments.get("agent"), progress, cancel)
            if name == "resume":
                return self.resume(arguments["session"], arguments["prompt"], progress, cancel)
            if name == "fork":
                return self.fork(arguments["session"], arguments.get("at"))
            return self.search(arguments["text"], arguments.get("limit", SEARCH_DEFAULT))
        except DshError as exc:
            raise ToolFailure(_cut(f"{name}: {redact(str(exc))}", MESSAGE_MAX)) from None

    def run(self, prompt: str, agent: str | None, progress: Progress,
            cancel: Any = None) -> dict[str, Any]:
        assembled = self.app.agent(agent or self.agents[0], mode=self.mode)
        return self._send(self.app.open_session(assembled), prompt, progress, cancel)

    def resume(self, session: str, prompt: str, progress: Progress,
               cancel: Any = None) -> dict[str, Any]:
        sid = self._session(session)
        info = self.app.store.info(sid)
        name = self._served(info, "resume")
        assembled = self.app.agent(name, mode=self.mode)
        recorded = info.model
        if recorded and recorded not in (assembled.model_id, _effective(assembled)):
            assembled = self.app.agent(name, mode=self.mode, model=recorded)
        return self._send(self.app.open_session(assembled, sid), prompt, progress, cancel)

    def fork(self, session: str, at: int | None) -> dict[str, Any]:
        from dsh.ledger.fork import fork

        sid = self._session(session)
        self._served(self.app.store.info(sid), "fork")
        data: dict[str, Any] = {"session": fork(self.app.store, sid, at=at), "parent": sid}
        if at is not None:
            data["at"] = at
        return data

    def search(self, text: str, limit: int) -> dict[str, Any]:
        from dsh.cli.session_list import snippet
        from dsh.ledger.search import search
        from dsh.ledger.search import words

        terms = words(text)
        if not terms:
            raise ToolFailure("search: the text has no words (letters or digits) to look for")
        hits = search(self.app.store, text, accept=self._serves, limit=limit,
                      per_session=True)
        return {"sessions": [
            {"session": h.session.id, "agent": h.session.agent or "",
             "model": h.session.model or "", "started": h.session.started or "",
             "turn": h.turn, "kind": h.kind,
             "snippet": snippet(h.text, terms, 160, escape=False)} for h in hits]}

    # -- helpers ---------------------------------------------------------------------------

    def _serves(self, info: Any) -> bool:
        return (info.agent or self.app.config.agent) in self.agents

    def _served(self, info: Any, tool: str) -> str:
        """The agent of the session ``info`` names, if this server runs it."""
        name = str(info.agent or self.app.config.agent)
        if name not in self.agents:
            raise ToolFailure(f"{tool}: session {info.id} belongs to agent {_quote(name)}, "
                              f"which this server does not run (it runs "
                              f"{', '.join(self.agents)})")
        return name

    def _session(self, text: str) -> str:
        """The session ``text`` names: an id, a unique prefix, or ``latest`` (the newest
        session of an agent this server runs that is not a sub-agent's)."""
        from dsh.ledger.reader import newest_sessions
        from dsh.ledger.reader import resolve

        if not text.isprintable() or any("\ud800" <= c <= "\udfff" for c in text):
            from dsh.core.errors import UsageError  # never a file name: no lookup at all

            raise UsageError(f"no session {ascii(text[:80])}")
        if text == "latest":
            for info in newest_sessions(self.app.store, roots=True):
                if self._serves(info):
                    return str(info.id)
            from dsh.core.errors import UsageError

            raise UsageError(f"no sessions yet of {', '.join(self.agents)}")
        return resolve(self._served_store(), text)

    def _served_store(self) -> Any:
        """The store as :func:`~dsh.ledger.reader.resolve` sees it: a full id is looked up as
        is (the refusal names its agent), a prefix matches the served agents' sessions only
        (another agent's never resolves, nor is it named in an ambiguity)."""
        from types import SimpleNamespace

        from dsh.core.errors import DshError

        store = self.app.store

        def served(sid: str) -> bool:
            try:
                return self._serves(store.info(sid))
            except DshError:
                return False

        def matching(prefix: str) -> list[str]:
            found = (store.matching(prefix) if callable(getattr(store, "matching", None))
                     else [i for i in store.ids() if i.startswith(prefix)])
            return [i for i in found if served(i)]

        return SimpleNamespace(exists=getattr(store, "exists", None), matching=matching)

    def _send(self, session: Any, prompt: str, progress: Progress,
              cancel: Any) -> dict[str, Any]:
        from dsh.core.redact import redact

        with session:
            progress(f"session {session.id} (agent {session.agent.name})")
            result = session.send(prompt, on_event=_progress_events(progress),
                                  asker=self.no_one, cancel=cancel)
        data: dict[str, Any] = {"session": result.session_id, "output": result.output,
                                "outcome": result.outcome}
        if result.cost is not None:
            data["cost"] = float(result.cost)
        if result.outcome != "completed":
            data["reason"] = redact(result.reason or "")
            raise ToolFailure(f"the turn ended with outcome {result.outcome}: "
                              f"{data['reason'] or 'no reason given'} (session "
                              f"{result.session_id})", data)
        return data

    def no_one(self, ask: Any) -> Any:
        """The run's asker: no one can be asked over MCP, so what the mode leaves open is
        refused, with the mode that would allow it."""
        from dsh.tools.approval import MODES
        from dsh.tools.approval import RULES
        from dsh.tools.approval import Decision

        allowing = next((m for m in MODES if RULES[m].get(ask.action) is True), None)
        hint = (f"the person may serve with --mode {allowing}" if allowing
                else "no permission mode allows it without asking")
        return Decision(False, "no-one", f"needs approval, and an MCP server has no one to ask "
                                         f"(mode {self.mode}): {hint}")


def _progress_events(progress: Progress) -> Callable[[Any], None]:
    """``Session.send``'s ``on_event``: a progress message per step, tool call, tool result
    and refused approval (``→ write_file notes.txt``, ``← write_file ok 3 ms``)."""
    from dsh.cli.progress import arguments_text
    from dsh.cli.progress import result_text
    from dsh.cli.progress import shown

    def on_event(event: Any) -> None:
        kind = getattr(event, "type", "")
        if kind == "step/start":
            progress(f"step {getattr(event, 'step', 0) + 1}")
        elif kind == "tool/call":
            progress(f"→ {shown(event.name, 60)} "
                     + shown(arguments_text(event.name, event.arguments), PROGRESS_WIDTH))
        elif kind == "tool/result":
            progress(f"← {shown(event.name, 60)} " + shown(result_text(
                event.name, event.status, event.output, event.duration_ms), PROGRESS_WIDTH))
        elif (kind == "x" and getattr(event, "plugin", "") == "dsh.tools"
              and getattr(event, "name", "") == "approval"):
            data = getattr(event, "data", {}) or {}
            if not data.get("allowed"):
                progress(shown(f"{data.get('tool')} refused: {data.get('why')}",
                               PROGRESS_WIDTH))

    return on_event


def _effective(agent: Any) -> str | None:
    from dsh.core.errors import DshError

    try:
        return str(agent.effective_model)
    except DshError:
        return None


def _quote(value: Any) -> str:
    from dsh.cli.escape import escape_controls

    return escape_controls(_cut(repr(value)), newlines=False)


def _cut(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


#: The port ``dsh mcp serve --http`` listens on without ``--port``.
DEFAULT_PORT = 8765
#: Where the server's questions would be asked: a path no file can have (an entry under
#: ``/dev/null``), so that opening it fails as it does without a terminal.
NO_TERMINAL = "/dev/null/dsh-mcp-serve-has-no-terminal"


def no_terminal() -> None:
    """Point the terminal of every question this process could ask — the approval service's,
    plan mode's ``propose_plan``, workspace trust's — at :data:`NO_TERMINAL`: a server started
    from a terminal (an editor's integrated one) has it as its controlling terminal, and no
    one there is reading. The run's asker already answers approvals; this covers the
    questions asked without it. Plan approval then says no one can approve the plan, and a
    project file that is not trusted stays inert (one line on stderr)."""
    from dsh.config import trust
    from dsh.tools import approval

    approval.TTY = NO_TERMINAL
    trust.TTY = NO_TERMINAL


def start(app: Any, *, agents: tuple[str, ...], mode: str, root: str | None, http: bool,
          host: str | None, port: int | None) -> None:
    """``dsh mcp serve``: check the options (a :class:`~dsh.core.errors.UsageError` names what
    is wrong, before anything is served), then serve until the client leaves (stdio) or the
    process is stopped (HTTP)."""
    import os

    import anyio

    from dsh.core.errors import UsageError
    from dsh.tools.approval import MODES

    if not http and (host is not None or port is not None):
        raise UsageError("--host and --port go with --http (without it the server speaks "
                         "over stdin and stdout)")
    if mode not in MODES:
        raise UsageError(f"--mode {mode!r}: not a permission mode (modes: {', '.join(MODES)})")
    if http:
        from dsh_mcp.serve_http import bind_address

        bind_address(host or "127.0.0.1")  # a remote --host is refused before any work
    no_terminal()
    if root is not None:
        os.chdir(root)  # the workspace of agents whose config names none
    config = app.config
    chosen = tuple(dict.fromkeys(agents)) or (config.agent,)
    known = config.agent_names()
    for name in chosen:
        if name not in known:
            raise UsageError(f"--agent {name!r}: no such agent (configured: "
                             f"{', '.join(known)})")
        app.agent(name, mode=mode)  # assembled now: a broken agent fails here, not per call
    service = Service(app, chosen, mode)
    try:
        if http:
            from dsh_mcp.serve_http import serve_http

            anyio.run(serve_http, service, host or "127.0.0.1",
                      DEFAULT_PORT if port is None else port)
        else:
            import sys

            from dsh_mcp.serve_server import serve_stdio

            sys.stderr.write(f"dsh: MCP server on stdio (agents: {', '.join(chosen)}; mode "
                             f"{mode}; workspace {os.getcwd()})\n")
            anyio.run(serve_stdio, service)
    except KeyboardInterrupt:
        raise SystemExit(130) from None
